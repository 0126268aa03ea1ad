"""Multi-process tests on real Kafka brokers (Apache Kafka, Tansu): workers run as processes."""
