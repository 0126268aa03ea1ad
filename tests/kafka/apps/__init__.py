"""Apps that the Kafka process tests run with ``python -m flowkit.cli worker``."""
