"""The Apache Kafka test broker itself (tests/apache_kafka.py): a restart keeps what was
acknowledged, and ``clean()`` leaves nothing for the next test."""

from __future__ import annotations

import pytest

from flowkit.records import TopicPartition
from flowkit.transports import TopicSpec, read_to_end, transport_from_url
from tests.apache_kafka import ApacheKafka
from tests.transports.conftest import unique

pytestmark = [pytest.mark.kafka, pytest.mark.apache_kafka]


async def produce(broker: ApacheKafka, topic: str, count: int) -> None:
    transport = transport_from_url(broker.url, linger_ms=1)
    try:
        await transport.create_topics([TopicSpec(topic, 2)])
        producer = transport.producer(client_id="test-producer")
        await producer.start()
        pending = [await producer.send(topic, b"%d" % i, key=b"%d" % i) for i in range(count)]
        for ack in pending:
            await ack
        await producer.aclose()
    finally:
        await transport.aclose()


async def read(broker: ApacheKafka, topic: str) -> list[bytes]:
    transport = transport_from_url(broker.url, fetch_max_wait_ms=20)
    try:
        consumer = transport.consumer(group_id=None, client_id="test-reader")
        await consumer.start()
        tps = {TopicPartition(topic, p) for p in range(2)}
        consumer.assign(tps)
        out: list[bytes] = []
        await read_to_end(consumer, tps, lambda _, ms: out.extend(m.value or b"" for m in ms))
        await consumer.aclose()
        return out
    finally:
        await transport.aclose()


async def test_a_restart_keeps_the_log_directory_and_ports(
    clean_apache_kafka: ApacheKafka,
) -> None:
    topic = unique("restart")
    await produce(clean_apache_kafka, topic, 50)
    before = clean_apache_kafka.bootstrap
    clean_apache_kafka.restart()
    assert clean_apache_kafka.bootstrap == before
    assert sorted(await read(clean_apache_kafka, topic), key=int) == [b"%d" % i for i in range(50)]


async def test_clean_deletes_every_topic_and_group(clean_apache_kafka: ApacheKafka) -> None:
    topic = unique("clean")
    await produce(clean_apache_kafka, topic, 3)
    transport = transport_from_url(clean_apache_kafka.url)
    try:
        assert await transport.partition_count(topic) == 2
        clean_apache_kafka.clean()
        assert await transport.partition_count(topic) is None
    finally:
        await transport.aclose()
