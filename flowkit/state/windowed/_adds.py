"""A windowed table's per-record ``add``, specialised for a declared aggregation or for
running updates, so that neither costs a plain table anything.

``WindowedTable.add`` is the reference, and what a plain table runs. A table declared with
``aggregate=`` or ``emit_on="update"`` runs a copy of it made here from its own source,
with up to three marked lines filled in:

* the lift: ``amount = 1`` for a count, ``amount = amount.price`` for ``Sum("price")``,
  inlined where the time is known, so a declared count takes the tumbling sum's fast path
  and costs what a hand-written ``add(key, 1)`` does (the record is kept for ``late=``);
* the fold: ``add(acc, value)`` of an aggregation that is not a merge of lifted values
  (mean, last, collect, distinct, user-defined), with ``initial()`` for a key's first value;
* running updates: the ``(window, key)`` each add changed, for the worker's next flush;
* for a session table, which merges accumulators only, a declared aggregation's
  accumulator of the one record (``add(initial(), record)``).

The copy is compiled once per table, registered with ``linecache`` so a traceback shows
its lines, and put on a subclass of the table's class (a method, as the original is).
"""

from __future__ import annotations

import inspect
import linecache
import textwrap
from typing import TYPE_CHECKING, Any

from ...aggregations import Aggregation
from ...errors import DefinitionError

if TYPE_CHECKING:
    from .table import WindowedTable

__all__ = ["specialised"]

_LIFT = "# (here a declared aggregation's lift of amount"
_FOLD = "partial[key] = amount if old is _MISSING else self.combine(old, amount)"
_CHANGED = "# (here running updates mark the key changed"
_LATE = "self._late("
_ONE = "# (here a declared aggregation's accumulator of one record"


def specialised(
    cls: type[WindowedTable[Any, Any]], aggregation: Aggregation | None, updates: bool
) -> type[WindowedTable[Any, Any]]:
    """A subclass of ``cls`` whose ``add`` lifts or folds with ``aggregation`` and, with
    ``updates``, notes each change."""
    try:
        src = textwrap.dedent(inspect.getsource(cls.add))
    except (OSError, TypeError):  # pragma: no cover - an install without its sources
        raise DefinitionError(
            "aggregate= and emit_on='update' need flowkit's source files installed"
        ) from None
    lines = src.splitlines()
    out: list[str] = []
    ts = ", ts" if aggregation is not None and aggregation.timed else ""
    lifts = aggregation is not None and aggregation.lifted and bool(aggregation.lift)
    # Session tables merge accumulators only: each record becomes one first.
    ones = aggregation is not None and not aggregation.lifted and _ONE in src
    for line in lines:
        body = line.strip()
        indent = line[: len(line) - len(line.lstrip())]
        if body.startswith(_LIFT):
            if lifts:
                # The record stays at hand for late=, which gets it as on a plain table.
                assert aggregation is not None
                line = f"{indent}record = amount\n{indent}amount = {aggregation.lift}"
        elif body.startswith(_ONE):
            if ones:
                line = f"{indent}record = amount\n{indent}amount = _fold(_initial(), amount{ts})"
        elif (lifts or ones) and body.startswith(_LATE) and body.endswith(", amount)"):
            line = line[: -len(", amount)")] + ", record)"
        elif body == _FOLD:
            if aggregation is not None and not aggregation.lifted:
                line = (
                    f"{indent}partial[key] = _fold(_initial(), amount{ts}) "
                    f"if old is _MISSING else _fold(old, amount{ts})"
                )
        elif body.startswith(_CHANGED) and updates:
            line = f"{indent}part.changed.add({cls.changed_entry})"
        out.append(line)
    # As in table.py: annotations stay strings (its generics are not evaluated).
    code = "from __future__ import annotations\n" + "\n".join(out) + "\n"
    name = getattr(aggregation, "name", "plain")
    filename = f"<flowkit add: {name}{', updates' if updates else ''}>"
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    module = inspect.getmodule(cls.add)
    namespace: dict[str, Any] = dict(vars(module)) if module is not None else {}
    if aggregation is not None:
        namespace["_fold"] = aggregation.add
        namespace["_initial"] = aggregation.initial
    exec(compile(code, filename, "exec"), namespace)
    return type(cls.__name__, (cls,), {"add": namespace["add"], "__module__": cls.__module__})
