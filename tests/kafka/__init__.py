"""Multi-process tests on a real Kafka-protocol broker (Tansu): workers run as processes."""
