"""The Apache Kafka test broker itself (tests/apache_kafka.py): a restart keeps what was
acknowledged, committed offsets included, ``clean()`` leaves nothing for the next test, and
a machine without Java skips its tests, except in CI."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowkit.records import TopicPartition
from flowkit.transports import TopicSpec, read_to_end, transport_from_url
from flowkit.transports.kafka import KafkaConsumer
from tests.apache_kafka import ApacheKafka, require_java
from tests.transports.conftest import unique


@pytest.mark.parametrize("ci", ["", "true"])
def test_without_java_the_tests_skip_saying_why_but_fail_in_ci(
    ci: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no java, no mvn
    monkeypatch.setenv("CI", ci)
    outcome = pytest.fail.Exception if ci else pytest.skip.Exception
    with pytest.raises(outcome, match=r"need Java 17\+ and Maven \(java and mvn not found"):
        require_java()


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


async def committed(broker: ApacheKafka, group: str, topic: str) -> list[int | None]:
    transport = transport_from_url(broker.url)
    try:
        consumer = transport.consumer(group_id=group, client_id="test-offsets")
        assert isinstance(consumer, KafkaConsumer)
        return [await consumer.committed(TopicPartition(topic, p)) for p in range(2)]
    finally:
        await transport.aclose()


@pytest.mark.kafka
@pytest.mark.apache_kafka
async def test_a_restart_keeps_the_log_directory_ports_and_offsets(
    clean_apache_kafka: ApacheKafka,
) -> None:
    topic, group = unique("restart"), unique("group")
    await produce(clean_apache_kafka, topic, 50)
    transport = transport_from_url(clean_apache_kafka.url)
    try:
        consumer = transport.consumer(group_id=group)
        consumer.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])
        await consumer.commit({TopicPartition(topic, 0): 7, TopicPartition(topic, 1): 9})
    finally:
        await transport.aclose()
    before = clean_apache_kafka.bootstrap
    clean_apache_kafka.restart()
    assert clean_apache_kafka.bootstrap == before
    # Asked at once: the coordinator may still be loading the offsets, which must not read
    # as "nothing committed" (flowkit.transports.kafka.loading).
    assert await committed(clean_apache_kafka, group, topic) == [7, 9]
    assert sorted(await read(clean_apache_kafka, topic), key=int) == [b"%d" % i for i in range(50)]


@pytest.mark.kafka
@pytest.mark.apache_kafka
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
