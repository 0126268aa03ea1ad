"""The steps a transform is made of: what each does, and the source it compiles to.

Each step has a reference ``apply`` (the semantics, used when the generated code meets a
missing field or a wrong type), an ``emit`` giving its source for the generated function,
and its spec and repr forms. A transform never changes its input: writes copy the dicts
and lists on their path.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import string
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final, cast

import msgspec

from ..errors import ConfigurationError, MissingFieldError
from ._codegen import NOTHING, Codegen
from .paths import MISSING, Path, parse_path, path_text, resolve

__all__ = [
    "Chain",
    "Drop",
    "Hash",
    "Literal",
    "Rename",
    "Shape",
    "Step",
    "Template",
    "Update",
    "render",
]


@dataclass(frozen=True, slots=True)
class Literal:
    """A constant in ``build``; made by ``literal(value)``."""

    value: Any

    def __repr__(self) -> str:
        return f"literal({self.value!r})"


# --- the reference semantics, which the generated code falls back to ---------------------


def _missing(step: str, path: Path) -> MissingFieldError:
    # A burst of records lacking a field fail at the same few paths: each message is made
    # once, not formatted per record.
    message = _messages.get((step, path))
    if message is None:
        if len(_messages) >= 10_000:
            _messages.clear()
        message = _messages[step, path] = f"{step}: field {path_text(path)!r} is missing"
    return MissingFieldError.at(message, path)


_messages: dict[tuple[str, Path], str] = {}


def _get(value: Any, path: Path, step: str) -> Any:
    found = resolve(value, path)
    if found is MISSING:
        raise _missing(step, path)
    return found


def _set(value: Any, path: Path, new: Any, step: str, depth: int = 0) -> Any:
    """A copy of ``value`` with ``new`` at ``path``; missing dicts on the way are created."""
    key = path[depth]
    if isinstance(value, list) and isinstance(key, int):
        if not -len(value) <= key < len(value):
            raise _missing(step, path[: depth + 1])
    elif not isinstance(value, dict):
        where = repr(path_text(path[:depth])) if depth else "the record"
        kind = type(value).__name__
        raise TypeError(f"{step}: cannot set {path_text(path)!r}: {where} is of type {kind}")
    out = copy.copy(value)
    if depth + 1 == len(path):
        out[key] = new
    else:
        inner = value.get(key, {}) if isinstance(value, dict) else value[key]
        out[key] = _set(inner, path, new, step, depth + 1)
    return out


def _delete(value: Any, path: Path) -> Any:
    """A copy of ``value`` without ``path``, or ``value`` itself when there is nothing there."""
    key, rest = path[0], path[1:]
    if isinstance(value, dict) and key in value:
        out: Any = dict(value)
    elif isinstance(value, list) and isinstance(key, int) and -len(value) <= key < len(value):
        out = list(value)
    else:
        return value
    if rest:
        out[key] = _delete(value[key], rest)
    else:
        del out[key]
    return out


def _put(cg: Codegen, src: str, path: Path, value: str) -> str | None:
    """Source for a copy of ``src`` with ``value`` at ``path`` (dicts only, else None)."""
    if any(isinstance(key, int) for key in path):
        return None
    key = cg.const(path[0])
    inner = value if len(path) == 1 else _put(cg, f"{src}[{key}]", path[1:], value)
    return f"{{**{src}, {key}: {inner}}}"


# --- steps: each has its reference `apply`, generated source, and spec -----------------------


class Step:
    """One step of a transform; ``kind`` is its key in a spec."""

    kind = ""

    def __init__(self, arg: Any, **options: Any) -> None:
        self.arg = arg  # as in a spec
        self.options = {k: v for k, v in options.items() if v is not None}

    def apply(self, value: Any) -> Any:
        """The step on one value, raising the precise error on odd data."""
        raise NotImplementedError

    def emit(self, cg: Codegen, src: str) -> str:
        """Source for the step applied to the value that the source ``src`` stands for."""
        return f"{cg.const(self.apply)}({src})"  # no faster form: call the reference

    def spec(self) -> Any:
        """The step's JSON form, as ``Transform.from_spec`` reads it."""
        return {self.kind: self.arg, **self.options}

    def show(self) -> str:
        """The Python call that builds the step (a salt is hidden)."""
        spread = self.kind in ("pick", "drop")
        args = [repr(a) for a in self.arg] if spread else [repr(self.arg)]
        args += [f"{k}={'<hidden>' if k == 'salt' else repr(v)}" for k, v in self.options.items()]
        return f"{'hash_field' if self.kind == 'hash' else self.kind}({', '.join(args)})"


class Shape(Step):
    """pick and build: a new dict from a tree of output paths, each with its source."""

    def __init__(self, kind: str, arg: Any, items: Sequence[tuple[Path, Any]], **opts: Any) -> None:
        super().__init__(arg, **opts)
        self.kind = kind
        self.tree: dict[Any, Any] = {}
        for out, source in items:
            if any(isinstance(key, int) for key in out):
                raise ConfigurationError(f"{kind}: output path {path_text(out)!r} has a list index")
            node = self.tree
            for key in out[:-1]:
                node = node.setdefault(key, {})
                if not isinstance(node, dict):
                    break
            if not isinstance(node, dict) or out[-1] in node:
                raise ConfigurationError(f"{kind}: output path {path_text(out)!r} overlaps another")
            node[out[-1]] = source
        # Walked once here: `apply` runs for each record the generated code cannot handle.
        self.leaves = list(_leaves(self.tree))
        self._missing_at = (
            _missing_finder(self.leaves) if self.options.get("missing") is None else None
        )

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["_missing_at"]  # generated code does not pickle: made again on loading
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._missing_at = (
            _missing_finder(self.leaves) if self.options.get("missing") is None else None
        )

    def apply(self, value: Any) -> Any:
        find = self._missing_at
        if find is not None:
            # A record of dicts that lacks a source: the error at once, without resolving
            # the sources before it (most of what a failing record cost here).
            source = find(value)
            if source is not None:
                raise _missing(self.kind, source)
        out: dict[Any, Any] = {}
        for path, source in self.leaves:
            if isinstance(source, Literal):
                found = copy.deepcopy(source.value)
            else:
                found = resolve(value, source)
                if found is MISSING:
                    if self.options.get("missing") != "skip":
                        raise _missing(self.kind, source)
                    continue
            # The new dict is this step's own (the tree has no overlaps): filled in place.
            node = out
            for key in path[:-1]:
                node = node.setdefault(key, {})
            node[path[-1]] = found
        return out

    def sources(self, cg: Codegen, src: str, tree: dict[Any, Any] | None = None) -> dict[Any, Any]:
        """The tree, with the source code of each value at its leaves."""
        out: dict[Any, Any] = {}
        for key, sub in (self.tree if tree is None else tree).items():
            if isinstance(sub, dict):
                out[key] = self.sources(cg, src, sub)
            elif isinstance(sub, Literal):  # a container is copied: no two outputs share one
                copied = isinstance(sub.value, dict | list)
                const = cg.const(sub.value)
                out[key] = f"{cg.const(copy.deepcopy)}({const})" if copied else const
            else:
                out[key] = cg.access(src, sub)
        return out

    def emit(self, cg: Codegen, src: str) -> str:
        return render(cg, self.sources(cg, src))


def _missing_finder(leaves: list[tuple[Path, Any]]) -> Callable[[Any], Path | None] | None:
    """A generated ``find(value)``: the first source path (in ``apply``'s order) that a
    record of plain dicts lacks, else None (none is missing, or the record is not all
    dicts: ``apply``'s loop decides). Exact: each container on a path is checked to be a
    ``dict`` before ``.get`` reads it, where ``resolve`` reads a dict the same way. None
    when a source has a list index, or a literal is not a plain JSON scalar (its deep copy
    comes first in ``apply``, and only these surely cannot fail)."""
    cg = Codegen("missing-field check")
    nothing, plain = cg.const(NOTHING), cg.const(dict)
    body = [f"if v.__class__ is not {plain}: return None"]
    for _, source in leaves:
        if isinstance(source, Literal):
            if source.value is not None and source.value.__class__ not in _SCALARS:
                return None
            continue
        if any(not isinstance(key, str) for key in source):
            return None
        found, held = cg.const(source), "v"
        for depth, key in enumerate(source):
            t = cg.local()
            body.append(f"{t} = {held}.get({cg.const(key)}, {nothing})")
            body.append(f"if {t} is {nothing}: return {found}")
            if depth + 1 < len(source):
                body.append(f"if {t}.__class__ is not {plain}: return None")
            held = t
    if len(body) == 1:
        return None
    return cg.function([*body, "return None"], _unknown)


_SCALARS: Final = (str, int, float, bool)


def _unknown(value: Any) -> None:
    return None


def _leaves(tree: dict[Any, Any], at: Path = ()) -> Iterator[tuple[Path, Any]]:
    for key, sub in tree.items():
        yield from _leaves(sub, (*at, key)) if isinstance(sub, dict) else [((*at, key), sub)]


def render(cg: Codegen, sources: dict[Any, Any]) -> str:
    """A dict display of a tree of sources."""
    items = (
        f"{cg.const(key)}: {sub if isinstance(sub, str) else render(cg, sub)}"
        for key, sub in sources.items()
    )
    return "{" + ", ".join(items) + "}"


class Drop(Step):
    """Removes fields (a field that is not there is ignored)."""

    kind = "drop"

    def __init__(self, arg: list[Any]) -> None:
        super().__init__(arg)
        self.paths = [parse_path(p) for p in arg]

    def apply(self, value: Any) -> Any:
        for path in self.paths:
            value = _delete(value, path)
        return value


class Rename(Step):
    """Moves fields from old to new paths, in order."""

    kind = "rename"

    def __init__(self, arg: dict[str, str]) -> None:
        super().__init__(arg)
        self.pairs = [(parse_path(old), parse_path(new)) for old, new in arg.items()]

    def apply(self, value: Any) -> Any:
        for old, new in self.pairs:
            found = _get(value, old, "rename")
            value = _set(_delete(value, old), new, found, "rename")
        return value


class Update(Step):
    """Writes ``fn(value at path)`` to ``to`` (default: the same path)."""

    def __init__(
        self, kind: str, path: Any, fn: Callable[[Any], Any], to: Any = None, **options: Any
    ) -> None:
        self.kind, self.path, self.fn = kind, parse_path(path), fn
        self.to = self.path if to is None else parse_path(to)
        text = None if to is None else path_text(self.to)
        super().__init__(path_text(self.path), **options, to=text)

    def apply(self, value: Any) -> Any:
        found = _get(value, self.path, self.kind)
        try:
            new = self.fn(found)
        except (TypeError, AttributeError):
            kind = type(found).__name__
            message = f"{self.kind}: field {path_text(self.path)!r} is of type {kind}"
            raise TypeError(message) from None
        return _set(value, self.to, new, self.kind)

    def value_source(self, cg: Codegen, x: str) -> str:
        """Source for the new value, given the source ``x`` of the old one."""
        return f"{cg.const(self.fn)}({x})"

    def emit(self, cg: Codegen, src: str) -> str:
        new = self.value_source(cg, cg.access(src, self.path))
        return _put(cg, src, self.to, new) or super().emit(cg, src)

    def fuse(self, cg: Codegen, sources: dict[Any, Any]) -> bool:
        """Apply this step inside the sources of a pick/build, if it writes in place."""
        node: Any = sources
        for key in self.path[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        leaf = node.get(self.path[-1]) if isinstance(node, dict) else None
        if self.to != self.path or not isinstance(leaf, str):
            return False
        node[self.path[-1]] = self.value_source(cg, leaf)
        return True


class Hash(Update):
    """Replaces a field (or writes ``to``) with the hex digest of salt + its value."""

    def __init__(self, path: Any, algorithm: str, salt: bytes | str, to: Any) -> None:
        known = isinstance(algorithm, str) and algorithm in hashlib.algorithms_available
        if not known or algorithm.startswith("shake_"):  # shake's hexdigest needs a length
            raise ConfigurationError(f"unknown hash algorithm {algorithm!r}")
        if not isinstance(salt, bytes | str):
            raise ConfigurationError(f"hash: salt must be text or bytes, not {salt!r}")
        # Text in a spec: surrogateescape round-trips any bytes through it.
        self.salt = salt.encode("utf-8", "surrogateescape") if isinstance(salt, str) else salt
        self.algorithm = algorithm
        self.new = getattr(hashlib, algorithm, None) or functools.partial(hashlib.new, algorithm)
        text = self.salt.decode("utf-8", "surrogateescape") if salt else None
        default = None if algorithm == "sha256" else algorithm
        super().__init__("hash", path, self.digest, to, algorithm=default, salt=text)

    def digest(self, value: Any) -> str:
        """The hex digest: text as UTF-8, bytes as they are, anything else as JSON."""
        cls = value.__class__
        data = value.encode() if cls is str else value if cls is bytes else _json(value)
        return cast(str, self.new(self.salt + data).hexdigest())

    def value_source(self, cg: Codegen, x: str) -> str:
        # A string (the common case) is hashed inline; anything else through digest().
        salted = f"{cg.const(self.salt, '<hidden>')} + " if self.salt else ""
        data = f"{salted}{x}.encode()"
        named = not isinstance(self.new, functools.partial)
        shown = (
            f"hashlib.{self.algorithm}" if named else f"partial(hashlib.new, {self.algorithm!r})"
        )
        new, digest = cg.const(self.new, shown), cg.const(self.digest)
        return f"({new}({data}).hexdigest() if {x}.__class__ is {cg.const(str)} else {digest}({x}))"


_json: Final = msgspec.json.encode


class Template(Step):
    """Writes a format string filled in from fields."""

    kind = "template"

    def __init__(self, fmt: Any, to: Any) -> None:
        super().__init__(fmt, to=to)
        self.to, self.paths, self.pattern = parse_path(to), *_parse_template(fmt)

    def apply(self, value: Any) -> Any:
        found = [_get(value, path, "template") for path in self.paths]
        return _set(value, self.to, self.pattern.format(*found), "template")

    def emit(self, cg: Codegen, src: str) -> str:
        args = ", ".join(cg.access(src, p) for p in self.paths)
        new = f"{cg.const(self.pattern)}.format({args})"
        return _put(cg, src, self.to, new) or super().emit(cg, src)


def _parse_template(fmt: Any) -> tuple[tuple[Path, ...], str]:
    """``"{user.id}-{n:03d}"`` -> the paths, and ``"{}-{:03d}"`` to format them with."""
    if not isinstance(fmt, str):
        raise ConfigurationError(f"template: the format must be a string, not {fmt!r}")
    paths: list[Path] = []
    pattern: list[str] = []
    try:
        for text, name, spec, conversion in string.Formatter().parse(fmt):
            pattern.append(text.replace("{", "{{").replace("}", "}}"))
            if name is None:
                continue
            if not name or name.isdigit():
                raise ConfigurationError(f"template {fmt!r}: name a field in every {{}}")
            if spec and "{" in spec:
                raise ConfigurationError(f"template {fmt!r}: nested {{}} in a format spec")
            paths.append(parse_path(name))
            pattern.append("{" + (f"!{conversion}" if conversion else "") + f":{spec}}}")
    except ValueError as exc:
        raise ConfigurationError(f"template {fmt!r}: {exc}") from None
    return tuple(paths), "".join(pattern)


class Chain(Step):
    """Steps one after another."""

    kind = "chain"

    def __init__(self, steps: Sequence[Step]) -> None:
        super().__init__(None)
        self.steps = tuple(steps)

    def apply(self, value: Any) -> Any:
        for step in self.steps:
            value = step.apply(value)
        return value

    def spec(self) -> Any:
        return {"chain": [step.spec() for step in self.steps]}

    def show(self) -> str:
        return f"chain({', '.join(step.show() for step in self.steps)})"
