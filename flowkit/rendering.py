"""Renderers: a ``Graph`` as text, Mermaid, Graphviz dot or JSON.

``flowkit graph module:app --format mermaid`` prints one of these; the web page draws the
JSON form. Node kinds the renderers do not know (tables, windows, ...) are drawn
generically from their kind, name and attributes, so a new kind shows up unchanged.

>>> import flowkit
>>> app = flowkit.App("shop")
>>> orders = app.topic("orders", value_type=int, partitions=2)
>>> @app.agent(orders)
... async def audit(stream):
...     async for order in stream:
...         pass
>>> print(render(app.graph(), "text"))
app shop
├── topics
│   ├── orders (2 partitions, key str, value int)
│   └── shop-dlq (1 partition, key bytes, value dead letters, codec raw, dead_letter, internal)
└── agents
    └── audit
        ├── reads orders
        └── dead_letters shop-dlq
>>> render(app.graph(), "mermaid").splitlines()[0]
'flowchart LR'
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .errors import ConfigurationError
from .graph import Graph, Node

__all__ = ["FORMATS", "render", "render_dot", "render_json", "render_mermaid", "render_text"]

FORMATS = ("text", "mermaid", "dot", "json")

# Kinds drawn first, in this order; any other kind follows in order of appearance.
_KIND_ORDER = ("topic", "agent", "table", "window", "repartition", "dlq", "sink", "timer", "task")

_MERMAID_SHAPES = {
    "topic": ("[(", ")]"),  # cylinder: a log
    "agent": ("[", "]"),  # box: code
    "sink": ("[/", "/]"),  # parallelogram: output
    "timer": ("{{", "}}"),  # hexagon: runs by itself
    "task": ("{{", "}}"),
}
_MERMAID_GENERIC = ("(", ")")  # rounded box

_DOT_SHAPES = {  # kind -> (shape, style)
    "topic": ("cylinder", ""),
    "agent": ("box", ""),
    "sink": ("parallelogram", ""),
    "timer": ("hexagon", ""),
    "task": ("hexagon", ""),
}
_DOT_GENERIC = ("box", "rounded")


def render(graph: Graph, fmt: str) -> str:
    """``graph`` in ``fmt`` (one of ``FORMATS``), without a trailing newline."""
    renderer = _RENDERERS.get(fmt)
    if renderer is None:
        raise ConfigurationError(f"unknown graph format {fmt!r}: use {', '.join(FORMATS)}")
    return renderer(graph)


# -- text ---------------------------------------------------------------------------------


def render_text(graph: Graph) -> str:
    """A readable tree: nodes grouped by kind, each with what it reads and writes."""
    nodes = _all_nodes(graph)
    owned: dict[str, list[str]] = {}
    for edge in graph.edges:
        # An edge is told once, by its active end: "X reads T" under X, "X writes T" under X.
        if edge.kind == "reads":
            owned.setdefault(edge.target, []).append(f"reads {_ref(nodes, edge.source)}")
        else:
            owned.setdefault(edge.source, []).append(f"{edge.kind} {_ref(nodes, edge.target)}")
    lines = [f"app {graph.app}"]
    groups = _by_kind(nodes.values())
    for g, (kind, members) in enumerate(groups):
        last_group = g == len(groups) - 1
        lines.append(f"{_branch(last_group)}{_plural(kind)}")
        indent = _indent(last_group)
        for n, node in enumerate(members):
            last_node = n == len(members) - 1
            details = _details(node)
            suffix = f" ({details})" if details else ""
            lines.append(f"{indent}{_branch(last_node)}{node.name}{suffix}")
            children = owned.get(node.id, [])
            inner = indent + _indent(last_node)
            for c, child in enumerate(children):
                lines.append(f"{inner}{_branch(c == len(children) - 1)}{child}")
    return "\n".join(lines)


def _branch(last: bool) -> str:
    return "└── " if last else "├── "


def _indent(last: bool) -> str:
    return "    " if last else "│   "


def _plural(kind: str) -> str:
    return kind if kind.endswith("s") else f"{kind}s"


def _ref(nodes: Mapping[str, Node], node_id: str) -> str:
    node = nodes[node_id]
    name = node.name if node.kind == "topic" else f"{node.kind} {node.name}"
    return f"{name} (undeclared)" if node.attrs.get("undeclared") else name


# -- mermaid ------------------------------------------------------------------------------


def render_mermaid(graph: Graph) -> str:
    """A Mermaid ``flowchart LR``: topics as cylinders, agents as boxes, labelled edges."""
    nodes = _all_nodes(graph)
    ids = {node_id: f"n{i}" for i, node_id in enumerate(nodes)}
    lines = ["flowchart LR", f"    %% app: {_mermaid_comment(graph.app)}"]
    for node_id, node in nodes.items():
        opening, closing = _MERMAID_SHAPES.get(node.kind, _MERMAID_GENERIC)
        label = "<br/>".join(_mermaid_escape(part) for part in _label(node))
        lines.append(f'    {ids[node_id]}{opening}"{label}"{closing}')
    for edge in graph.edges:
        kind = _mermaid_escape(edge.kind)
        lines.append(f'    {ids[edge.source]} -->|"{kind}"| {ids[edge.target]}')
    return "\n".join(lines)


def _mermaid_escape(text: str) -> str:
    # Mermaid labels take HTML entities as "#name;"; escape "#" first so ours survive.
    for char, entity in (
        ("#", "#35;"),
        ('"', "#quot;"),
        ("<", "#lt;"),
        (">", "#gt;"),
        ("`", "#96;"),
        ("\n", " "),
    ):
        text = text.replace(char, entity)
    return text


def _mermaid_comment(text: str) -> str:
    return " ".join(text.split())


# -- dot ----------------------------------------------------------------------------------


def render_dot(graph: Graph) -> str:
    """A Graphviz ``digraph`` (``flowkit graph app --format dot | dot -Tsvg``)."""
    nodes = _all_nodes(graph)
    lines = [
        f"digraph {_dot_quote(graph.app)} {{",
        "    rankdir=LR;",
        '    node [fontname="Helvetica", fontsize=11];',
        '    edge [fontname="Helvetica", fontsize=9];',
    ]
    for node_id, node in nodes.items():
        label = "\\n".join(_dot_escape(part) for part in _label(node))
        shape, style = _DOT_SHAPES.get(node.kind, _DOT_GENERIC)
        if node.attrs.get("undeclared"):
            style = ",".join(filter(None, (style, "dashed")))
        styled = f', style="{style}"' if style else ""
        lines.append(f'    {_dot_quote(node_id)} [label="{label}", shape="{shape}"{styled}];')
    for edge in graph.edges:
        lines.append(
            f"    {_dot_quote(edge.source)} -> {_dot_quote(edge.target)}"
            f" [label={_dot_quote(edge.kind)}];"
        )
    lines.append("}")
    return "\n".join(lines)


def _dot_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _dot_quote(text: str) -> str:
    return f'"{_dot_escape(text)}"'


# -- json ---------------------------------------------------------------------------------


def render_json(graph: Graph) -> str:
    """``Graph.to_dict()`` as JSON: keys sorted, nodes and edges in declaration order."""
    return json.dumps(graph.to_dict(), indent=2, sort_keys=True, default=str)


# -- shared -------------------------------------------------------------------------------


def _all_nodes(graph: Graph) -> dict[str, Node]:
    """The graph's nodes by id, plus a placeholder for each edge end never declared."""
    nodes = {node.id: node for node in graph.nodes}
    for edge in graph.edges:
        for node_id in (edge.source, edge.target):
            if node_id not in nodes:
                kind, _, name = node_id.partition(":")
                nodes[node_id] = Node(node_id, kind, name or kind, {"undeclared": True})
    return nodes


def _by_kind(nodes: Iterable[Node]) -> list[tuple[str, list[Node]]]:
    groups: dict[str, list[Node]] = {}
    for node in nodes:
        groups.setdefault(node.kind, []).append(node)
    known = [k for k in _KIND_ORDER if k in groups]
    others = [k for k in groups if k not in _KIND_ORDER]
    return [(kind, groups[kind]) for kind in known + others]


def _label(node: Node) -> list[str]:
    """A node's label as lines: its name, then its details (or its kind, if unknown)."""
    details = _details(node)
    if node.kind in ("topic", "agent"):
        return [node.name, details] if details else [node.name]
    return [node.name, f"{node.kind}: {details}" if details else node.kind]


def _details(node: Node) -> str:
    attrs = dict(node.attrs)
    parts = _DETAILS.get(node.kind, _no_details)(attrs)
    if attrs.pop("undeclared", False):
        parts.append("undeclared")
    # Whatever a kind's formatter did not use is still shown, so new attributes appear.
    parts.extend(
        f"{key} {value}" if value is not True else key
        for key, value in sorted(attrs.items())
        if value not in (None, False, "", (), [], {})
    )
    return ", ".join(parts)


def _no_details(attrs: dict[str, Any]) -> list[str]:
    return []


def _topic_details(attrs: dict[str, Any]) -> list[str]:
    parts = []
    if "partitions" in attrs:
        count = attrs.pop("partitions")
        parts.append(f"{count} partition{'' if count == 1 else 's'}")
    if "key_type" in attrs:
        parts.append(f"key {attrs.pop('key_type')}")
    if "value_type" in attrs:
        parts.append(f"value {attrs.pop('value_type')}")
    if attrs.get("codec") == "json":
        del attrs["codec"]  # the default: not worth a word
    return parts


def _agent_details(attrs: dict[str, Any]) -> list[str]:
    parts = []
    concurrency = attrs.pop("concurrency", 1)
    if concurrency != 1:
        parts.append(f"concurrency {concurrency}")
    form = attrs.pop("form", "stream")
    if form != "stream":
        parts.append(str(form).replace("_", "-"))
    return parts


def _timer_details(attrs: dict[str, Any]) -> list[str]:
    interval = attrs.pop("interval", None)
    cron = attrs.pop("crontab", None)
    details = [f"every {interval:g} s"] if isinstance(interval, int | float) else []
    if cron is not None:
        details.append(f"cron {cron}")
    if attrs.pop("on_leader", False):
        details.append("on the leader")
    return details


_DETAILS: dict[str, Callable[[dict[str, Any]], list[str]]] = {
    "topic": _topic_details,
    "agent": _agent_details,
    "timer": _timer_details,
}

_RENDERERS: dict[str, Callable[[Graph], str]] = {
    "text": render_text,
    "mermaid": render_mermaid,
    "dot": render_dot,
    "json": render_json,
}
