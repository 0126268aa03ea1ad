"""The filter tree: conditions joined by and/or/not, what they mean, and their spec form.

A ``Filter`` compiles one of these trees; ``evaluate`` is the reference semantics the
generated code falls back to on odd data, and ``from_spec``/``to_spec``/``show`` convert a
tree from and to its JSON spec and its Python repr.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from ..errors import ConfigurationError
from ._codegen import DATA_ERRORS
from .paths import MISSING, Path, parse_path, path_text, resolve

__all__ = [
    "NO_VALUE",
    "OPS",
    "AllOf",
    "AnyOf",
    "Cond",
    "Node",
    "Not",
    "condition",
    "evaluate",
    "from_spec",
    "show",
    "to_spec",
]


@dataclass(frozen=True, slots=True)
class Cond:
    """A test on the field at ``path``: ``op`` (a key of ``OPS``) with ``value``."""

    path: Path
    op: str
    value: Any = None


@dataclass(frozen=True, slots=True)
class AllOf:
    """True when every child is (no children: always true)."""

    children: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class AnyOf:
    """True when at least one child is (no children: never true)."""

    children: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Not:
    """True when the child is false."""

    child: Node


Node = Cond | AllOf | AnyOf | Not
"""A filter tree."""

# op -> (source over the field x and the constant c, the same check as a function)
OPS: Final[dict[str, tuple[str, Callable[[Any, Any], Any]]]] = {
    "==": ("{x} == {c}", operator.eq),
    "!=": ("{x} != {c}", operator.ne),
    "<": ("{x} < {c}", operator.lt),
    "<=": ("{x} <= {c}", operator.le),
    ">": ("{x} > {c}", operator.gt),
    ">=": ("{x} >= {c}", operator.ge),
    "in": ("{x} in {c}", lambda x, c: x in c),
    "contains": ("{c} in {x}", lambda x, c: c in x),
    "startswith": ("{x}.startswith({c})", lambda x, c: x.startswith(c)),
    "endswith": ("{x}.endswith({c})", lambda x, c: x.endswith(c)),
    "exists": ("", lambda x, c: True),  # see filters._emit
    "is_true": ("{x} is True", lambda x, c: x is True),
    "is_false": ("{x} is False", lambda x, c: x is False),
    "is_null": ("{x} is None", lambda x, c: x is None),
}
ALIASES: Final = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_ORDERED: Final = ("<", "<=", ">", ">=")
NO_VALUE: Final = ("exists", "is_true", "is_false", "is_null")


def condition(path: Path, op: str, value: Any = None) -> Cond:
    """A checked condition; a bad op or value raises ConfigurationError."""
    op = ALIASES.get(op, op) if isinstance(op, str) else op
    if op not in OPS:
        raise ConfigurationError(f"unknown op {op!r}; use one of {', '.join(OPS)}")
    if op in _ORDERED and (isinstance(value, bool) or not isinstance(value, int | float | str)):
        raise ConfigurationError(f"op {op!r} compares with a number or a string, not {value!r}")
    if op == "in":
        if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
            raise ConfigurationError(f"op 'in' needs a list of values, not {value!r}")
        items = tuple(value)
        try:
            value = frozenset(items)
        except TypeError:  # unhashable members: a tuple is slower but right
            value = items
    if op in ("startswith", "endswith"):
        value = tuple(value) if isinstance(value, list | tuple) else value
        parts = value if isinstance(value, tuple) else (value,)
        if not parts or not all(isinstance(p, str) for p in parts):
            raise ConfigurationError(f"op {op!r} needs a string or a list of strings")
    return Cond(path, op, value)


def evaluate(node: Node, value: Any) -> bool:
    """The reference semantics; the generated code falls back to it when data is odd."""
    if isinstance(node, Cond):
        x = resolve(value, node.path)
        if x is MISSING:
            return False
        try:
            return bool(OPS[node.op][1](x, node.value))
        except DATA_ERRORS:
            return False
    if isinstance(node, AllOf):
        return all(evaluate(child, value) for child in node.children)
    if isinstance(node, AnyOf):
        return any(evaluate(child, value) for child in node.children)
    return not evaluate(node.child, value)


def from_spec(spec: Any, where: str) -> Node:
    """The tree of a JSON spec; a bad spec raises ConfigurationError naming ``where``."""
    if isinstance(spec, bool):
        return AllOf(()) if spec else AnyOf(())
    if not isinstance(spec, Mapping):
        raise ConfigurationError(f"{where}: expected an object, got {type(spec).__name__}")
    for key, kind in (("and", AllOf), ("or", AnyOf)):
        if key in spec:
            _only(spec, (key,), where)
            items = spec[key]
            if not isinstance(items, list | tuple):
                raise ConfigurationError(f"{where}.{key}: expected a list of conditions")
            return kind(tuple(from_spec(s, f"{where}.{key}[{i}]") for i, s in enumerate(items)))
    if "not" in spec:
        _only(spec, ("not",), where)
        return Not(from_spec(spec["not"], f"{where}.not"))
    if "field" not in spec:
        raise ConfigurationError(f"{where}: expected a key 'field', 'and', 'or' or 'not'")
    _only(spec, ("field", "op", "value"), where)
    if "op" not in spec:
        raise ConfigurationError(f"{where}: missing 'op'")
    op = ALIASES.get(spec["op"], spec["op"]) if isinstance(spec["op"], str) else spec["op"]
    if op in NO_VALUE and "value" in spec:
        raise ConfigurationError(f"{where}: op {op!r} takes no 'value'")
    if op in OPS and op not in NO_VALUE and "value" not in spec:
        raise ConfigurationError(f"{where}: op {op!r} needs a 'value'")
    try:
        return condition(parse_path(spec["field"]), op, spec.get("value"))
    except ConfigurationError as exc:
        raise ConfigurationError(f"{where}: {exc}") from None


def _only(spec: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    for key in spec:
        if key not in allowed:
            raise ConfigurationError(f"{where}: unexpected key {key!r} (allowed: {allowed})")


def to_spec(node: Node) -> Any:
    """The JSON spec of a tree, as ``from_spec`` reads it."""
    if isinstance(node, Cond):
        spec: dict[str, Any] = {"field": path_text(node.path), "op": node.op}
        if node.op not in NO_VALUE:
            value = node.value
            spec["value"] = _listed(value) if isinstance(value, tuple | frozenset) else value
        return spec
    if isinstance(node, AllOf):
        return {"and": [to_spec(c) for c in node.children]}
    if isinstance(node, AnyOf):
        return {"or": [to_spec(c) for c in node.children]}
    return {"not": to_spec(node.child)}


def _listed(values: tuple[Any, ...] | frozenset[Any]) -> list[Any]:
    """``values`` as a list; a set in a fixed order, so its text is the same in every process
    (string hashes, hence set order, differ between interpreters)."""
    if isinstance(values, tuple):
        return list(values)
    return sorted(values, key=repr)


def show(node: Node, inner: bool) -> str:
    """The Python that builds the tree; ``inner`` puts an operand of ``&``/``|``/``~`` in ()."""
    if isinstance(node, Cond):
        f = f"field({path_text(node.path)!r})"
        if node.op in OPS and node.op[0] in "=!<>":
            text = f"{f} {node.op} {node.value!r}"
            return f"({text})" if inner else text
        if node.op in NO_VALUE:
            return f"{f}.{node.op}()"
        value = _listed(node.value) if isinstance(node.value, frozenset) else node.value
        return f"{f}.{'in_' if node.op == 'in' else node.op}({value!r})"
    if isinstance(node, Not):
        return "~" + show(node.child, inner=True)
    name, sign = ("all_of", " & ") if isinstance(node, AllOf) else ("any_of", " | ")
    if len(node.children) < 2:
        return f"{name}({', '.join(show(c, inner=False) for c in node.children)})"
    text = sign.join(show(c, inner=True) for c in node.children)
    return f"({text})" if inner else text
