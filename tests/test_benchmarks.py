"""Smoke tests of the benchmark scripts' in-process parts, at tiny sizes (no timing is
asserted: the figures are printed by the scripts, run by hand)."""

from __future__ import annotations

import asyncio

from benchmarks import latency, recovery
from flowkit.transports import MemoryTransport


async def test_recovery_rebuilds_the_whole_table() -> None:
    _, table = recovery.make_app()
    broker = recovery.memory_broker(table, 2000)
    seconds, cpu, size = await recovery.with_flowkit(2000, transport=MemoryTransport(broker))
    assert size == 2000
    assert seconds > 0 and cpu > 0
    _, _, hand_size = await recovery.hand_memory(broker, table)
    assert hand_size == 2000


async def test_latency_observes_every_output_ack() -> None:
    ms, sent = await latency.memory_latency(rate=2000, seconds=0.3, warmup=0)
    assert sent > 0
    assert ms and all(m >= 0 for m in ms)
    assert latency.percentiles(ms).startswith("p50")


def test_the_benchmark_loop_variants_agree() -> None:
    from benchmarks import ysb
    from benchmarks.probes import steps

    data = ysb.payloads(300)
    broker = asyncio.run(ysb.loaded_broker(data))
    messages = [m for p in range(4) for m in broker.messages("ysb-events", p)]
    raw = [value for _, value in data]
    views = steps.loops("filter-inline", raw, messages)
    assert 0 < views < 300
    assert steps.loops("filter-lambda", raw, messages) == views
    assert steps.loops("async-generator", raw, messages) == 300
