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
flowkit.transforms.MissingFieldError: pick: field 'user.name' is missing
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

from .errors import ConfigurationError
from .filters import MISSING, Codegen, Path, parse_path, path_text, resolve

__all__ = [
    "Literal",
    "MissingFieldError",
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

PathLike = str | Sequence[str | int]


class MissingFieldError(KeyError):
    """A field that a transform needs is missing (or is not a dict/list on the way)."""

    def __init__(self, step: str, path: Path) -> None:
        super().__init__(f"{step}: field {path_text(path)!r} is missing")
        self.path = path

    def __str__(self) -> str:
        return str(self.args[0])


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


# --- the reference semantics: what the generated code falls back to -------------------------


def _get(value: Any, path: Path, step: str) -> Any:
    found = resolve(value, path)
    if found is MISSING:
        raise MissingFieldError(step, path)
    return found


def _set(value: Any, path: Path, new: Any, step: str, depth: int = 0) -> Any:
    """A copy of ``value`` with ``new`` at ``path``; missing dicts on the way are created."""
    key = path[depth]
    if isinstance(value, dict):
        inner = value.get(key, {}) if depth + 1 < len(path) else None
    elif isinstance(value, list) and isinstance(key, int):
        if not -len(value) <= key < len(value):
            raise MissingFieldError(step, path[: depth + 1])
        inner = value[key] if depth + 1 < len(path) else None
    else:
        where = path_text(path[:depth]) if depth else "the record"
        raise TypeError(
            f"{step}: cannot set {path_text(path)!r}: {where} is a {type(value).__name__}"
        )
    out = copy.copy(value)
    out[key] = new if depth + 1 == len(path) else _set(inner, path, new, step, depth + 1)
    return out


def _delete(value: Any, path: Path) -> Any:
    """A copy of ``value`` without ``path``, or ``value`` itself when there is nothing there."""
    key, rest = path[0], path[1:]
    if isinstance(value, dict) and key in value:
        out = dict(value)
    elif isinstance(value, list) and isinstance(key, int) and -len(value) <= key < len(value):
        out = list(value)  # type: ignore[assignment]
    else:
        return value
    if rest:
        out[key] = _delete(value[key], rest)
    else:
        del out[key]
    return out


def _tree(paths: Sequence[Path], step: str) -> dict[Any, Any]:
    """Output paths as nested dicts of keys, leaves None; a shorter path wins."""
    tree: dict[Any, Any] = {}
    for path in paths:
        if any(isinstance(key, int) for key in path):
            raise ConfigurationError(f"{step}: output path {path_text(path)!r} has a list index")
        node = tree
        for key in path[:-1]:
            node = node.setdefault(key, {})
            if node is None:
                break
        else:
            node[path[-1]] = None
    return tree


def _sources(tree: dict[Any, Any], leaf: Callable[[Path], str], at: Path = ()) -> dict[Any, Any]:
    """``tree`` with the source of each value (from ``leaf``) at its leaves."""
    return {
        key: leaf((*at, key)) if sub is None else _sources(sub, leaf, (*at, key))
        for key, sub in tree.items()
    }


def _render(cg: Codegen, sources: dict[Any, Any]) -> str:
    """A dict display of a tree of sources."""
    items = (
        f"{cg.const(key)}: {sub if isinstance(sub, str) else _render(cg, sub)}"
        for key, sub in sources.items()
    )
    return "{" + ", ".join(items) + "}"


def _put(cg: Codegen, src: str, path: Path, value: str) -> str | None:
    """Source for a copy of ``src`` with ``value`` at ``path`` (dicts only, else None)."""
    if any(isinstance(key, int) for key in path):
        return None
    key = cg.const(path[0])
    inner = value if len(path) == 1 else _put(cg, f"{src}[{key}]", path[1:], value)
    return f"{{**{src}, {key}: {inner}}}"


# --- steps: each knows its reference `apply`, its generated source, its spec and repr -----


class _Step:
    name = "step"

    def apply(self, value: Any) -> Any:
        raise NotImplementedError

    def emit(self, cg: Codegen, src: str) -> str:
        return f"{cg.const(self.apply)}({src})"  # no faster form: call the reference

    def spec(self) -> Any:
        raise NotImplementedError

    def show(self) -> str:
        raise NotImplementedError


class _Pick(_Step):
    name = "pick"

    def __init__(self, paths: tuple[Path, ...], missing: str) -> None:
        if missing not in ("error", "skip"):
            raise ConfigurationError(f"pick: missing must be 'error' or 'skip', not {missing!r}")
        self.paths, self.missing, self.tree = paths, missing, _tree(paths, "pick")
        self.leaves = tuple(_leaves(self.tree))  # a shorter path wins over a longer one

    def apply(self, value: Any) -> Any:
        out: dict[str, Any] = {}
        for path in self.leaves:
            found = resolve(value, path)
            if found is not MISSING:
                out = _set(out, path, found, "pick")
            elif self.missing == "error":
                raise MissingFieldError("pick", path)
        return out

    def sources(self, cg: Codegen, src: str) -> dict[Any, Any]:
        return _sources(self.tree, lambda path: cg.access(src, path))

    def emit(self, cg: Codegen, src: str) -> str:
        return _render(cg, self.sources(cg, src))

    def spec(self) -> Any:
        spec: dict[str, Any] = {"pick": [path_text(p) for p in self.paths]}
        return spec | {"missing": "skip"} if self.missing == "skip" else spec

    def show(self) -> str:
        skip = ", missing='skip'" if self.missing == "skip" else ""
        return f"pick({', '.join(repr(path_text(p)) for p in self.paths)}{skip})"


class _Build(_Step):
    name = "build"

    def __init__(self, items: tuple[tuple[Path, Path | Literal], ...]) -> None:
        self.items, self.tree = items, _tree([out for out, _ in items], "build")
        if len(list(_leaves(self.tree))) != len(items):
            raise ConfigurationError("build: an output path is inside another output path")

    def apply(self, value: Any) -> Any:
        out: dict[str, Any] = {}
        for path, source in self.items:
            new = (
                _literal(source.value)
                if isinstance(source, Literal)
                else _get(value, source, "build")
            )
            out = _set(out, path, new, "build")
        return out

    def sources(self, cg: Codegen, src: str) -> dict[Any, Any]:
        by_path = dict(self.items)

        def leaf(path: Path) -> str:
            source = by_path[path]
            if isinstance(source, Literal):
                return f"{cg.const(_literal)}({cg.const(source.value)})"
            return cg.access(src, source)

        return _sources(self.tree, leaf)

    def emit(self, cg: Codegen, src: str) -> str:
        return _render(cg, self.sources(cg, src))

    def spec(self) -> Any:
        return {"build": {_key_text(out): _source_spec(src) for out, src in self.items}}

    def show(self) -> str:
        items = (f"{_key_text(out)!r}: {_source_show(src)}" for out, src in self.items)
        return f"build({{{', '.join(items)}}})"


def _leaves(tree: dict[Any, Any], at: Path = ()) -> Iterator[Path]:
    for key, sub in tree.items():
        yield from [(*at, key)] if sub is None else _leaves(sub, (*at, key))


def _literal(value: Any) -> Any:
    """A literal for one record: containers are copied, so no two outputs share one."""
    return copy.deepcopy(value) if isinstance(value, dict | list) else value


def _key_text(path: Path) -> str:
    text = path_text(path)
    return text if isinstance(text, str) else ".".join(str(k) for k in text)


def _source_spec(source: Path | Literal) -> Any:
    return {"literal": source.value} if isinstance(source, Literal) else path_text(source)


def _source_show(source: Path | Literal) -> str:
    return repr(source if isinstance(source, Literal) else path_text(source))


class _Drop(_Step):
    name = "drop"

    def __init__(self, paths: tuple[Path, ...]) -> None:
        self.paths = paths

    def apply(self, value: Any) -> Any:
        for path in self.paths:
            value = _delete(value, path)
        return value

    def spec(self) -> Any:
        return {"drop": [path_text(p) for p in self.paths]}

    def show(self) -> str:
        return f"drop({', '.join(repr(path_text(p)) for p in self.paths)})"


class _Rename(_Step):
    name = "rename"

    def __init__(self, pairs: tuple[tuple[Path, Path], ...]) -> None:
        self.pairs = pairs

    def apply(self, value: Any) -> Any:
        for old, new in self.pairs:
            found = _get(value, old, "rename")
            value = _set(_delete(value, old), new, found, "rename")
        return value

    def spec(self) -> Any:
        return {"rename": {_key_text(old): _key_text(new) for old, new in self.pairs}}

    def show(self) -> str:
        items = (f"{_key_text(o)!r}: {_key_text(n)!r}" for o, n in self.pairs)
        return f"rename({{{', '.join(items)}}})"


class _Update(_Step):
    """Writes ``fn(value at path)`` to ``to`` (default: the same path)."""

    def __init__(self, name: str, path: Path, fn: Callable[[Any], Any], to: Path | None) -> None:
        self.name, self.path, self.fn, self.to = name, path, fn, to
        self.options: dict[str, Any] = {}

    def apply(self, value: Any) -> Any:
        found = _get(value, self.path, self.name)
        try:
            new = self.fn(found)
        except (TypeError, AttributeError):
            kind = type(found).__name__
            raise TypeError(f"{self.name}: field {path_text(self.path)!r} is a {kind}") from None
        return _set(value, self.to or self.path, new, self.name)

    def value_source(self, cg: Codegen, x: str) -> str:
        return f"{cg.const(self.fn)}({x})"

    def emit(self, cg: Codegen, src: str) -> str:
        new = self.value_source(cg, cg.access(src, self.path))
        return _put(cg, src, self.to or self.path, new) or super().emit(cg, src)

    def fuse(self, cg: Codegen, sources: dict[Any, Any]) -> bool:
        """Apply this step inside the sources of a pick/build, if it writes in place."""
        if self.to not in (None, self.path):
            return False
        node: Any = sources
        for key in self.path[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        leaf = node.get(self.path[-1]) if isinstance(node, dict) else None
        if not isinstance(leaf, str):
            return False
        node[self.path[-1]] = self.value_source(cg, leaf)
        return True

    def spec(self) -> Any:
        spec = {self.name: path_text(self.path), **self.options}
        return spec | {"to": path_text(self.to)} if self.to else spec

    def show(self) -> str:
        fn = "hash_field" if self.name == "hash" else self.name
        args = [repr(path_text(self.path))]
        args += [f"{k}={'<hidden>' if k == 'salt' else repr(v)}" for k, v in self.options.items()]
        args += [f"to={path_text(self.to)!r}"] if self.to else []
        return f"{fn}({', '.join(args)})"


_NO_HEXDIGEST: Final = ("shake_128", "shake_256")  # their hexdigest needs a length


class _Hash(_Update):
    def __init__(self, path: Path, algorithm: str, salt: bytes, to: Path | None) -> None:
        if algorithm not in hashlib.algorithms_available or algorithm in _NO_HEXDIGEST:
            raise ConfigurationError(f"unknown hash algorithm {algorithm!r}")
        if not isinstance(salt, bytes):
            raise ConfigurationError(f"hash salt must be bytes, not {type(salt).__name__}")
        constructor = getattr(hashlib, algorithm, None)
        self.new = constructor or functools.partial(hashlib.new, algorithm)
        self.salt = salt
        super().__init__("hash", path, self.digest, to)
        self.options = {"algorithm": algorithm} if algorithm != "sha256" else {}
        if salt:  # text in a spec; surrogateescape round-trips any bytes
            self.options["salt"] = salt.decode("utf-8", "surrogateescape")

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
    name = "template"

    def __init__(self, fmt: str, to: Path) -> None:
        self.fmt, self.to, self.paths, self.pattern = fmt, to, *_parse_template(fmt)

    def apply(self, value: Any) -> Any:
        found = [_get(value, path, "template") for path in self.paths]
        return _set(value, self.to, self.pattern.format(*found), "template")

    def emit(self, cg: Codegen, src: str) -> str:
        args = ", ".join(cg.access(src, p) for p in self.paths)
        return _put(cg, src, self.to, f"{cg.const(self.pattern)}.format({args})") or super().emit(
            cg, src
        )

    def spec(self) -> Any:
        return {"template": self.fmt, "to": path_text(self.to)}

    def show(self) -> str:
        return f"template({self.fmt!r}, to={path_text(self.to)!r})"


def _parse_template(fmt: str) -> tuple[tuple[Path, ...], str]:
    """``"{user.id}-{n:03d}"`` -> the paths, and ``"{}-{:03d}"`` to format them with."""
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
    name = "chain"

    def __init__(self, steps: tuple[_Step, ...]) -> None:
        self.steps = steps

    def apply(self, value: Any) -> Any:
        for step in self.steps:
            value = step.apply(value)
        return value

    def spec(self) -> Any:
        return {"chain": [step.spec() for step in self.steps]}

    def show(self) -> str:
        return f"chain({', '.join(step.show() for step in self.steps)})"


def _compile(step: _Step) -> Callable[[Any], Any]:
    # One generated function per transform (see the note in flowkit.filters): a chain's
    # steps run one after another in it, with no call between them, and a hash or string op
    # right after a pick/build is applied inside its dict display (no copy of the new dict).
    # A missing field or a wrong type raises inside, and the except branch reruns the record
    # through the steps' `apply`, which raises the precise error (or, for pick with
    # missing="skip", skips).
    cg = Codegen()
    lines: list[str] = []
    src, pending = "v", None
    for s in step.steps if isinstance(step, _Chain) else (step,):
        if pending is not None and isinstance(s, _Update) and s.fuse(cg, pending):
            continue
        if pending is not None:
            lines.append(f"x = {_render(cg, pending)}")
            src, pending = "x", None
        if isinstance(s, _Pick | _Build):
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

    ``t.func`` is the generated function itself, a few ns cheaper per call than ``t``.

    >>> t = Transform.from_spec([{"rename": {"uid": "user.id"}}, {"lower": "user.id"}])
    >>> t, t({"uid": "ADA", "n": 1})
    (chain(rename({'uid': 'user.id'}), lower('user.id')), {'n': 1, 'user': {'id': 'ada'}})
    """

    __slots__ = ("_step",)
    _step: _Step

    def __new__(cls, step: _Step) -> Transform:
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
    """A new dict with only these fields, nested as in the input.

    A missing field raises ``MissingFieldError``; with ``missing="skip"`` it is left out.

    >>> pick("id", "user.id")({"id": 1, "user": {"id": 2, "name": "x"}, "z": 0})
    {'id': 1, 'user': {'id': 2}}
    """
    return Transform(_Pick(tuple(parse_path(p) for p in paths), missing))


def drop(*paths: PathLike) -> Transform:
    """A copy without these fields (a field that is not there is ignored).

    >>> drop("user.email")({"id": 1, "user": {"id": 2, "email": "a@b"}})
    {'id': 1, 'user': {'id': 2}}
    """
    return Transform(_Drop(tuple(parse_path(p) for p in paths)))


def rename(mapping: Mapping[str, str]) -> Transform:
    """A copy with each field moved from its old path to its new one, in order.

    >>> rename({"uid": "user.id"})({"uid": 7, "n": 1})
    {'n': 1, 'user': {'id': 7}}
    """
    return Transform(_Rename(tuple((parse_path(o), parse_path(n)) for o, n in mapping.items())))


def build(mapping: Mapping[str, str | Literal]) -> Transform:
    """A new dict: each output path gets the input field at a path, or a ``literal``.

    >>> build({"who": "user.id", "meta.source": literal("web")})({"user": {"id": 7}})
    {'who': 7, 'meta': {'source': 'web'}}
    """
    items = tuple(
        (parse_path(out), src if isinstance(src, Literal) else parse_path(src))
        for out, src in mapping.items()
    )
    return Transform(_Build(items))


def hash_field(
    path: PathLike, algorithm: str = "sha256", salt: bytes = b"", to: PathLike | None = None
) -> Transform:
    """Replace a field (or write ``to``) with the hex digest of ``salt`` + its value.

    A string is hashed as UTF-8, bytes as they are, anything else as its JSON text.

    >>> hash_field("email", algorithm="md5")({"email": "a@b"})
    {'email': 'a1ca0ed6e42a23f4758e8a3f6b54de58'}
    """
    return Transform(_Hash(parse_path(path), algorithm, salt, _opt_path(to)))


def lower(path: PathLike, to: PathLike | None = None) -> Transform:
    """The string field in lower case.

    >>> lower("country")({"country": "NL"})
    {'country': 'nl'}
    """
    return Transform(_Update("lower", parse_path(path), str.lower, _opt_path(to)))


def upper(path: PathLike, to: PathLike | None = None) -> Transform:
    """The string field in upper case.

    >>> upper("country")({"country": "nl"})
    {'country': 'NL'}
    """
    return Transform(_Update("upper", parse_path(path), str.upper, _opt_path(to)))


def strip(path: PathLike, to: PathLike | None = None) -> Transform:
    """The string field without leading and trailing whitespace.

    >>> strip("name")({"name": "  ada "})
    {'name': 'ada'}
    """
    return Transform(_Update("strip", parse_path(path), str.strip, _opt_path(to)))


def template(fmt: str, to: PathLike) -> Transform:
    """Write ``fmt`` with ``{path}`` fields filled in (format specs allowed) to ``to``.

    >>> template("{user.id}-{n:03d}", to="key")({"user": {"id": "u"}, "n": 7})
    {'user': {'id': 'u'}, 'n': 7, 'key': 'u-007'}
    """
    return Transform(_Template(fmt, parse_path(to)))


def chain(*transforms: Transform) -> Transform:
    """The transforms one after another, in one generated function.

    >>> chain(pick("a"), rename({"a": "b"}))({"a": 1, "c": 2})
    {'b': 1}
    """
    steps: list[_Step] = []
    for t in transforms:
        step = t._step
        steps.extend(step.steps if isinstance(step, _Chain) else (step,))
    return Transform(_Chain(tuple(steps)))


def _opt_path(path: PathLike | None) -> Path | None:
    return None if path is None else parse_path(path)


# --- specs -----------------------------------------------------------------------------------

_KINDS: Final = {
    "pick": ("missing",),
    "drop": (),
    "rename": (),
    "build": (),
    "hash": ("algorithm", "salt", "to"),
    "lower": ("to",),
    "upper": ("to",),
    "strip": ("to",),
    "template": ("to",),
    "chain": (),
}


def _from_spec(spec: Any, where: str) -> _Step:
    if isinstance(spec, list | tuple):
        spec = {"chain": spec}
    if not isinstance(spec, Mapping):
        raise ConfigurationError(
            f"{where}: expected an object or a list, got {type(spec).__name__}"
        )
    kinds = [key for key in spec if key in _KINDS]
    if len(kinds) != 1:
        raise ConfigurationError(f"{where}: expected exactly one of {', '.join(_KINDS)}")
    kind = kinds[0]
    for key in spec:
        if key != kind and key not in _KINDS[kind]:
            raise ConfigurationError(f"{where}: unexpected key {key!r} for {kind!r}")
    arg = spec[kind]
    if kind == "chain":
        if not isinstance(arg, list | tuple):
            raise ConfigurationError(f"{where}.chain: expected a list of transforms")
        return _Chain(tuple(_from_spec(s, f"{where}[{i}]") for i, s in enumerate(arg)))
    try:
        return _step_from_spec(kind, arg, spec)._step
    except ConfigurationError as exc:
        raise ConfigurationError(f"{where}: {exc}") from None


def _step_from_spec(kind: str, arg: Any, spec: Mapping[str, Any]) -> Transform:
    if kind in ("pick", "drop"):
        if not isinstance(arg, list | tuple):
            raise ConfigurationError(f"{kind}: expected a list of field paths")
        made = pick(*arg, missing=spec.get("missing", "error")) if kind == "pick" else drop(*arg)
    elif kind in ("rename", "build"):
        if not isinstance(arg, Mapping):
            raise ConfigurationError(f"{kind}: expected an object of output: input paths")
        if kind == "rename":
            made = rename(arg)
        else:
            made = build({out: _source_from_spec(src) for out, src in arg.items()})
    elif kind == "template":
        if not isinstance(arg, str) or "to" not in spec:
            raise ConfigurationError("template: needs a format string and a 'to' path")
        made = template(arg, spec["to"])
    else:
        made = _update_from_spec(kind, arg, spec)
    return made


def _update_from_spec(kind: str, arg: Any, spec: Mapping[str, Any]) -> Transform:
    to = spec.get("to")
    if kind != "hash":
        return {"lower": lower, "upper": upper, "strip": strip}[kind](arg, to=to)
    salt = spec.get("salt", "")
    if not isinstance(salt, str | bytes):
        raise ConfigurationError("hash: salt must be a string")
    salt_bytes = salt.encode("utf-8", "surrogateescape") if isinstance(salt, str) else salt
    return hash_field(arg, algorithm=spec.get("algorithm", "sha256"), salt=salt_bytes, to=to)


def _source_from_spec(source: Any) -> str | Literal:
    if isinstance(source, Mapping) and set(source) == {"literal"}:
        return Literal(source["literal"])
    if isinstance(source, str):
        return source
    raise ConfigurationError(
        f"build: a value is a field path or {{'literal': ...}}, not {source!r}"
    )
