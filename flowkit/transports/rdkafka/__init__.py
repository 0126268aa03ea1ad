"""The librdkafka transport (``kafka://host:port?client=rdkafka``): the transport protocol
over confluent-kafka, for more throughput than aiokafka gives.

Install it with ``pip install "flowkit[rdkafka]"``. This package is the only part of
flowkit that imports ``confluent_kafka``, and ``import flowkit`` does not import it:
``transport_from_url`` imports this package only for a URL with ``client=rdkafka``.
Its modules: ``settings`` (flowkit's setting names mapped to librdkafka properties, the
defaults and checks), ``errors`` (librdkafka's errors translated into ``flowkit.errors``),
``transport`` (``RdkafkaTransport``: connecting and topic administration), ``consumer``
and ``producer``. confluent-kafka's types never leak out of it.

>>> transport = RdkafkaTransport(["127.0.0.1:9092"], linger_ms=2)
>>> transport.url
'kafka://127.0.0.1:9092?client=rdkafka'

The settings and defaults are the aiokafka transport's, plus ``fetch_queue_backoff_ms=10``
(librdkafka: 1000), without which a consumer can stall for a second each time its local
queue fills. librdkafka's blocking calls run in threads, never on the event loop: each
consumer has a thread that waits for records and hands whole batches to the loop, each
producer a thread that collects acknowledgements and hands them over in batches.
"""

from __future__ import annotations

from .consumer import RdkafkaConsumer
from .errors import map_rdkafka_errors
from .producer import RdkafkaProducer
from .transport import RdkafkaTransport

__all__ = ["RdkafkaConsumer", "RdkafkaProducer", "RdkafkaTransport", "map_rdkafka_errors"]
