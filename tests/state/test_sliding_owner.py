"""Which sliding windows the owner closes: each window its key's records define, once.

A window ``[t + 1, t + 1 + size]`` just after a record at ``t`` is also the own window of
a record at ``t + 1 + size``, when there is one: both are queued to close at the same
end, and only the record's own closes it (``sliding_owner.start_after``). The reference
suites draw times on a half-second grid, where two records exactly ``size + 1`` apart
are rare; here they are the point.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowkit.state.windowed.sliding_owner import start_after, windows_of
from flowkit.testing import FakeClock, TestDriver
from tests.test_sliding import SIZE, Hit, Result, base_ms, sliding_app


def closes(times: list[int], size: int) -> list[tuple[int, int]]:
    """The windows a close of every record's two queued windows emits, in a list (a
    window emitted twice is there twice)."""
    records: list[list[Any]] = [[t, 1] for t in times]
    out = []
    for t in times:
        out.append((t - size, t))  # the window ending at its record
        end = t + 1 + size
        start = start_after(records, end, t)
        if start is not None:
            out.append((start, end))
    return sorted(out)


@settings(deadline=None)  # a loaded machine is no failure
@given(
    times=st.lists(st.integers(0, 40), min_size=1, max_size=12, unique=True).map(sorted),
    size=st.integers(0, 12),
)
def test_each_window_closes_once(times: list[int], size: int) -> None:
    assert closes(times, size) == sorted(windows_of([[t, 1] for t in times], size))


def test_the_window_just_after_a_record_is_the_next_ones_own() -> None:
    assert closes([0, 11], 10) == [(-10, 0), (1, 11)]
    assert closes([0, 10], 10) == [(-10, 0), (0, 10), (1, 11)]
    assert closes([0, 12], 10) == [(-10, 0), (2, 12)]


@pytest.mark.usefixtures("window_store")
async def test_records_size_and_one_apart_close_two_windows() -> None:
    clock = FakeClock()
    t0 = base_ms(clock)
    closed: list[Result] = []
    app, hits, _ = sliding_app(closed, [], grace=0)
    async with TestDriver(app, clock=clock, fail_fast=True) as driver:
        for ts, n in ((t0, 1), (t0 + SIZE + 1, 2), (t0 + 100 * SIZE, 3)):
            await driver.send(hits, Hit("a", ts, n), key="a")
        await driver.run_until_idle()
    assert sorted(c[1:] for c in closed if c[0] == "a") == [
        (t0 - SIZE, t0, [1]),
        (t0 + 1, t0 + SIZE + 1, [2]),
    ]
