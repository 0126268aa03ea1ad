"""A card's spend over any 60 seconds, exact at every payment: sliding windows.

A tumbling minute would miss a burst that straddles two minutes; a sliding window has a
window ending at each payment (the 60 s up to it) and one starting just after each payment
(the 60 s once it has left), so every distinct "last 60 seconds" of a card is summed
once, when stream time has passed it. Windows over the limit are flagged.

Run it with ``python -m examples.card_spend``: a test driver feeds it a few payments and
prints the windows over the limit. As a worker (``flowkit worker examples.card_spend:app
--broker kafka://HOST:PORT``) it reads the ``payments`` topic, which something else
writes, for example ``flowkit send``.
"""

from __future__ import annotations

import asyncio

import flowkit
from flowkit.logs import configure_logging
from flowkit.testing import FakeClock, TestDriver

LIMIT_CENTS = 100_00


class Payment(flowkit.Record):
    card: str
    cents: int
    at: int  # event time, ms


app = flowkit.App("cards", partitions=4)
payments = app.topic("payments", value_type=Payment, external=True)
flagged: list[tuple[str, flowkit.Window, int]] = []


def check(card: str, window: flowkit.Window, cents: int) -> None:
    """Every closed window of a card, once: flag those over the limit."""
    if cents > LIMIT_CENTS:
        flagged.append((card, window, cents))


spend = app.table("spend", default=int).sliding(
    60.0,  # the last 60 s at every payment
    grace=10.0,  # payments up to 10 s out of order still count
    aggregate=flowkit.Sum("cents"),
    time=lambda payment: payment.at,
    on_close=check,
)


@app.agent(payments)
async def track(stream: flowkit.Stream[Payment]) -> None:
    async for payment in stream:
        spend.add(payment.card, payment)


async def main() -> None:
    """Payments of two cards, one with a burst over the limit across a minute boundary."""
    clock = FakeClock()
    t0 = int(clock.time() * 1000) - 3_600_000
    async with TestDriver(app, clock=clock) as driver:
        for card, cents, s in (
            ("a", 60_00, 50),
            ("b", 5_00, 55),
            ("a", 50_00, 70),
            ("a", 1_00, 200),
        ):
            await driver.send(payments, Payment(card, cents, t0 + s * 1000), key=card)
        await driver.run_until_idle()
        await driver.advance(60)  # quiet partitions close their windows too
    for card, window, cents in flagged:
        start, end = (window.start - t0) / 1000, (window.end - t0) / 1000
        print(f"card {card}: {cents / 100:.2f} between {start:g} s and {end:g} s")


if __name__ == "__main__":
    configure_logging("warning")
    asyncio.run(main())
