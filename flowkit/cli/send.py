"""``flowkit send APP TOPIC VALUE``: one record, checked against the topic's type first.

The topic is created with its declared partitions if it does not exist yet.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import typer

from ..errors import ConfigurationError
from ..transports import Ack, TopicSpec, Transport
from .common import AppArg, BrokerOpt, errors
from .operator import kafka_app, open_transport, parse_typed

__all__ = ["send"]


def send(
    app: AppArg,
    topic: Annotated[str, typer.Argument(metavar="TOPIC", help="A topic APP declares.")],
    value: Annotated[
        str, typer.Argument(metavar="VALUE", help="The value, as JSON (a str topic: as-is).")
    ],
    key: Annotated[
        str | None, typer.Option("--key", "-k", help="The key (JSON unless the key is a str).")
    ] = None,
    partition: Annotated[
        int | None, typer.Option("--partition", "-p", min=0, help="Default: by key.")
    ] = None,
    broker: BrokerOpt = None,
) -> None:
    """Validate VALUE against TOPIC's type, send it, and print where it went."""
    with errors():
        the_app, url = kafka_app(app, broker, "sending")
        declared = the_app.topics.get(topic)
        if declared is None:
            known = ", ".join(sorted(the_app.topics)) or "none"
            raise ConfigurationError(f"app {the_app.name!r} declares no topic {topic!r} ({known})")
        if partition is not None and partition >= declared.partitions:
            # Refused before the broker is asked: the declared count is the topic's (a
            # worker refuses to start when the broker's differs).
            raise ConfigurationError(
                f"topic {topic!r} has {_partitions(declared.partitions)}; "
                f"--partition {partition} is not one of them"
            )
        decoded = parse_typed(value, declared.value_type, "VALUE")
        raw_key = None
        if key is not None:
            raw_key = declared.encode_key(parse_typed(key, declared.key_type, "--key"))
        spec = TopicSpec(topic, declared.partitions, compacted=declared.compacted)
        transport = open_transport(the_app, url)
        ack = asyncio.run(_send(transport, spec, declared.encode(decoded), raw_key, partition))
    typer.echo(f"sent to {ack.topic}/{ack.partition}@{ack.offset}")


def _partitions(n: int) -> str:
    return "1 partition (0)" if n == 1 else f"{n} partitions (0-{n - 1})"


async def _send(
    transport: Transport, spec: TopicSpec, value: bytes, key: bytes | None, partition: Any
) -> Ack:
    try:
        # As a worker would: the topic gets the declared partitions (or the counts differ:
        # a one-line error), rather than whatever a broker's auto-creation gives it.
        await transport.create_topics([spec])
        producer = transport.producer(client_id="flowkit-send")
        await producer.start()
        try:
            ack = await producer.send(spec.name, value, key=key, partition=partition)
            return ack if isinstance(ack, Ack) else await ack
        finally:
            await producer.aclose()
    finally:
        await transport.aclose()
