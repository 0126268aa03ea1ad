"""Window specs: pure assignment logic."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import flowkit
from flowkit.windows import HoppingWindow, SessionWindow, SlidingWindow, TumblingWindow


def test_tumbling_assigns_one_window() -> None:
    spec = TumblingWindow(10.0)
    assert spec.starts(0) == [0]
    assert spec.starts(9_999) == [0]
    assert spec.starts(10_000) == [10_000]
    assert spec.window(10_000) == flowkit.Window(10_000, 20_000)
    assert spec.kind == "tumbling"


def test_defaults_keep_a_full_window_of_grace() -> None:
    spec = TumblingWindow(10.0)
    assert (spec.grace_ms, spec.expires_ms) == (10_000, 20_000)
    assert TumblingWindow(10.0, grace=0, expires=60).expires_ms == 60_000


@given(ts=st.integers(0, 10**13), size_steps=st.integers(1, 6), step=st.integers(1, 5000))
def test_hopping_windows_are_exactly_those_containing_ts(
    ts: int, size_steps: int, step: int
) -> None:
    spec = HoppingWindow(size_steps * step / 1000, step=step / 1000)
    starts = spec.starts(ts)
    assert len(starts) == size_steps
    for start in starts:
        assert start <= ts < start + spec.size_ms and start % spec.step_ms == 0


def test_bad_specs_are_definition_errors() -> None:
    with pytest.raises(flowkit.DefinitionError, match="multiple of its step"):
        HoppingWindow(10, step=3)
    with pytest.raises(flowkit.DefinitionError, match="> 0"):
        TumblingWindow(0)
    with pytest.raises(flowkit.DefinitionError, match=">= 0"):
        TumblingWindow(10, grace=-1)


def test_each_kind_writes_the_bounds_it_includes() -> None:
    # A late record's message shows its window's bounds: a tumbling or hopping window's
    # end belongs to the next window; session and sliding windows hold both ends.
    window = flowkit.Window(0, 10_000)
    assert TumblingWindow(10).bounds(window) == "[0, 10000)"
    assert HoppingWindow(10, step=5).bounds(window) == "[0, 10000)"
    assert SlidingWindow(10).bounds(window) == "[0, 10000]"
    assert SessionWindow(10).bounds(flowkit.Window(7, 7)) == "[7, 7]"
