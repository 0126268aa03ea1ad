"""A per-record agent's outputs are placed a record at a time (``Emitter.place``): in
order, with a sink waited for before the agent goes on, and a large fan-out still told to
the publisher in chunks."""

from __future__ import annotations

from collections.abc import Iterator

import flowkit
from tests.conftest import DriverFactory


async def test_a_large_fan_out_reaches_a_topic_and_a_sink_in_order(
    make_driver: DriverFactory,
) -> None:
    app = flowkit.App("fanout")
    nums = app.topic("nums", value_type=int, partitions=1)
    copies = app.topic("copies", value_type=int, partitions=2)
    taken: list[int] = []

    def every_thousandth(value: int) -> None:
        taken.append(value)

    @app.agent(nums, sink=[copies, every_thousandth], per_record=True)
    def fan_out(n: int) -> Iterator[flowkit.Output]:
        for i in range(2_500):  # more than one chunk of placed outputs
            to = (copies, every_thousandth) if i % 1_000 == 0 else (copies,)
            yield flowkit.Output(n * 10_000 + i, to=to)

    async with make_driver(app) as driver:
        await driver.send(nums, 1, key="a")
        await driver.send(nums, 2, key="b")
        await driver.run_until_idle()
        got = await driver.values(copies)
        # Each key's outputs on one partition, in the order they were yielded.
        assert sorted(got) == [n * 10_000 + i for n in (1, 2) for i in range(2_500)]
        for n in (1, 2):
            mine = [v for v in got if v // 10_000 == n]
            assert mine == sorted(mine)
        # The sink had its outputs in order, between the topic's (a sink's submit is
        # awaited before the generator goes on).
        assert taken == [n * 10_000 + i for n in (1, 2) for i in (0, 1_000, 2_000)]
        assert driver.worker.dispatcher.outputs == {"fan_out": 5_000}


async def test_outputs_placed_before_the_agent_raises_are_sent(
    make_driver: DriverFactory,
) -> None:
    app = flowkit.App("partial")
    nums = app.topic("nums", value_type=int, partitions=1)
    out = app.topic("out", value_type=int)

    @app.agent(nums, sink=[out], per_record=True)
    def some_then_fail(n: int) -> Iterator[int]:
        yield from range(n * 100, n * 100 + 3)
        if n == 1:
            raise ValueError("one fails after three outputs")

    async with make_driver(app) as driver:
        for n in range(3):
            await driver.send(nums, n, key="k")
        await driver.run_until_idle()
        assert await driver.values(out) == [0, 1, 2, 100, 101, 102, 200, 201, 202]
        [dead] = await driver.dead_letters()
        assert dead.value == b"1"
        assert driver.worker.dispatcher.outputs == {"some_then_fail": 9}
