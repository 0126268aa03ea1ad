"""``stream.group_by`` inside an agent: re-keying through an internal repartition topic.

An agent that writes ``async for v in stream.group_by(key, name="by-x")`` reads two
topics: its own, and ``<app>-by-x-repartition``. Each value of its own topic (after the
operators before ``group_by``) is sent to the repartition topic, keyed by ``key(value)``,
with the record's timestamp; it is not handed to the agent. The values that come back
from the repartition topic, on the partitions this instance owns, are: now the record key
is the new key, so a table keyed by it is written on its own partition.

The topic must exist before the worker runs, so ``group_by`` is found when the agent is
declared (``regroupings``: the calls written in the agent's body, with ``name=`` a string
literal), the way ``flowkit graph`` finds the tables an agent uses. At-least-once, like
``topic.group_by``: the source record's offset is committed only after its forward is
acknowledged, so a crash may forward a record twice.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from ..errors import DefinitionError, NotRunningError
from ._loop import FILTER, SKIP, interpreted

if TYPE_CHECKING:
    from ..topics import Topic
    from .source import StreamSource

__all__ = ["GROUP_BY", "regroup", "regroupings"]

GROUP_BY = "group_by"


def regroupings(fn: Callable[..., Any]) -> dict[str, int | None]:
    """The ``group_by(..., name="literal", partitions=N)`` calls in ``fn``'s own source:
    name -> partitions (None: as the agent's topic). Empty when the source is unknown."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return {}
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    if not defs:
        return {}
    found: dict[str, int | None] = {}
    # The body only: a decorator's ``topic.group_by(...)`` is the topic form, not this one.
    body = ast.Module(body=defs[0].body, type_ignores=[])
    for node in ast.walk(body):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "group_by"
        ):
            continue
        kw = {k.arg: k.value for k in node.keywords if k.arg is not None}
        name, partitions = kw.get("name"), kw.get("partitions")
        if isinstance(name, ast.Constant) and isinstance(name.value, str):
            found[name.value] = (
                partitions.value
                if isinstance(partitions, ast.Constant) and isinstance(partitions.value, int)
                else None
            )
    return found


def split(ops: tuple[tuple[str, Any], ...]) -> tuple[Any, tuple[Any, ...], tuple[Any, ...]]:
    """(the group_by's (key, name), the operators before it, the operators after it)."""
    for i, (kind, arg) in enumerate(ops):
        if kind == GROUP_BY:
            before, after = ops[:i], ops[i + 1 :]
            if any(k == GROUP_BY for k, _ in after):
                raise DefinitionError("a stream can be grouped once: one group_by per chain")
            if any(k not in (FILTER,) for k, _ in before):
                raise DefinitionError(
                    "group_by re-sends the topic's own values: only filter() may come "
                    "before it (put map, join and events after it)"
                )
            return arg, before, after
    raise ValueError("no group_by in this chain")


async def regroup(source: StreamSource, ops: tuple[tuple[str, Any], ...]) -> AsyncIterator[Any]:
    """The values of ``source`` re-keyed through the repartition topic (see above)."""
    (key_fn, name), before, after = split(ops)
    topic: Topic[Any] | None = source.regroups.get(name)
    if topic is None:
        raise DefinitionError(
            f"group_by(name={name!r}) was not seen when the agent was declared: write the "
            "call in the agent's own body, with name= a string literal"
        )
    if source.sender is None:
        raise NotRunningError(f"group_by {name!r}: this worker has no producer yet")
    send = source.sender.send_bytes
    pre = interpreted(before) if before else None
    post = interpreted(after) if after else None
    encode, encode_key = topic.encode, topic.encode_key
    while True:
        batch = source.batch
        if batch is None:
            batch = await source._next_batch()
            if batch is None:
                return
        messages = batch.messages
        home = batch.topic is topic  # back from the repartition topic: the agent's values
        decode = batch.decode
        i = source.pos + 1
        n = len(messages)
        while i < n:
            source._set_pos(i)
            m = messages[i]
            i += 1
            try:
                v = source.value = decode(m.value)
            except Exception as exc:
                raise batch.topic.decode_error(exc) from None
            if home:
                if post is not None:
                    v = post(v, batch.topic, m)
                    if v is SKIP:
                        continue
                yield v
            else:
                if pre is not None and pre(v, batch.topic, m) is SKIP:
                    continue
                await send(
                    topic.name,
                    encode(v),
                    key=encode_key(key_fn(v)),
                    timestamp_ms=m.timestamp,
                )
        source.records += n
        source._finish(batch)
