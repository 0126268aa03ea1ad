"""The Kafka transport (``kafka://``): a thin mapping of the transport protocol onto aiokafka.

This package is the only part of flowkit that imports aiokafka, and ``import flowkit``
does not import it: ``transport_from_url`` imports this package for ``kafka://`` URLs only.
Its modules: ``settings`` (the settings table, defaults and checks), ``errors`` (aiokafka's
exceptions translated into ``flowkit.errors`` in one place, ``map_kafka_errors``),
``transport`` (``KafkaTransport``: connecting and topic administration), ``clients``
(``KafkaConsumer`` and ``KafkaProducer``), ``draining`` (group-less reads, such as table
recovery, built straight from the fetched record batches), ``loading`` (committed offsets
while the coordinator loads them) and ``generations`` (exactly-once: the consumer group's
generation in transactions, KIP-447). aiokafka's types never leak out of it.

>>> transport = KafkaTransport(["127.0.0.1:9092"], linger_ms=2)
>>> transport.url
'kafka://127.0.0.1:9092'

Defaults, chosen for a stream processor rather than aiokafka's request/response use:

- ``fetch_max_wait_ms=50`` (aiokafka: 500): the longest an empty fetch waits. Some brokers
  (Tansu) do not end a long-poll early when data arrives, so this bounds latency.
- ``max_partition_fetch_bytes=4 MiB`` (aiokafka: 1 MiB): more records per round trip.
- ``acks="all"`` (aiokafka: 1): an ack means every in-sync replica has the record, which is
  what committing offsets after acks (at-least-once) assumes.
- ``linger_ms=5``, ``max_batch_size=256 KiB``: batched sends; ``flush`` skips the linger.
- ``connect_timeout=10`` (seconds): how long ``start`` retries an unreachable broker before
  ``BrokerUnavailable``.
- Auto-commit is off; idempotence and transactions only for exactly-once
  (``transactional_producer``).
"""

from __future__ import annotations

from .consumer import KafkaConsumer
from .errors import map_kafka_errors
from .producer import KafkaProducer
from .transport import KafkaTransport

__all__ = ["KafkaConsumer", "KafkaProducer", "KafkaTransport", "map_kafka_errors"]
