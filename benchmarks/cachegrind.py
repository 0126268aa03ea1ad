"""Cache misses and branch mispredictions of the timed loops: why equal instructions take
unequal time.

    python -m benchmarks.ysb --cache --events 50000

This machine's hardware counters are not readable (``perf`` has none), so we simulate:
``valgrind --tool=callgrind --cache-sim=yes --branch-sim=yes`` runs the benchmark's
``--part hand`` and ``--part flowkit`` with collection off, and the benchmark switches it
on only around its timed loop (``measured()``), so start-up, loading and teardown are not
counted at all: no subtraction, only the loop. The simulation is deterministic.

The switch is valgrind's client request, the few no-op instructions that valgrind
recognises (``valgrind.h``), written into an executable page and called with ``ctypes``:
nothing to compile. Outside valgrind ``measured()`` does nothing.

Simulated: a 32 KiB first-level instruction and data cache, as this machine's, and a
512 KiB last level (a core's second-level cache here), not the shared 32 MiB: the timed run
of 1 M events reads hundreds of MiB, far more than either, and at the 50,000 events the
simulation can afford only a cache smaller than the data shows what the long run sees.
The branch predictor simulated is simpler than a real CPU's (indirect jumps are
predicted by their last target), so mispredictions are an upper bound that ranks loops.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import re
import shutil
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from benchmarks.callgrind import run

__all__ = ["EVENTS", "compare", "measured"]

#: callgrind's event names -> our labels.
EVENTS = {
    "Ir": "instructions",
    "I1mr": "I1 misses",
    "Dr": "data reads",
    "Dw": "data writes",
    "D1mr": "D1 read misses",
    "D1mw": "D1 write misses",
    "DLmr": "LL read misses",
    "Bc": "cond. branches",
    "Bcm": "cond. mispredicts",
    "Bi": "indirect jumps",
    "Bim": "indirect mispredicts",
}
_MARKS = "FLOWKIT_BENCH_MARKS"
_TOGGLE_COLLECT = 0x43540002  # VG_USERREQ_TOOL_BASE('C', 'T') + 2, callgrind.h
# long request(long *args): rax = args; the preamble (rolq 3, 13, 61, 51 of rdi: a full
# turn twice, so no change) and xchgq rbx, rbx that valgrind turns into the request.
_CODE = "4889f8 31d2 48c1c703 48c1c70d 48c1c73d 48c1c733 4887db 4889d0 c3"
_request: Callable[[ctypes.Array[ctypes.c_long]], int] | None = None


def _toggle() -> None:
    global _request
    if _request is None:
        page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        page.write(bytes.fromhex(_CODE.replace(" ", "")))
        address = ctypes.addressof(ctypes.c_char.from_buffer(page))
        kind = ctypes.CFUNCTYPE(ctypes.c_long, ctypes.POINTER(ctypes.c_long))
        _request = kind(address)
        _toggle.page = page  # type: ignore[attr-defined]  # keep the page mapped
    _request((ctypes.c_long * 6)(_TOGGLE_COLLECT, 0, 0, 0, 0, 0))


@contextlib.contextmanager
def measured() -> Iterator[None]:
    """Collect valgrind's counts only inside this block (when ``compare`` runs us)."""
    if os.environ.get(_MARKS) != "1":
        yield
        return
    _toggle()
    try:
        yield
    finally:
        _toggle()


def counts(
    module: str, part: str, size_flag: str, size: int, keep: str | None = None
) -> dict[str, int]:
    """callgrind's totals over the ``measured()`` blocks of ``python -m module --part``;
    ``keep``: a directory to copy callgrind's output to (``<part>.cg``), for
    ``callgrind_annotate`` (the cost of each C function: the interpreter's, msgspec's)."""
    options = [
        "--collect-atstart=no",
        "--cache-sim=yes",
        "--branch-sim=yes",
        "--I1=32768,8,64",
        "--D1=32768,8,64",
        "--LL=524288,8,64",
    ]
    with run(module, part, size_flag, size, options, {_MARKS: "1"}) as (stderr, path):
        text = Path(path).read_text()
        if keep is not None:
            Path(keep).mkdir(parents=True, exist_ok=True)
            shutil.copy(path, Path(keep) / f"{part}.cg")
    events = re.search(r"^events: (.*)$", text, re.M)
    totals = re.search(r"^totals: (.*)$", text, re.M)
    if events is None or totals is None:
        raise SystemExit(f"no totals from callgrind:\n{stderr[-2000:]}")
    return dict(zip(events.group(1).split(), map(int, totals.group(1).split()), strict=True))


def compare(
    module: str,
    size_flag: str,
    size: int,
    unit: str,
    keep: str | None = None,
    others: Sequence[tuple[str, str]] = (),
) -> None:
    """Print each simulated count per ``unit`` for the hand-written loop and flowkit
    (``keep``: see ``counts``); ``others``: more flowkit forms, (part, label) pairs, a
    column each."""
    parts = [("hand", "hand-written"), ("flowkit", "flowkit"), *others]
    got = {part: counts(module, part, size_flag, size, keep) for part, _ in parts}
    hand = got["hand"]
    print(f"{size:,} {unit}s, per {unit}, timed loops only (callgrind cache and branch sim)")
    head = "".join(f"{label:>{max(12, len(label) + 2)}}" for _, label in parts)
    ratios = "".join(f"{label + '/hand':>{len(label) + 7}}" for _, label in parts[1:])
    print(f"{'':<22}{head}{ratios}")
    for event, label in EVENTS.items():
        h = hand.get(event, 0) / size
        row = [got[part].get(event, 0) / size for part, _ in parts]
        cells = "".join(
            f"{v:>{max(12, len(name) + 2)},.1f}" for v, (_, name) in zip(row, parts, strict=True)
        )
        cells += "".join(
            f"{v / h if h else float('nan'):>{len(name) + 7}.2f}"
            for v, (_, name) in zip(row[1:], parts[1:], strict=True)
        )
        print(f"{label:<22}{cells}")
