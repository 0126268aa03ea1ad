"""Smoke tests of the benchmark scripts: the index ``python -m benchmarks`` prints, every
script's ``--help``, and their in-process parts at tiny sizes (no timing is asserted: the
figures are printed by the scripts, run by hand)."""

from __future__ import annotations

import ast
import asyncio
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import COMPARISONS, latency, recovery, state_stores, window_keys
from flowkit.transports import MemoryTransport

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
TOOLS = {"chart"}  # runs as a script, and is neither a comparison nor a probe


def scripts(folder: Path) -> set[str]:
    """The modules of ``folder`` that run as scripts."""
    return {
        p.stem
        for p in folder.glob("*.py")
        if p.stem != "__main__" and 'if __name__ == "__main__":' in p.read_text()
    }


PROBES = sorted(f"benchmarks.probes.{name}" for name in scripts(BENCHMARKS / "probes"))
LISTED = [f"benchmarks.{name}" for name in COMPARISONS] + PROBES


def test_every_script_in_benchmarks_is_a_comparison_a_probe_or_the_chart() -> None:
    unlisted = scripts(BENCHMARKS) - TOOLS - set(COMPARISONS)
    assert not unlisted, (
        f"{sorted(unlisted)} run as scripts but are not in benchmarks.COMPARISONS: add a "
        "comparison there, or move a probe of one mechanism to benchmarks/probes/"
    )
    assert not set(COMPARISONS) & scripts(BENCHMARKS / "probes")
    probe_files = {p.stem for p in (BENCHMARKS / "probes").glob("*.py")} - {"__init__"}
    assert probe_files == scripts(BENCHMARKS / "probes"), "every probe runs as a script"


def test_python_m_benchmarks_lists_every_comparison_then_every_probe() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks"],
        cwd=BENCHMARKS.parent,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert re.findall(r"^  python -m (benchmarks\.\S+)  ", out, re.MULTILINE) == LISTED
    assert len(LISTED) == len(set(LISTED))


@pytest.mark.parametrize("module", LISTED + [f"benchmarks.{name}" for name in sorted(TOOLS)])
def test_each_benchmark_has_a_summary_a_usage_line_and_help(
    module: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = BENCHMARKS.parent / (module.replace(".", "/") + ".py")
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    first, _, rest = doc.partition("\n")
    assert first.endswith("."), f"{module}: the docstring's first line is its summary"
    assert not rest or rest.startswith("\n"), f"{module}: a one-line summary, then a blank line"
    assert f"python -m {module}" in doc, f"{module}: its docstring shows how to run it"
    monkeypatch.setattr(sys, "argv", [str(path), "--help"])
    with pytest.raises(SystemExit) as exited:
        runpy.run_path(str(path), run_name="__main__")
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith("usage:")


async def test_recovery_rebuilds_the_whole_table() -> None:
    _, table = recovery.make_app()
    broker = recovery.memory_broker(table, 2000)
    seconds, cpu, size = await recovery.with_flowkit(2000, transport=MemoryTransport(broker))
    assert size == 2000
    assert seconds > 0 and cpu > 0
    _, _, hand_size = await recovery.hand_memory(broker, table)
    assert hand_size == 2000


@pytest.mark.parametrize("store", ["memory://", "rocksdb://"])
@pytest.mark.parametrize("standby_replicas", [0, 1])
async def test_the_takeover_benchmark_checks_the_counts_taken_over(
    store: str, standby_replicas: int, tmp_path: Path
) -> None:
    keys = [f"user-{i}" for i in range(400)]
    seconds = await state_stores.takeover(keys, store, standby_replicas, tmp_path)
    assert seconds > 0  # (SystemExit if a count is wrong)


@pytest.mark.parametrize("store", ["memory://", "rocksdb://"])
async def test_the_takeover_benchmark_checks_the_windows_taken_over(
    store: str, tmp_path: Path
) -> None:
    keys = [f"user-{i}" for i in range(400)]
    seconds = await state_stores.takeover(keys, store, 1, tmp_path, windowed=True)
    assert seconds > 0  # (SystemExit if a count is wrong)


@pytest.mark.parametrize("store", ["memory://", "rocksdb://"])
async def test_the_window_keys_benchmark_checks_every_closed_key(
    store: str, tmp_path: Path
) -> None:
    result = await window_keys.count_windows(store, 300, 2, tmp_path, settle=0)  # (or SystemExit)
    assert result["records"] == 600 + window_keys.PARTITIONS


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


def test_the_join_store_alone_gives_as_many_results_on_both_stores() -> None:
    from benchmarks import joins

    records = joins.by_partition(joins.data_set(1_000))
    on_disk = joins.store_only(records, rocksdb=True, every=300)
    assert on_disk == joins.store_only(records) > 900


def test_the_formats_benchmark_reads_back_what_each_format_wrote() -> None:
    from benchmarks import formats

    results = formats.measure(records=120, repeat=1)  # asserts each round trip itself
    assert set(results["decode"]) == {
        "json",
        "json-schema",
        "avro",
        "avro (confluent)",
        "json-schema (confluent)",
    }
    assert set(results["encode"]) == {"json", "json-schema", "avro"}
