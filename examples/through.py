"""stream.through: a one-partition feed moved onto four partitions before per-key state.

Readings come from a legacy producer that writes every sensor to the one partition of
``raw-readings``, in Fahrenheit. The agent converts each reading and moves the stream
onto ``readings`` (four partitions, keyed by sensor, as the table is), then keeps each
sensor's highest temperature: every table write happens on the partition that owns the
sensor, and four agent instances could share the work. Faust's ``stream.through`` is the
same operator. Run it with ``python -m examples.through``. As a worker it waits for
readings, which on Kafka you can write by hand::

    flowkit worker examples.through:app --broker kafka://127.0.0.1:9092
    flowkit send examples.through:app raw-readings '{"sensor": "sauna", "fahrenheit": 176}' \\
        --key sauna --broker kafka://127.0.0.1:9092
    flowkit tables show examples.through:app highest --broker kafka://127.0.0.1:9092
"""

from __future__ import annotations

import asyncio

import flowkit
from flowkit.logs import configure_logging
from flowkit.testing import TestDriver


class RawReading(flowkit.Record):
    sensor: str
    fahrenheit: float


class Reading(flowkit.Record):
    sensor: str
    celsius: float


def to_celsius(raw: RawReading) -> Reading:
    return Reading(raw.sensor, round((raw.fahrenheit - 32) * 5 / 9, 1))


app = flowkit.App("sensors", partitions=4)
raw_readings = app.topic(
    "raw-readings", value_type=RawReading, partitions=1, external=True
)  # a legacy producer writes it
readings = app.topic("readings", value_type=Reading)  # four partitions, keyed by sensor
highest = app.table("highest")  # sensor -> highest celsius, co-partitioned with readings


handled: list[tuple[int, str]] = []  # (partition of readings, what the agent did)


@app.agent(raw_readings)
async def track_highest(stream: flowkit.Stream[RawReading]) -> None:
    async for reading in stream.map(to_celsius).through(readings):
        # Read back from readings: on the partition that owns reading.sensor.
        high = reading.sensor not in highest or reading.celsius > highest[reading.sensor]
        if high:
            highest[reading.sensor] = reading.celsius
        event = stream.current
        assert event is not None
        handled.append((event.partition, f"{reading.sensor} {reading.celsius}" + " high" * high))


FEED = [
    ("sauna", 176.0),
    ("garage", 41.0),
    ("sauna", 194.0),
    ("kitchen", 68.0),
    ("boiler", 140.0),
    ("garage", 39.2),
]


async def main() -> None:
    """Feed six readings, keyed by sensor, and print the highest of each."""
    async with TestDriver(app) as driver:
        for sensor, fahrenheit in FEED:
            await driver.send(raw_readings, RawReading(sensor, fahrenheit), key=sensor)
        await driver.run_until_idle()
        print("highest:", {sensor: highest[sensor] for sensor in sorted(highest)})
    # Each partition keeps the order of its records; partitions run side by side.
    for partition in sorted({p for p, _ in handled}):
        print(f"readings/{partition}:", ", ".join(what for p, what in handled if p == partition))


if __name__ == "__main__":
    configure_logging("warning")
    asyncio.run(main())
