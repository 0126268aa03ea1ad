"""The dataflow graph: the app's declaration as data.

``App.graph()`` (``Graph.build``) turns topics, tables, agents, timers and tasks into
nodes and edges. The worker
runs it, ``flowkit graph`` renders it (``flowkit.rendering``) and ``flowkit graph --check``
validates it with ``Graph.check`` (problems) and ``Graph.warnings`` (likely mistakes).

Node ids are ``"<kind>:<name>"``. The JSON form (``Graph.to_dict``) is versioned:

```
{"version": 1, "app": "shop",
 "nodes": [{"id": "topic:orders", "kind": "topic", "name": "orders", ...}, ...],
 "edges": [{"source": "topic:orders", "target": "agent:enrich", "kind": "reads"}, ...]}
```
"""

from __future__ import annotations

import difflib
import typing
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from types import CodeType
from typing import TYPE_CHECKING, Any

from .agents import Agent, Timer
from .topics import Topic
from .windows import WindowResult

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["GRAPH_VERSION", "Edge", "Graph", "Node"]

GRAPH_VERSION = 1


@dataclass(frozen=True)
class Node:
    """A topic, agent, timer, task or callable sink."""

    id: str
    kind: str
    name: str
    attrs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Edge:
    """``source`` feeds ``target``: an agent reads a topic, or writes a topic or sink."""

    source: str
    target: str
    kind: str  # "reads" | "writes"


@dataclass
class Graph:
    """Nodes and edges of one app, plus the declarations they came from."""

    app: str
    nodes: list[Node] = field(default_factory=list)
    edges: list[Edge] = field(default_factory=list)
    topic_decls: list[Topic[Any]] = field(default_factory=list)
    agents: list[Agent[Any]] = field(default_factory=list)
    tables: list[Any] = field(default_factory=list)
    functions: list[Callable[..., Any]] = field(default_factory=list)  # timers, tasks, hooks

    @classmethod
    def build(
        cls,
        app: str,
        topics: Iterable[Topic[Any]],
        agents: Iterable[Agent[Any]],
        timers: Iterable[Timer],
        tables: Iterable[Any] = (),
        hooks: Iterable[Callable[..., Any]] = (),
    ) -> Graph:
        """The graph of these declarations."""
        timers = list(timers)
        graph = cls(
            app=app,
            topic_decls=list(topics),
            agents=list(agents),
            tables=list(tables),
            functions=[t.fn for t in timers] + list(hooks),
        )
        seen: set[str] = set()
        for topic in graph.topic_decls:
            if topic.name in seen:
                continue
            seen.add(topic.name)
            graph.nodes.append(_topic_node(topic))
        for agent in graph.agents:
            graph.nodes.append(
                Node(
                    f"agent:{agent.name}",
                    "agent",
                    agent.name,
                    {
                        "concurrency": agent.concurrency,
                        "form": agent.form,
                        **(
                            {"on_error": agent.on_error.describe()}
                            if agent.on_error.rules or agent.on_error.default != "dead_letter"
                            else {}
                        ),
                    },
                )
            )
            for topic_name in agent.topic_names:
                graph.edges.append(Edge(f"topic:{topic_name}", f"agent:{agent.name}", "reads"))
            for sink in agent.sinks:
                graph.edges.append(Edge(f"agent:{agent.name}", _sink_id(graph, sink), "writes"))
            for topic in agent.hops.values():  # stream.group_by/through: out, then read back
                graph.edges.append(Edge(f"agent:{agent.name}", f"topic:{topic.name}", "forwards"))
        for agent in graph.agents:
            dlq = agent.dead_letter or f"{app}-dlq"
            if graph.node(f"topic:{dlq}") is None:
                graph.nodes.append(
                    Node(
                        f"topic:{dlq}",
                        "topic",
                        dlq,
                        {
                            "partitions": 1,
                            "key_type": "bytes",
                            "value_type": "dead letters",
                            "codec": "raw",
                            "internal": True,
                            "dead_letter": True,
                        },
                    )
                )
            graph.edges.append(Edge(f"agent:{agent.name}", f"topic:{dlq}", "dead_letters"))
        for table in graph.tables:
            graph._add_table(table)
        for agent in graph.agents:
            used = tables_used_by(agent, graph.tables)
            if agent.join is not None and agent.join not in used:
                used.append(agent.join)  # the join's buffers
            for table in used:
                graph.edges.append(Edge(f"agent:{agent.name}", f"table:{table.name}", "uses"))
        for timer in timers:
            graph.nodes.append(
                Node(
                    f"{timer.kind}:{timer.name}",
                    timer.kind,
                    timer.name,
                    timer.describe(),
                )
            )
        return graph

    def _add_table(self, table: Any) -> None:
        table_id = f"table:{table.name}"
        self.nodes.append(Node(table_id, table.kind, table.name, table.describe()))
        if table.kind == "global_table":
            self.edges.append(Edge(f"topic:{table.topic.name}", table_id, "feeds"))
            return
        changelog = table.changelog_topic
        self.nodes.append(
            Node(
                f"topic:{changelog}",
                "topic",
                changelog,
                {
                    "partitions": table.partitions,
                    "key_type": "bytes",
                    "value_type": "changelog",
                    "codec": "json",
                    "internal": True,
                    "compacted": True,
                },
            )
        )
        self.edges.append(Edge(table_id, f"topic:{changelog}", "changelog"))
        if table.kind == "windowed_table":
            rep = table.repartition_topic
            self.nodes.append(
                Node(
                    f"topic:{rep}",
                    "topic",
                    rep,
                    {
                        "partitions": table.partitions,
                        "key_type": "bytes",
                        "value_type": "partials",
                        "codec": "json",
                        "internal": True,
                    },
                )
            )
            self.edges.append(Edge(table_id, f"topic:{rep}", "partials"))
            self.edges.append(Edge(f"topic:{rep}", table_id, "combines"))
            if table.to is not None:
                self.edges.append(Edge(table_id, f"topic:{table.to.name}", "emits"))

    def node(self, node_id: str) -> Node | None:
        """The node with this id, or None."""
        for node in self.nodes:
            if node.id == node_id:
                return node
        return None

    def check(self) -> list[str]:
        """Problems with the declaration, one line each; an empty list means valid."""
        problems: list[str] = []
        declared = {t.name for t in self.topic_decls}
        for agent in self.agents:
            for topic_name in agent.topic_names:
                if topic_name not in declared:
                    problems.append(
                        f"agent {agent.name!r} reads topic {topic_name!r}, "
                        "which is never declared (app.topic)"
                    )
            for sink in agent.sinks:
                if isinstance(sink, str) and sink not in declared:
                    problems.append(
                        f"agent {agent.name!r} writes topic {sink!r}, "
                        "which is never declared (app.topic)"
                    )
        by_name: dict[str, list[Topic[Any]]] = {}
        for topic in self.topic_decls:
            by_name.setdefault(topic.name, []).append(topic)
        for name, decls in by_name.items():
            kinds = {(t.value_type_name, t.key_type_name, t.partitions) for t in decls}
            if len(kinds) > 1:
                shown = ", ".join(f"{v} (key {k}, {p} partitions)" for v, k, p in sorted(kinds))
                problems.append(f"topic {name!r} is declared with different types: {shown}")
        problems.extend(self._check_tables())
        for agent in self.agents:
            out = agent.output_type()
            if out is None:
                continue
            for sink in agent.sinks:
                target = self._topic_of(sink)
                if target is None or target.value_type is Any:
                    continue
                if not _assignable(out, target.value_type):
                    problems.append(
                        f"agent {agent.name!r} yields {_name(out)} but writes topic "
                        f"{target.name!r} whose readers expect {target.value_type_name}"
                    )
        return problems

    def codec_checks(self) -> list[tuple[str, Callable[[], list[str]]]]:
        """The ``verify`` of each topic codec that has one (a Schema Registry format's),
        once per codec, with the topic's name: what ``check_codecs`` runs."""
        checks: list[tuple[str, Callable[[], list[str]]]] = []
        seen: set[int] = set()
        for topic in self.topic_decls:
            for codec in (topic.value_codec, topic.key_codec):
                verify = getattr(codec, "verify", None)
                if verify is not None and id(codec) not in seen:
                    seen.add(id(codec))
                    checks.append((topic.name, verify))
        return checks

    def check_codecs(self) -> list[str]:
        """Problems the topics' codecs find outside the app, one line each: a Schema
        Registry subject whose registered schema the topic's type is not compatible with.

        Unlike ``check`` this does I/O (it blocks): a worker runs it at start, in a thread,
        and ``flowkit graph --check`` runs it too. A codec without ``verify`` has nothing
        to check.
        """
        return [
            f"topic {name!r}: {line}" for name, verify in self.codec_checks() for line in verify()
        ]

    def warnings(self) -> list[str]:
        """Likely mistakes, one line each: a topic written that nothing reads, or read that
        nothing writes, unless declared ``external`` (another service reads or writes it).

        A misspelt topic name shows this way (an agent writes ``big_orders``, another reads
        ``big-orders``), so each line names the nearest declared name. A topic that an
        agent, timer, task or hook refers to in its code (``topic.send``, or its name in a
        string, as in ``Output(..., to="audit")``) counts as written and read: what the
        code does with it is not known here. So does a global table's topic: reference
        data, written by whoever owns it.
        """
        topics = [t for t in _unique(self.topic_decls) if not t.internal]
        readers: dict[str, list[str]] = {}
        writers: dict[str, list[str]] = {}
        for agent in self.agents:
            for name in agent.topic_names:
                readers.setdefault(name, []).append(f"agent {agent.name!r}")
            for sink in agent.sinks:
                target = self._topic_of(sink)
                if target is not None:
                    writers.setdefault(target.name, []).append(f"agent {agent.name!r}")
        for table in self.tables:
            if getattr(table, "to", None) is not None:
                writers.setdefault(table.to.name, []).append(f"table {table.name!r}")
        functions = [a.fn for a in self.agents] + self.functions
        used = {id(t) for fn in functions for t in referenced_by(fn, topics)}
        used_names = {t.name for t in topics if id(t) in used}
        # A topic named in the code as a string (``Output(..., to="audit")``) is used too.
        used_names.update(_strings_in(functions) & {t.name for t in topics})
        # A global table's topic is reference data, kept by whoever owns it (or its loader).
        used_names.update(t.topic.name for t in self.tables if t.kind == "global_table")
        found: list[str] = []
        for topic in topics:
            name = topic.name
            if topic.external or name in used_names or (name in readers) == (name in writers):
                continue
            if name in writers:
                what, by, others, role = "written", writers[name], readers, "reads"
                tail = "nothing in the app reads it"
            else:
                what, by, others, role = "read", readers[name], writers, "writes"
                tail = "nothing in the app writes it"
            near = difflib.get_close_matches(name, [n for n in others if n != name], 1, 0.75)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            found.append(
                f"topic {name!r} is {what} by {', '.join(by)} but {tail}{hint}; if another "
                f"service {role} it, declare it with app.topic({name!r}, ..., external=True)"
            )
        return found

    def _check_tables(self) -> list[str]:
        problems: list[str] = []
        by_name = {t.name: t for t in self.topic_decls}
        for table in self.tables:
            problems.extend(_check_window_output(table))
            if table.kind == "stream_join":
                problems.extend(table.problems())
            spec = getattr(table, "spec", None)
            if spec is not None and spec.expires_ms >= _NEVER_MS:
                problems.append(
                    f"windowed table {table.name!r} never expires its windows: "
                    "its state grows for ever (give expires= a number of seconds)"
                )
        for agent in self.agents:
            tables = [
                t
                for t in tables_used_by(agent, self.tables)
                if t.kind not in ("global_table", "stream_join")
            ]
            # With a hop, the agent's loop sees only the records read back from its topic.
            reads = [t.name for t in agent.hops.values()] if agent.hops else agent.topic_names
            for topic_name in reads:
                source = by_name.get(topic_name)
                if source is None:
                    continue
                for table in tables:
                    if table.partitions != source.partitions:
                        problems.append(
                            f"agent {agent.name!r} reads {source.name!r} ({source.partitions} "
                            f"partitions) and uses table {table.name!r} ({table.partitions} "
                            "partitions): they must be co-partitioned (same partition count)"
                        )
        return problems

    def _topic_of(self, sink: Any) -> Topic[Any] | None:
        if isinstance(sink, Topic):
            return sink
        if isinstance(sink, Agent):
            return sink.topic if isinstance(sink.topic, Topic) else None
        if isinstance(sink, str):
            for t in self.topic_decls:
                if t.name == sink:
                    return t
        return None

    def to_dict(self) -> dict[str, Any]:
        """The stable JSON-ready form (see the module docstring)."""
        return {
            "version": GRAPH_VERSION,
            "app": self.app,
            "nodes": [{"id": n.id, "kind": n.kind, "name": n.name, **n.attrs} for n in self.nodes],
            "edges": [{"source": e.source, "target": e.target, "kind": e.kind} for e in self.edges],
        }


_NEVER_MS = 10 * 365 * 24 * 3600 * 1000


def _check_window_output(table: Any) -> list[str]:
    """A windowed table's ``to=`` topic takes what it sends: a ``WindowResult``, or what
    its ``emit=`` function is annotated to return."""
    to = getattr(table, "to", None)
    if to is None or to.value_type is Any:
        return []
    emit = getattr(table, "emit_fn", None)
    if emit is None:
        sends: Any = WindowResult
        fix = "give emit= a function (key, window, value) -> " + to.value_type_name
    else:
        try:
            sends = typing.get_type_hints(emit).get("return")
        except Exception:
            sends = None
        if sends is None:
            return []  # unannotated: checked on each window result instead
        fix = "change emit= or the topic's value_type"
    if _assignable(sends, to.value_type):
        return []
    return [
        f"windowed table {table.name!r} sends {_name(sends)} to topic {to.name!r} whose "
        f"readers expect {to.value_type_name}: {fix}"
    ]


def tables_used_by(agent: Agent[Any], tables: list[Any]) -> list[Any]:
    """The declared tables an agent's code refers to (by global or closure name)."""
    return referenced_by(agent.fn, tables)


def referenced_by(fn: Callable[..., Any], candidates: list[Any]) -> list[Any]:
    """Those of ``candidates`` that ``fn``'s code refers to (by global or closure name)."""
    if not candidates:
        return []
    names: set[str] = set()
    for code in _codes(fn):
        names.update(code.co_names)
        names.update(code.co_freevars)
    found: list[Any] = []
    scope = dict(getattr(fn, "__globals__", {}))
    for cell_name, cell in zip(
        getattr(getattr(fn, "__code__", None), "co_freevars", ()),
        getattr(fn, "__closure__", None) or (),
        strict=False,
    ):
        try:
            scope[cell_name] = cell.cell_contents
        except ValueError:
            continue
    for name in names:
        obj = scope.get(name)
        if (
            obj is not None
            and any(obj is c for c in candidates)
            and all(obj is not f for f in found)
        ):
            found.append(obj)
    return found


def _strings_in(functions: list[Callable[..., Any]]) -> set[str]:
    """The string constants in these functions' code (nested functions included)."""
    return {
        const
        for fn in functions
        for code in _codes(fn)
        for const in code.co_consts
        if isinstance(const, str)
    }


def _codes(fn: Callable[..., Any]) -> Iterator[CodeType]:
    """``fn``'s code object and those of the functions defined in it, at any depth."""
    stack = [fn.__code__] if isinstance(getattr(fn, "__code__", None), CodeType) else []
    while stack:
        code = stack.pop()
        yield code
        stack.extend(c for c in code.co_consts if isinstance(c, CodeType))


def _unique(topics: list[Topic[Any]]) -> list[Topic[Any]]:
    """The first declaration of each topic name."""
    seen: dict[str, Topic[Any]] = {}
    for topic in topics:
        seen.setdefault(topic.name, topic)
    return list(seen.values())


def _topic_node(topic: Topic[Any]) -> Node:
    return Node(
        f"topic:{topic.name}",
        "topic",
        topic.name,
        {
            "partitions": topic.partitions,
            "key_type": topic.key_type_name,
            "value_type": topic.value_type_name,
            "codec": getattr(topic.value_codec, "name", type(topic.value_codec).__name__),
            "internal": topic.internal,
            "compacted": topic.compacted,
            **({"external": True} if topic.external else {}),
        },
    )


def _sink_id(graph: Graph, sink: Any) -> str:
    if isinstance(sink, Topic):
        return f"topic:{sink.name}"
    if isinstance(sink, str):
        return f"topic:{sink}"
    if isinstance(sink, Agent):
        return f"topic:{sink.topic_name}"
    name = getattr(sink, "__qualname__", None) or type(sink).__name__
    node_id = f"sink:{name}"
    if graph.node(node_id) is None:
        graph.nodes.append(Node(node_id, "sink", name, {}))
    return node_id


def _name(tp: Any) -> str:
    return getattr(tp, "__qualname__", None) or repr(tp)


def _assignable(out: Any, expected: Any) -> bool:
    if out is expected or out is Any or out is object or expected is Any:
        return True
    if getattr(out, "__name__", "") == "Output":  # routed outputs carry their own type
        return True
    out = typing.get_origin(out) or out
    expected = typing.get_origin(expected) or expected
    try:
        return isinstance(out, type) and isinstance(expected, type) and issubclass(out, expected)
    except TypeError:
        return True  # a generic alias we cannot compare: not a provable mismatch
