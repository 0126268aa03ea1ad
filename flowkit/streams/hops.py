"""Hops: inside an agent, the stream sent through another topic and read back from it.

Two operators make the hop, on one mechanism:

- ``stream.group_by(key, name="by-x")`` goes through the internal topic
  ``<app>-by-x-repartition``, each value keyed by ``key(value)``;
- ``stream.through(topic)`` goes through a declared topic, each value with its record's
  own key and headers (Faust's ``through``).

Either way the agent reads one more topic: the hop's. Each value of its own topics (after
the operators before the hop) is sent to the hop topic with the record's timestamp; it is
not handed to the agent. The values that come back from the hop topic, on the partitions
this instance owns, are: so the rest of the loop sees records partitioned as the hop topic
is (by the new key for ``group_by``; for ``through``, by the record key over the hop
topic's own partition count).

The worker subscribes to the hop topic before it runs, so hops are found when the agent
is declared (``found_hops``: the calls written in the agent's body, with ``group_by``'s
``name=`` a string literal and ``through``'s topic a name the agent's module or closure
defines, or a string literal), the way ``flowkit graph`` finds the tables an agent uses.
At-least-once: a source record's offset is committed only after its forward is
acknowledged, so a crash may forward a record twice.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from .. import arguments
from ..errors import DefinitionError, NotRunningError
from ..topics import Repartition, Topic
from ._loop import ECHO, FILTER, MAP, SKIP, interpreted

if TYPE_CHECKING:
    from .source import StreamSource

__all__ = ["GROUP_BY", "HOP", "THROUGH", "Hop", "agent_hops", "found_hops", "hop"]

HOP = "hop"  # the operator kind, in a stream's chain
GROUP_BY = "group_by"
THROUGH = "through"
# What may come before each hop: group_by's topic carries the agent topic's own values,
# through's topic its own type, so a map may shape the values it gets.
_BEFORE = {GROUP_BY: (FILTER,), THROUGH: (FILTER, MAP)}
_MISSING: Any = object()


class Hop(NamedTuple):
    """One hop in a stream's chain: ``kind`` (``group_by`` or ``through``), ``name`` (the
    group's name, or the topic's) and ``key`` (group_by's new key; None: the record's)."""

    kind: str
    name: str
    key: Callable[[Any], Any] | None = None

    @property
    def ref(self) -> tuple[str, str]:
        """The hop's entry in the agent's ``hops``."""
        return (self.kind, self.name)


@dataclass
class Found:
    """The hops written in an agent's body."""

    # name -> partitions, as written (checked by agent_hops)
    groups: dict[str, Any] = field(default_factory=dict)
    throughs: list[tuple[Any, str]] = field(default_factory=list)  # (topic or name, text)

    def __bool__(self) -> bool:
        return bool(self.groups or self.throughs)


def found_hops(fn: Callable[..., Any]) -> Found:
    """The ``group_by(..., name="literal", partitions=N)`` and ``through(topic)`` calls in
    ``fn``'s own body. A ``through`` argument is resolved in ``fn``'s globals and closure:
    the object it names (``_MISSING`` if none), or the string literal."""
    found = Found()
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return found
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    if not defs:
        return found
    # The body only: a decorator's ``topic.group_by(...)`` is the topic form, not this one.
    body = ast.Module(body=defs[0].body, type_ignores=[])
    for node in ast.walk(body):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr == GROUP_BY:
            kw = {k.arg: k.value for k in node.keywords if k.arg is not None}
            name, partitions = kw.get("name"), kw.get("partitions")
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                found.groups[name.value] = _literal(partitions)
        elif node.func.attr == THROUGH:
            args = [*node.args, *(k.value for k in node.keywords if k.arg == "topic")]
            if len(args) == 1:
                found.throughs.append((_resolve(args[0], fn), ast.unparse(args[0])))
    return found


def _literal(node: ast.expr | None) -> Any:
    """The value a literal (``4``, ``-2``, ``"4"``) writes; None for anything else."""
    if node is None:
        return None
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None  # a name or an expression: known only when the agent runs


def _resolve(node: ast.expr, fn: Callable[..., Any]) -> Any:
    """What ``node`` (a literal, a name or a dotted name) is in ``fn``'s scope."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Attribute):
        base = _resolve(node.value, fn)
        return _MISSING if base is _MISSING else getattr(base, node.attr, _MISSING)
    if not isinstance(node, ast.Name):
        return _MISSING
    code = getattr(fn, "__code__", None)
    closure = getattr(fn, "__closure__", None) or ()
    cells = dict(zip(getattr(code, "co_freevars", ()), closure, strict=False))
    if node.id in cells:
        try:
            return cells[node.id].cell_contents
        except ValueError:  # assigned after the agent was declared
            return _MISSING
    return getattr(fn, "__globals__", {}).get(node.id, _MISSING)


def agent_hops(
    agent: str,
    fn: Callable[..., Any],
    reads: tuple[Topic[Any] | str, ...],
    declared: Mapping[str, Topic[Any]],
) -> dict[tuple[str, str], Topic[Any]]:
    """The hop topics of an agent named ``agent`` whose body is ``fn`` and which reads
    ``reads``, in an app that declared ``declared`` so far: group_by's repartition topics
    (new, for the app to declare) and through's topics (declared ones)."""
    found = found_hops(fn)
    hops: dict[tuple[str, str], Topic[Any]] = {}
    if found.groups and (len(reads) != 1 or not isinstance(reads[0], Topic)):
        raise DefinitionError(
            f"agent {agent!r}: stream.group_by works in an agent over one declared "
            "topic (use topic.group_by(...) for the others)"
        )
    for group, partitions in found.groups.items():
        source = reads[0]
        assert isinstance(source, Topic)
        what = f"agent {agent!r}: group_by(name={group!r})"
        arguments.name(group, f"{what}: name")
        arguments.optional_count(partitions, f"{what}: partitions")
        repartition = Repartition(
            source, lambda v: v, name=group, partitions=partitions or source.partitions
        )
        if repartition.name in declared:
            raise DefinitionError(
                f"agent {agent!r}: group_by name {group!r} is taken "
                f"(topic {repartition.name!r} exists)"
            )
        hops[(GROUP_BY, group)] = repartition
    own = {t if isinstance(t, str) else t.name for t in reads}
    for target, text in found.throughs:
        topic = _through_topic(agent, target, text, declared)
        if topic.name in own:
            raise DefinitionError(
                f"agent {agent!r}: stream.through({text}) goes back to a topic the agent "
                "reads: every record would be forwarded again and again"
            )
        hops[(THROUGH, topic.name)] = topic
    return hops


def _through_topic(
    agent: str, target: Any, text: str, declared: Mapping[str, Topic[Any]]
) -> Topic[Any]:
    if isinstance(target, Topic) and declared.get(target.name) is not None:
        return target
    if isinstance(target, str) and target in declared:
        return declared[target]
    if isinstance(target, Topic | str):
        name = target if isinstance(target, str) else target.name
        why = f"no topic {name!r} is declared in this app before the agent"
    elif target is _MISSING:
        why = f"{text!r} is not a name the agent's module or closure defines yet"
    else:
        why = f"{text!r} is a {type(target).__name__}, not a topic"
    raise DefinitionError(
        f"agent {agent!r}: stream.through({text}): {why} (pass a topic declared with "
        "app.topic() above the agent, or its name as a string literal)"
    )


def split(ops: tuple[tuple[str, Any], ...]) -> tuple[Hop, tuple[Any, ...], tuple[Any, ...]]:
    """(the hop, the operators before it, the operators after it)."""
    for i, (kind, arg) in enumerate(ops):
        if kind == HOP:
            before, after = ops[:i], ops[i + 1 :]
            if any(k == HOP for k, _ in after):
                raise DefinitionError(
                    "a stream hops once: one group_by or through per chain "
                    "(hop again in another agent)"
                )
            if any(k == ECHO for k, _ in after):
                raise DefinitionError(
                    f"echo() cannot come after {arg.kind}(): send the copies in the loop body"
                )
            allowed = _BEFORE[arg.kind]
            if any(k not in allowed for k, _ in before):
                raise DefinitionError(
                    "group_by re-sends the topic's own values: only filter() may come "
                    "before it (put map, join and events after it)"
                    if arg.kind == GROUP_BY
                    else "through() sends values to its topic: only filter() and map() may "
                    "come before it (put join and events after it)"
                )
            return arg, before, after
    raise ValueError("no group_by or through in this chain")


async def hop(source: StreamSource, ops: tuple[tuple[str, Any], ...]) -> AsyncIterator[Any]:
    """The values of ``source`` sent through the hop topic and read back (see above)."""
    step, before, after = split(ops)
    topic: Topic[Any] | None = source.hops.get(step.ref)
    if topic is None:
        raise DefinitionError(
            (
                f"group_by(name={step.name!r}) was not seen when the agent was declared: "
                "write the call in the agent's own body, with name= a string literal"
            )
            if step.kind == GROUP_BY
            else (
                f"through({step.name!r}) was not seen when the agent was declared: write "
                "the call in the agent's own body, naming a module-level topic or a "
                "string literal"
            )
        )
    if source.sender is None:
        raise NotRunningError(f"{step.kind} {step.name!r}: this worker has no producer yet")
    send = source.sender.send_bytes
    pre = interpreted(before) if before else None
    post = interpreted(after) if after else None
    name, encode, encode_key, key_fn = topic.name, topic.encode, topic.encode_key, step.key
    while True:
        batch = source.batch
        if batch is None:
            batch = await source.next_batch()
            if batch is None:
                return
        messages = batch.messages
        # Back from the hop topic: the agent's values. By name: the batch's topic object
        # is the route's, which may be another declaration of the same topic.
        home = batch.tp.topic == name
        decode = batch.decode
        i = source.pos() + 1
        n = len(messages)
        while i < n:
            source.at(batch, i)
            m = messages[i]
            i += 1
            try:
                v = source.value = decode(m.value)
            except Exception as exc:
                # Dead-lettered where it was found, as the compiled loop does: the agent
                # is not started again (and its local state lost) for a record.
                await source.refuse(batch.topic.decode_error(exc))
                continue
            if home:
                if post is not None:
                    v = post(v, batch.topic, m)
                    if v is SKIP:
                        continue
                yield v
                continue
            if pre is not None:
                v = pre(v, batch.topic, m)
                if v is SKIP:
                    continue
            if key_fn is None:  # through: the record as it is, but the value
                await send(name, encode(v), key=m.key, headers=m.headers, timestamp_ms=m.timestamp)
            else:
                await send(name, encode(v), key=encode_key(key_fn(v)), timestamp_ms=m.timestamp)
        # Sent on (not home): the agent reads them from the hop topic.
        source.finish(batch, passed=not home)
