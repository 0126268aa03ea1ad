"""The stream loop compiler: operators fused into one loop per operator chain.

``stream.filter(p).join(t, on=k).map(f)`` must not cost a Python call per operator per
record on top of the user's own functions, nor a generator hop per operator. So the chain
is compiled, once per *shape* (the sequence of operator kinds), into a single async
generator: the batch loop and every operator inlined, each user function passed in as an
argument (never pasted into the source), the way ``collections.namedtuple`` and
``dataclasses`` build their methods. The generated source is registered with
``linecache``, so a traceback through the loop shows its lines.

``interpreted(ops)`` is the same semantics written plainly, one operator at a time: the
reference the compiled loop is tested against, and what ``batches()`` uses.
"""

from __future__ import annotations

import itertools
import linecache
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..records import Message
    from ..topics import Topic

__all__ = ["ECHO", "EVENTS", "FILTER", "JOIN", "MAP", "SKIP", "fused_loop", "interpreted"]

ECHO = "echo"
FILTER = "filter"
MAP = "map"
EVENTS = "events"
JOIN = "join"
SKIP: Any = object()

Loop = Callable[..., AsyncIterator[Any]]
_cache: dict[tuple[tuple[str, str], ...], Loop] = {}
_serial = itertools.count()


def _shape(ops: tuple[tuple[str, Any], ...]) -> tuple[tuple[str, str], ...]:
    return tuple((kind, fn[2] if kind == JOIN else "") for kind, fn in ops)


def _args(ops: tuple[tuple[str, Any], ...], stores: dict[Any, Any]) -> list[Any]:
    args: list[Any] = []
    for kind, fn in ops:
        if kind == JOIN:
            table, on, _ = fn
            # The worker's own state for the table, with its fastest get (a dict's own).
            store = stores.get(table)
            get = getattr(store, "fast_get", None) or table.get
            args += [get, on, table.name]
        elif kind in (FILTER, MAP, ECHO):
            args.append(fn)
    return args


def fused_loop(ops: tuple[tuple[str, Any], ...], stores: dict[Any, Any]) -> tuple[Loop, list[Any]]:
    """The compiled loop for this chain's shape, and the arguments to call it with:
    ``loop(source, SKIP, *args)``; joined tables are looked up in ``stores``."""
    shape = _shape(ops)
    loop = _cache.get(shape)
    if loop is None:
        loop = _cache[shape] = _compile(shape)
    return loop, _args(ops, stores)


def _compile(shape: tuple[tuple[str, str], ...]) -> Loop:
    params: list[str] = []
    body: list[str] = []
    uses_events = any(kind == EVENTS for kind, _ in shape)
    for n, (kind, missing) in enumerate(shape):
        if kind == FILTER:
            params.append(f"f{n}")
            body += [f"if not f{n}(v):", "    continue"]
        elif kind == MAP:
            params.append(f"f{n}")
            body.append(f"v = f{n}(v)")
        elif kind == EVENTS:
            body.append("v = event(m, v)")
        elif kind == ECHO:
            params.append(f"f{n}")
            body.append(f"await f{n}(source, v, m)")
        elif kind == JOIN:
            params += [f"get{n}", f"on{n}", f"name{n}"]
            body.append(f"match = get{n}(on{n}(v), SKIP)")
            if missing == "skip":
                body += ["if match is SKIP:", "    continue"]
            elif missing == "none":
                body += ["if match is SKIP:", "    match = None"]
            else:
                body += [
                    "if match is SKIP:",
                    f"    raise KeyError(f'no {{on{n}(v)!r}} in table {{name{n}!r}} (join)')",
                ]
            body.append("v = (v, match)")
        else:  # pragma: no cover - the Stream methods only build the kinds above
            raise ValueError(f"unknown operator {kind!r}")
    inner = "\n".join("            " + line for line in [*body, "yield v"])
    events = "        event = batch.topic.event\n" if uses_events else ""
    src = f"""
async def loop(source, {", ".join(["SKIP", *params])}):
    next_batch = source._next_batch
    finish = source._finish
    while True:
        batch = source.batch
        if batch is None:
            batch = await next_batch()
            if batch is None:
                return
        messages = batch.messages
        decode = batch.decode
        # The position is the iterator's: source.pos reads it when someone asks.
        start = source.pos + 1
        it = iter(messages)
        if start:
            it.__setstate__(start)
        source._n = len(messages)
        source._it = it
{events}        for m in it:
            # Decoded here, one record at a time, not for the whole batch up front: the
            # object is fresh in the cache when the agent reads it.
            try:
                v = decode(m.value)
            except Exception as exc:
                # The agent never sees a record that does not decode: the worker dead-letters
                # it here and the loop goes on, so the agent is not restarted for it.
                error = batch.topic.decode_error(exc)
                if source.undecodable is None or not await source.undecodable(error):
                    raise error from None
                continue
            source.value = v
{inner}
        source.records += len(messages)
        finish(batch)
"""
    filename = f"<flowkit stream loop {next(_serial)}: {' '.join(k for k, _ in shape) or 'plain'}>"
    # Registered like dataclasses' generated methods, so tracebacks show the lines.
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    namespace: dict[str, Any] = {}
    exec(compile(src, filename, "exec"), namespace)
    fn: Loop = namespace["loop"]
    return fn


def interpreted(ops: tuple[tuple[str, Any], ...]) -> Callable[[Any, Topic[Any], Message], Any]:
    """The operators as one plain function of (value, topic, message) -> value or SKIP."""
    steps = list(ops)

    def apply(v: Any, topic: Topic[Any], message: Message) -> Any:
        for kind, fn in steps:
            if kind == FILTER:
                if not fn(v):
                    return SKIP
            elif kind == MAP:
                v = fn(v)
            elif kind == JOIN:
                table, on, missing = fn
                key = on(v)
                match = table.get(key, SKIP)
                if match is SKIP:
                    if missing == "skip":
                        return SKIP
                    if missing == "error":
                        raise KeyError(f"no {key!r} in table {table.name!r} (join)")
                    match = None
                v = (v, match)
            elif kind == ECHO:  # pragma: no cover - Stream refuses echo before lists
                raise ValueError("echo() cannot come before take() or batches()")
            else:  # events: wrap the value in its envelope
                v = topic.event(message, v)
        return v

    return apply
