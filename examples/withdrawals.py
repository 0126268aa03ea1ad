"""Faust's withdrawals example, ported: totals per user per hour and per country per 10 s.

The Faust original (``examples/withdrawals.py``, trimmed)::

    class Withdrawal(faust.Record, isodates=True, serializer="json"):
        user: str
        country: str
        amount: float
        date: datetime = None

    app = faust.App("faust-withdrawals", broker="aiokafka://", topic_partitions=4)
    withdrawals_topic = app.topic("withdrawals", value_type=Withdrawal)
    user_to_total = app.Table("user_to_total", default=int).tumbling(3600).relative_to_stream()
    country_to_total = app.Table("country_to_total", default=int).tumbling(
        10.0, expires=10.0
    ).relative_to_stream()

    @app.agent(withdrawals_topic)
    async def track_user_withdrawal(withdrawals):
        async for withdrawal in withdrawals:
            user_to_total[withdrawal.user] += withdrawal.amount

    @app.agent()
    async def track_country_withdrawal(withdrawals):
        async for withdrawal in withdrawals.group_by(Withdrawal.country):
            country_to_total[withdrawal.country] += withdrawal.amount

Windows are over the record timestamp in both (Faust's ``relative_to_stream``). The
country totals need no ``group_by`` in flowkit: each partition adds up its withdrawals
per country, and the partition that owns the country combines them when the window
closes, then calls ``on_close``. Run it with ``python -m examples.withdrawals``. As a
worker it waits for withdrawals, which on Kafka you can write by hand::

    flowkit worker examples.withdrawals:app --broker kafka://127.0.0.1:9092
    flowkit send examples.withdrawals:app withdrawals \\
        '{"user": "ann", "country": "NO", "amount": 120.5}' --key ann \\
        --broker kafka://127.0.0.1:9092
"""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime

import flowkit
from flowkit.logs import configure_logging
from flowkit.testing import FakeClock, TestDriver


class Withdrawal(flowkit.Record):
    user: str
    country: str
    amount: float
    date: datetime | None = None


closed: list[tuple[str, int, float]] = []  # (country, window start in s, total)


def country_closed(country: str, window: flowkit.Window, total: float) -> None:
    closed.append((country, window.start // 1000, total))


app = flowkit.App("faust-withdrawals", partitions=4)
withdrawals_topic = app.topic("withdrawals", value_type=Withdrawal, external=True)
user_to_total = app.table("user_to_total", default=int).tumbling(3600)
country_to_total = app.table("country_to_total", default=int).tumbling(
    10.0, expires=10.0, on_close=country_closed
)


@app.agent(withdrawals_topic)
async def track_user_withdrawal(withdrawals: flowkit.Stream[Withdrawal]) -> None:
    async for withdrawal in withdrawals:
        user_to_total[withdrawal.user] += withdrawal.amount


@app.agent(withdrawals_topic)
async def track_country_withdrawal(withdrawals: flowkit.Stream[Withdrawal]) -> None:
    async for withdrawal in withdrawals:
        country_to_total[withdrawal.country] += withdrawal.amount


def generate_withdrawals(n: int, seed: int = 5) -> list[Withdrawal]:
    """``n`` withdrawals, the same ones every time: 90% from country_0, as in Faust."""
    rng = random.Random(seed)
    countries = [f"country_{i}" for i in range(3)]
    return [
        Withdrawal(
            user=f"user_{rng.randint(0, 4)}",
            country=rng.choices(countries, [0.9, 0.05, 0.05])[0],
            amount=float(rng.randint(1, 250) * 100),
        )
        for _ in range(n)
    ]


async def main() -> None:
    """Send one withdrawal a second for 30 s, then let the windows close (fake clock)."""
    clock = FakeClock(start=1_700_000_000.0)
    start = int(clock.time())
    async with TestDriver(app, clock=clock) as driver:
        for i, withdrawal in enumerate(generate_withdrawals(30)):
            withdrawal.date = datetime.fromtimestamp(start + i, UTC)
            await driver.send(
                withdrawals_topic,
                withdrawal,
                key=withdrawal.user,
                timestamp_ms=(start + i) * 1000,  # the record timestamp: its event time
            )
        await driver.run_until_idle()
        print("this hour:", {u: user_to_total[u].now() for u in sorted(user_to_total)})
        await driver.advance(60)  # no more withdrawals: quiet partitions close the windows
    for country, window_start, total in sorted(closed, key=lambda c: (c[1], c[0])):
        print(f"{country} [+{window_start - start}s, +{window_start - start + 10}s): {total}")


if __name__ == "__main__":
    configure_logging("warning")
    asyncio.run(main())
