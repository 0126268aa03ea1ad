"""Transforms: reshape decoded JSON records (dicts), compiled once like filters.

Build a transform in Python, or from a spec read from a config file::

    anonymise = chain(pick("id", "user.id", "country"), hash_field("user.id", salt=b"pepper"))
    same = Transform.from_spec([{"pick": ["id", "user.id", "country"]},
                                {"hash": "user.id", "salt": "pepper"}])

A transform is a callable ``t(value) -> value``: pass it to ``stream.map(t)``. It never
changes its input: it returns a new dict and copies only the dicts on the paths it writes.
A field it needs that is missing raises ``MissingFieldError`` (a ``KeyError``) naming the
path, and a value of the wrong type raises ``TypeError``; inside an agent the record then
goes to the dead-letter topic with that message.

>>> t = chain(pick("id", "user.name"), upper("user.name"))
>>> t({"id": 7, "user": {"name": "ada", "age": 36}, "extra": True})
{'id': 7, 'user': {'name': 'ADA'}}
>>> t({"id": 8})
Traceback (most recent call last):
...
flowkit.errors.MissingFieldError: pick: field 'user.name' is missing
"""

from __future__ import annotations

import copy
import functools
import hashlib
import string
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, cast

import msgspec

from ..errors import ConfigurationError, MissingFieldError
from ._codegen import Codegen
from .paths import MISSING, Path, PathLike, parse_path, path_text, resolve

__all__ = [
    "Literal",
    "Transform",
    "build",
    "chain",
    "drop",
    "hash_field",
    "literal",
    "lower",
    "pick",
    "rename",
    "strip",
    "template",
    "upper",
]


@dataclass(frozen=True, slots=True)
class Literal:
    """A constant in ``build``; made by ``literal(value)``."""

    value: Any

    def __repr__(self) -> str:
        return f"literal({self.value!r})"


def literal(value: Any) -> Literal:
    """A constant for ``build``: ``build({"source": literal("web")})``.

    >>> literal("web")
    literal('web')
    """
    return Literal(value)


# --- the reference semantics, which the generated code falls back to ---------------------


def _missing(step: str, path: Path) -> MissingFieldError:
    return MissingFieldError(f"{step}: field {path_text(path)!r} is missing", path=path)


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


class _Step:
    kind = ""

    def __init__(self, arg: Any, **options: Any) -> None:
        self.arg = arg  # as in a spec
        self.options = {k: v for k, v in options.items() if v is not None}

    def apply(self, value: Any) -> Any:
        raise NotImplementedError

    def emit(self, cg: Codegen, src: str) -> str:
        return f"{cg.const(self.apply)}({src})"  # no faster form: call the reference

    def spec(self) -> Any:
        return {self.kind: self.arg, **self.options}

    def show(self) -> str:
        spread = self.kind in ("pick", "drop")
        args = [repr(a) for a in self.arg] if spread else [repr(self.arg)]
        args += [f"{k}={'<hidden>' if k == 'salt' else repr(v)}" for k, v in self.options.items()]
        return f"{'hash_field' if self.kind == 'hash' else self.kind}({', '.join(args)})"


class _Shape(_Step):
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

    def apply(self, value: Any) -> Any:
        out: dict[str, Any] = {}
        for path, source in _leaves(self.tree):
            if isinstance(source, Literal):
                out = _set(out, path, copy.deepcopy(source.value), self.kind)
                continue
            found = resolve(value, source)
            if found is not MISSING:
                out = _set(out, path, found, self.kind)
            elif self.options.get("missing") != "skip":
                raise _missing(self.kind, source)
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
        return _render(cg, self.sources(cg, src))


def _leaves(tree: dict[Any, Any], at: Path = ()) -> Iterator[tuple[Path, Any]]:
    for key, sub in tree.items():
        yield from _leaves(sub, (*at, key)) if isinstance(sub, dict) else [((*at, key), sub)]


def _render(cg: Codegen, sources: dict[Any, Any]) -> str:
    """A dict display of a tree of sources."""
    items = (
        f"{cg.const(key)}: {sub if isinstance(sub, str) else _render(cg, sub)}"
        for key, sub in sources.items()
    )
    return "{" + ", ".join(items) + "}"


class _Drop(_Step):
    kind = "drop"

    def __init__(self, arg: list[Any]) -> None:
        super().__init__(arg)
        self.paths = [parse_path(p) for p in arg]

    def apply(self, value: Any) -> Any:
        for path in self.paths:
            value = _delete(value, path)
        return value


class _Rename(_Step):
    kind = "rename"

    def __init__(self, arg: dict[str, str]) -> None:
        super().__init__(arg)
        self.pairs = [(parse_path(old), parse_path(new)) for old, new in arg.items()]

    def apply(self, value: Any) -> Any:
        for old, new in self.pairs:
            found = _get(value, old, "rename")
            value = _set(_delete(value, old), new, found, "rename")
        return value


class _Update(_Step):
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


class _Hash(_Update):
    def __init__(self, path: Any, algorithm: str, salt: bytes | str, to: Any) -> None:
        known = isinstance(algorithm, str) and algorithm in hashlib.algorithms_available
        if not known or algorithm.startswith("shake_"):  # shake's hexdigest needs a length
            raise ConfigurationError(f"unknown hash algorithm {algorithm!r}")
        if not isinstance(salt, bytes | str):
            raise ConfigurationError(f"hash: salt must be text or bytes, not {salt!r}")
        # Text in a spec: surrogateescape round-trips any bytes through it.
        self.salt = salt.encode("utf-8", "surrogateescape") if isinstance(salt, str) else salt
        self.new = getattr(hashlib, algorithm, None) or functools.partial(hashlib.new, algorithm)
        text = self.salt.decode("utf-8", "surrogateescape") if salt else None
        default = None if algorithm == "sha256" else algorithm
        super().__init__("hash", path, self.digest, to, algorithm=default, salt=text)

    def digest(self, value: Any) -> str:
        cls = value.__class__
        data = value.encode() if cls is str else value if cls is bytes else _json(value)
        return cast(str, self.new(self.salt + data).hexdigest())

    def value_source(self, cg: Codegen, x: str) -> str:
        # A string (the common case) is hashed inline; anything else through digest().
        data = f"{cg.const(self.salt)} + {x}.encode()" if self.salt else f"{x}.encode()"
        new, digest = cg.const(self.new), cg.const(self.digest)
        return f"({new}({data}).hexdigest() if {x}.__class__ is {cg.const(str)} else {digest}({x}))"


_json: Final = msgspec.json.encode


class _Template(_Step):
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


class _Chain(_Step):
    kind = "chain"

    def __init__(self, steps: Sequence[_Step]) -> None:
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


def _compile(step: _Step) -> Callable[[Any], Any]:
    # One generated function per transform (see the note in _codegen.py): a chain's
    # steps run one after another in it, with no call between them, and a hash or string op
    # right after a pick/build is applied inside its dict display (no copy of the new dict).
    # A missing field or a wrong type raises inside, and the except branch reruns the record
    # through the steps' `apply`, which raises the precise error (or skips, for
    # pick(missing="skip")).
    cg = Codegen()
    lines: list[str] = []
    src, pending = "v", None
    for s in step.steps if isinstance(step, _Chain) else (step,):
        if pending is not None and isinstance(s, _Update) and s.fuse(cg, pending):
            continue
        if pending is not None:
            lines.append(f"x = {_render(cg, pending)}")
            src, pending = "x", None
        if isinstance(s, _Shape):
            pending = s.sources(cg, src)
        else:
            lines.append(f"x = {s.emit(cg, src)}")
            src = "x"
    if pending is not None:
        lines.append(f"x = {_render(cg, pending)}")
        src = "x"
    return cg.function([*lines, f"return {src}"], step.apply)


class Transform(functools.partial[Any]):
    """A compiled transform: ``t(value) -> new value``. Combine with ``chain``.

    ``t.func`` is the generated function itself: calling it skips the wrapper's call.

    >>> t = Transform.from_spec([{"rename": {"uid": "user.id"}}, {"lower": "user.id"}])
    >>> t, t({"uid": "ADA", "n": 1})
    (chain(rename({'uid': 'user.id'}), lower('user.id')), {'n': 1, 'user': {'id': 'ada'}})
    """

    __slots__ = ("_step",)
    _step: _Step

    def __new__(cls, step: _Step) -> Transform:
        if not isinstance(step, _Step):
            raise TypeError("build transforms with pick(), build(), ... or from_spec()")
        self = super().__new__(cls, _compile(step))
        self._step = step
        return self

    @classmethod
    def from_spec(cls, spec: Any) -> Transform:
        """A transform from its JSON form (a list is a chain); a bad spec raises
        ``ConfigurationError``.

        >>> Transform.from_spec({"pick": ["a"]})({"a": 1, "b": 2})
        {'a': 1}
        >>> Transform.from_spec([{"pick": ["a"]}, {"hash": "a", "algorithm": "nope"}])
        Traceback (most recent call last):
        ...
        flowkit.errors.ConfigurationError: transform[1]: unknown hash algorithm 'nope'
        """
        return cls(_from_spec(spec, "transform"))

    def to_spec(self) -> Any:
        """The JSON form of this transform, as ``from_spec`` reads it."""
        return self._step.spec()

    def __repr__(self) -> str:
        return self._step.show()

    def __reduce__(self) -> Any:
        return (Transform, (self._step,))


def pick(*paths: PathLike, missing: str = "error") -> Transform:
    """A new dict with only these fields, nested as in the input (a shorter path wins).

    A missing field raises ``MissingFieldError``; with ``missing="skip"`` it is left out.

    >>> pick("id", "user.id")({"id": 1, "user": {"id": 2, "name": "x"}, "z": 0})
    {'id': 1, 'user': {'id': 2}}
    """
    if missing not in ("error", "skip"):
        raise ConfigurationError(f"pick: missing must be 'error' or 'skip', not {missing!r}")
    parsed = list(dict.fromkeys(parse_path(p) for p in paths))
    kept = [p for p in parsed if not any(p[: len(q)] == q and p != q for q in parsed)]
    skip = "skip" if missing == "skip" else None
    arg = [path_text(p) for p in parsed]
    return Transform(_Shape("pick", arg, [(p, p) for p in kept], missing=skip))


def build(mapping: Mapping[str, str | Literal | Mapping[str, Any]]) -> Transform:
    """A new dict: each output path gets the input field at a path, or a ``literal``
    (``{"literal": value}`` in a spec).

    >>> build({"who": "user.id", "meta.source": literal("web")})({"user": {"id": 7}})
    {'who': 7, 'meta': {'source': 'web'}}
    """
    items: list[tuple[Path, Path | Literal]] = []
    for out, source in mapping.items():
        if isinstance(source, Mapping) and list(source) == ["literal"]:
            source = Literal(source["literal"])
        elif not isinstance(source, str | Literal):
            raise ConfigurationError(f"build: {out!r} needs a field path or a literal")
        items.append(
            (parse_path(out), source if isinstance(source, Literal) else parse_path(source))
        )
    arg = {
        out: {"literal": src.value} if isinstance(src, Literal) else src
        for out, src in mapping.items()
    }
    return Transform(_Shape("build", arg, items))


def drop(*paths: PathLike) -> Transform:
    """A copy without these fields (a field that is not there is ignored).

    >>> drop("user.email")({"id": 1, "user": {"id": 2, "email": "a@b"}})
    {'id': 1, 'user': {'id': 2}}
    """
    return Transform(_Drop(list(paths)))


def rename(mapping: Mapping[str, str]) -> Transform:
    """A copy with each field moved from its old path to its new one, in order.

    >>> rename({"uid": "user.id"})({"uid": 7, "n": 1})
    {'n': 1, 'user': {'id': 7}}
    """
    return Transform(_Rename(dict(mapping)))


def hash_field(
    path: PathLike, algorithm: str = "sha256", salt: bytes | str = b"", to: PathLike | None = None
) -> Transform:
    """Replace a field (or write ``to``) with the hex digest of ``salt`` + its value.

    A string is hashed as UTF-8, bytes as they are, anything else as its JSON text.

    >>> hash_field("email", algorithm="md5")({"email": "a@b"})
    {'email': 'a1ca0ed6e42a23f4758e8a3f6b54de58'}
    """
    return Transform(_Hash(path, algorithm, salt, to))


def lower(path: PathLike, to: PathLike | None = None) -> Transform:
    """The string field in lower case.

    >>> lower("country")({"country": "NL"})
    {'country': 'nl'}
    """
    return Transform(_Update("lower", path, str.lower, to=to))


def upper(path: PathLike, to: PathLike | None = None) -> Transform:
    """The string field in upper case.

    >>> upper("country")({"country": "nl"})
    {'country': 'NL'}
    """
    return Transform(_Update("upper", path, str.upper, to=to))


def strip(path: PathLike, to: PathLike | None = None) -> Transform:
    """The string field without leading and trailing whitespace.

    >>> strip("name")({"name": "  ada "})
    {'name': 'ada'}
    """
    return Transform(_Update("strip", path, str.strip, to=to))


def template(fmt: str, to: PathLike) -> Transform:
    """Write ``fmt`` with ``{path}`` fields filled in (format specs allowed) to ``to``.

    >>> template("{user.id}-{n:03d}", to="key")({"user": {"id": "u"}, "n": 7})
    {'user': {'id': 'u'}, 'n': 7, 'key': 'u-007'}
    """
    return Transform(_Template(fmt, to))


def chain(*transforms: Transform) -> Transform:
    """The transforms one after another, in one generated function.

    >>> chain(pick("a"), rename({"a": "b"}))({"a": 1, "c": 2})
    {'b': 1}
    """
    steps = [t._step for t in transforms]
    return Transform(_Chain([s for step in steps for s in getattr(step, "steps", (step,))]))


# --- specs -----------------------------------------------------------------------------------

_BUILDERS: Final[dict[str, tuple[Callable[..., Transform], tuple[str, ...]]]] = {
    "pick": (pick, ("missing",)),
    "drop": (drop, ()),
    "rename": (rename, ()),
    "build": (build, ()),
    "hash": (hash_field, ("algorithm", "salt", "to")),
    "lower": (lower, ("to",)),
    "upper": (upper, ("to",)),
    "strip": (strip, ("to",)),
    "template": (template, ("to",)),
    "chain": (chain, ()),
}


def _from_spec(spec: Any, where: str) -> _Step:
    if isinstance(spec, list | tuple):
        spec = {"chain": spec}
    if not isinstance(spec, Mapping):
        raise ConfigurationError(
            f"{where}: expected an object or a list, got {type(spec).__name__}"
        )
    kinds = [key for key in spec if key in _BUILDERS]
    if len(kinds) != 1:
        raise ConfigurationError(f"{where}: expected exactly one of {', '.join(_BUILDERS)}")
    kind, arg = kinds[0], spec[kinds[0]]
    builder, allowed = _BUILDERS[kind]
    options = {key: value for key, value in spec.items() if key != kind}
    for key in options:
        if key not in allowed:
            raise ConfigurationError(f"{where}: unexpected key {key!r} for {kind!r}")
    if kind == "chain":
        if not isinstance(arg, list | tuple):
            raise ConfigurationError(f"{where}.chain: expected a list of transforms")
        return _Chain([_from_spec(s, f"{where}[{i}]") for i, s in enumerate(arg)])
    try:
        if kind in ("pick", "drop"):
            if not isinstance(arg, list | tuple):
                raise ConfigurationError(f"{kind}: expected a list of field paths")
            return builder(*arg, **options)._step
        if kind in ("rename", "build") and not isinstance(arg, Mapping):
            raise ConfigurationError(f"{kind}: expected an object of output: input paths")
        if kind == "template" and "to" not in options:
            raise ConfigurationError("template: needs a format string and a 'to' path")
        return builder(arg, **options)._step
    except ConfigurationError as exc:
        raise ConfigurationError(f"{where}: {exc}") from None
