"""The stream loop compiler: operators fused into one loop per operator chain.

``stream.filter(p).join(t, on=k).map(f)`` must not cost a Python call per operator per
record on top of the user's own functions, nor a generator hop per operator. So the chain
is compiled, once per *shape* (the sequence of operator kinds), into a single async
generator: the batch loop and every operator inlined, each user function passed in as an
argument (never pasted into the source), the way ``collections.namedtuple`` and
``dataclasses`` build their methods; only the simplest lambdas (``lambda v: v.kind ==
"view"``, see ``_inline.py``) are written into the loop as the expression they compute.
The generated source is registered with ``linecache``, so a traceback through the loop
shows its lines.

``interpreted(ops)`` is the same semantics written plainly, one operator at a time: the
reference the compiled loop is tested against, and what ``batches()`` uses.
"""

from __future__ import annotations

import itertools
import linecache
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ..records import RawMessages
from ._inline import NO_CONSTANT, inline_form, key_form

if TYPE_CHECKING:
    from ..records import Message
    from ..topics import Topic

__all__ = [
    "ECHO",
    "EVENTS",
    "FILTER",
    "JOIN",
    "MAP",
    "SKIP",
    "call_loop",
    "fused_loop",
    "interpreted",
]

ECHO = "echo"
FILTER = "filter"
MAP = "map"
EVENTS = "events"
JOIN = "join"
SKIP: Any = object()

Loop = Callable[..., AsyncIterator[Any]]
_cache: dict[tuple[tuple[str, str], ...], Loop] = {}
_calls: dict[tuple[bool, bool], Callable[..., Awaitable[None]]] = {}
_serial = itertools.count()


Form = tuple[str, Any] | None  # an inlined lambda: (expression, constant)


def _forms(ops: tuple[tuple[str, Any], ...]) -> list[Form]:
    forms: list[Form] = []
    for kind, fn in ops:
        if kind in (FILTER, MAP):
            forms.append(inline_form(fn))
        elif kind == JOIN:
            key = key_form(fn[1])
            forms.append(None if key is None else (key, NO_CONSTANT))
        else:
            forms.append(None)
    return forms


def _shape(ops: tuple[tuple[str, Any], ...], forms: list[Form]) -> tuple[tuple[str, str], ...]:
    # What goes into the source: an inlined lambda's expression; a join's missing mode,
    # then its inlined key after a space (``"skip v.ad_id"``).
    shape: list[tuple[str, str]] = []
    for (kind, fn), form in zip(ops, forms, strict=True):
        expr = "" if form is None else form[0]
        shape.append((kind, f"{fn[2]} {expr}".rstrip() if kind == JOIN else expr))
    return tuple(shape)


def _args(ops: tuple[tuple[str, Any], ...], forms: list[Form], stores: dict[Any, Any]) -> list[Any]:
    args: list[Any] = []
    for (kind, fn), form in zip(ops, forms, strict=True):
        if kind == JOIN:
            table, on, _ = fn
            # The worker's own state for the table, with its fastest get (a dict's own).
            store = stores.get(table)
            get = getattr(store, "fast_get", None) or table.get
            args += [get, on, table.name]
        elif form is not None:  # an inlined lambda: its constant, if it has one
            if form[1] is not NO_CONSTANT:
                args.append(form[1])
        elif kind in (FILTER, MAP, ECHO):
            args.append(fn)
    return args


def fused_loop(ops: tuple[tuple[str, Any], ...], stores: dict[Any, Any]) -> tuple[Loop, list[Any]]:
    """The compiled loop for this chain's shape, and the arguments to call it with:
    ``loop(source, SKIP, *args)``; joined tables are looked up in ``stores``."""
    forms = _forms(ops)
    shape = _shape(ops, forms)
    loop = _cache.get(shape)
    if loop is None:
        loop = _cache[shape] = _compile(shape)
    return loop, _args(ops, forms, stores)


def call_loop(is_async: bool, many: bool) -> Callable[..., Awaitable[None]]:
    """The loop of a per-record agent: ``await loop(source, SKIP, fn, place, settle,
    failed)`` calls ``fn`` on each value from inside the loop, so no generator hands the
    values over.

    ``fn(value)`` (awaited if ``is_async``) returns an output or None, or if ``many`` a
    generator of outputs; ``place(outputs, record)`` places the record's outputs and returns
    None, or something to ``await settle(...)`` before it is called again for the rest
    (see ``Emitter.place``). When the call or its outputs raise, ``await failed(exc,
    record)`` (the record as ``place`` gets it) says whether the record was dealt with in
    place (the loop goes on) or the exception is to be raised out of the loop."""
    loop = _calls.get((is_async, many))
    if loop is None:
        call = "await fn(v)" if is_async else "fn(v)"
        if many:
            emit = [
                f"    out = {call}",  # a generator function's: an iterator already
                "    wait = place(out, {rec})",
                "    while wait is not None:",
                "        await settle(wait)",
                "        wait = place(out, {rec})",
            ]
        else:
            emit = [
                f"    out = {call}",
                "    if out is not None:",
                "        wait = place((out,), {rec})",
                "        if wait is not None:",
                "            await settle(wait)",
            ]
        tail = [
            "try:",
            *emit,
            "except Exception as exc:",
            "    if not await failed(exc, {rec}):",
            "        raise",
        ]
        # A loop without ``yield``: a coroutine function, not an async generator's.
        compiled: Any = _compile((), tail, ["fn", "place", "settle", "failed"])
        loop = _calls[is_async, many] = compiled
    return loop


def _compile(
    shape: tuple[tuple[str, str], ...],
    tail: list[str] | None = None,
    params: list[str] | None = None,
) -> Loop:
    # ``tail``: what each value that passes the operators meets (default: ``yield v``),
    # with ``params`` of its own.
    params = list(params or [])
    body: list[str] = []
    uses_events = any(kind == EVENTS for kind, _ in shape)
    # The decoded value is stored for the agent (``source.value``: a table's time, the
    # stream's ``current``) after the filters written in as expressions, which cannot read
    # it: a record they drop costs no store.
    store_at = next((n for n, (k, d) in enumerate(shape) if k != FILTER or not d), len(shape))
    for n, (kind, detail) in enumerate(shape):
        if n == store_at:
            body.append("source.value = v")
        if kind in (FILTER, MAP) and detail:  # an inlined lambda: its expression
            expr = detail
            if "{c}" in expr:
                params.append(f"c{n}")
                expr = expr.replace("{c}", f"c{n}")
            body += [f"if not ({expr}):", "    continue"] if kind == FILTER else [f"v = {expr}"]
        elif kind == FILTER:
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
            missing, _, key = detail.partition(" ")
            body.append(f"match = get{n}({key or f'on{n}(v)'}, SKIP)")
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
    if store_at == len(shape):
        body.append("source.value = v")
    lines = [*body, *(tail or ["yield v"])]
    uses_m = uses_events or any(kind == ECHO for kind, _ in shape)
    events = "        event = batch.topic.event\n" if uses_events else ""
    src = f"""
async def loop(source, {", ".join(["SKIP", *params])}):
    next_batch = source.next_batch
    begin = source.begin
    refuse = source.refuse
    finish = source.finish
    while True:
        batch = source.batch
        if batch is None:
            batch = await next_batch()
            if batch is None:
                return
        messages = batch.messages
        decode = batch.decode
{events}        # The walk is the cursor's iterator: source.pos() reads it when someone asks.
        if messages.__class__ is not RawMessages:
            for m in begin(messages):
{_record("m.value", "m", [], lines)}
        else:
            # A client's own records: the value read through the client, and a Message
            # made only where one is used (batch.messages[i] makes it for everyone else).
            value_of = messages.value_of
            convert = messages.convert
            for r in begin(messages.raw):
{_record("value_of(r)", "r", ["m = convert(r)"] if uses_m else [], lines)}
        finish(batch)
"""
    what = " ".join(k for k, _ in shape) or ("per record" if tail else "plain")
    filename = f"<flowkit stream loop {next(_serial)}: {what}>"
    # Registered like dataclasses' generated methods, so tracebacks show the lines.
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    namespace: dict[str, Any] = {"RawMessages": RawMessages}
    exec(compile(src, filename, "exec"), namespace)
    fn: Loop = namespace["loop"]
    return fn


def _record(value: str, rec: str, made: list[str], lines: list[str]) -> str:
    # The body of the loop over a batch: decode the record's ``value``, then ``made`` (the
    # record's Message where the operators use it), then the operators and the tail, whose
    # ``{rec}`` is the name of the record as the batch holds it.
    head = f"""\
# Decoded here, one record at a time, not for the whole batch up front: the
# object is fresh in the cache when the agent reads it.
try:
    v = decode({value})
except Exception as exc:
    # The agent never sees a record that does not decode: the worker dead-letters
    # it here and the loop goes on, so the agent is not restarted for it.
    await refuse(batch.topic.decode_error(exc))
    continue"""
    body = [*head.splitlines(), *made, *(line.replace("{rec}", rec) for line in lines)]
    return "\n".join(" " * 16 + line for line in body)


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
