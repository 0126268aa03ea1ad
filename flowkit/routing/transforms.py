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

import functools
from collections.abc import Callable, Mapping
from typing import Any, Final

from ..errors import ConfigurationError
from . import _transform_steps as steps
from ._codegen import Codegen
from ._transform_steps import Literal
from .paths import Path, PathLike, parse_path, path_text

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


def _compile(step: steps.Step) -> Callable[[Any], Any]:
    # One generated function per transform (see the note in _codegen.py): a chain's steps
    # run one after another in it, with no call between them, and a hash or string op right
    # after a pick/build is applied inside its dict display (no copy of the new dict). A
    # missing field or a wrong type raises inside, and the except branch reruns the record
    # through the steps' `apply`, which raises the precise error (or skips, for
    # pick(missing="skip")).
    cg = Codegen("transform")
    lines: list[str] = []
    src, pending = "v", None
    for s in step.steps if isinstance(step, steps.Chain) else (step,):
        if pending is not None and isinstance(s, steps.Update) and s.fuse(cg, pending):
            continue
        if pending is not None:
            lines.append(f"x = {steps.render(cg, pending)}")
            src, pending = "x", None
        if isinstance(s, steps.Shape):
            pending = s.sources(cg, src)
        else:
            lines.append(f"x = {s.emit(cg, src)}")
            src = "x"
    if pending is not None:
        lines.append(f"x = {steps.render(cg, pending)}")
        src = "x"
    return cg.function([*lines, f"return {src}"], step.apply)


class Transform(functools.partial[Any]):
    """A compiled transform: ``t(value) -> new value``. Combine with ``chain``.

    ``t.func`` is the generated function itself: calling it skips the wrapper's call.

    >>> t = Transform.from_spec([{"rename": {"uid": "user.id"}}, {"lower": "user.id"}])
    >>> t, t({"uid": "ADA", "n": 1})
    (chain(rename({'uid': 'user.id'}), lower('user.id')), {'n': 1, 'user': {'id': 'ada'}})
    """

    __slots__ = ("step",)
    step: steps.Step  # what the transform does, as data: ``to_spec`` writes it

    def __new__(cls, step: steps.Step) -> Transform:
        if not isinstance(step, steps.Step):
            raise TypeError("build transforms with pick(), build(), ... or from_spec()")
        self = super().__new__(cls, _compile(step))
        self.step = step
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
        return self.step.spec()

    def __repr__(self) -> str:
        return self.step.show()

    def __reduce__(self) -> Any:
        return (Transform, (self.step,))


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
    return Transform(steps.Shape("pick", arg, [(p, p) for p in kept], missing=skip))


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
    return Transform(steps.Shape("build", arg, items))


def literal(value: Any) -> Literal:
    """A constant for ``build``: ``build({"source": literal("web")})``.

    >>> literal("web")
    literal('web')
    """
    return Literal(value)


def drop(*paths: PathLike) -> Transform:
    """A copy without these fields (a field that is not there is ignored).

    >>> drop("user.email")({"id": 1, "user": {"id": 2, "email": "a@b"}})
    {'id': 1, 'user': {'id': 2}}
    """
    return Transform(steps.Drop(list(paths)))


def rename(mapping: Mapping[str, str]) -> Transform:
    """A copy with each field moved from its old path to its new one, in order.

    >>> rename({"uid": "user.id"})({"uid": 7, "n": 1})
    {'n': 1, 'user': {'id': 7}}
    """
    return Transform(steps.Rename(dict(mapping)))


def hash_field(
    path: PathLike, algorithm: str = "sha256", salt: bytes | str = b"", to: PathLike | None = None
) -> Transform:
    """Replace a field (or write ``to``) with the hex digest of ``salt`` + its value.

    A string is hashed as UTF-8, bytes as they are, anything else as its JSON text.

    >>> hash_field("email", algorithm="md5")({"email": "a@b"})
    {'email': 'a1ca0ed6e42a23f4758e8a3f6b54de58'}
    """
    return Transform(steps.Hash(path, algorithm, salt, to))


def lower(path: PathLike, to: PathLike | None = None) -> Transform:
    """The string field in lower case.

    >>> lower("country")({"country": "NL"})
    {'country': 'nl'}
    """
    return Transform(steps.Update("lower", path, str.lower, to=to))


def upper(path: PathLike, to: PathLike | None = None) -> Transform:
    """The string field in upper case.

    >>> upper("country")({"country": "nl"})
    {'country': 'NL'}
    """
    return Transform(steps.Update("upper", path, str.upper, to=to))


def strip(path: PathLike, to: PathLike | None = None) -> Transform:
    """The string field without leading and trailing whitespace.

    >>> strip("name")({"name": "  ada "})
    {'name': 'ada'}
    """
    return Transform(steps.Update("strip", path, str.strip, to=to))


def template(fmt: str, to: PathLike) -> Transform:
    """Write ``fmt`` with ``{path}`` fields filled in (format specs allowed) to ``to``.

    >>> template("{user.id}-{n:03d}", to="key")({"user": {"id": "u"}, "n": 7})
    {'user': {'id': 'u'}, 'n': 7, 'key': 'u-007'}
    """
    return Transform(steps.Template(fmt, to))


def chain(*transforms: Transform) -> Transform:
    """The transforms one after another, in one generated function.

    >>> chain(pick("a"), rename({"a": "b"}))({"a": 1, "c": 2})
    {'b': 1}
    """
    parts = [t.step for t in transforms]
    return Transform(steps.Chain([s for step in parts for s in getattr(step, "steps", (step,))]))


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


def _from_spec(spec: Any, where: str) -> steps.Step:
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
        return steps.Chain([_from_spec(s, f"{where}[{i}]") for i, s in enumerate(arg)])
    try:
        if kind in ("pick", "drop"):
            if not isinstance(arg, list | tuple):
                raise ConfigurationError(f"{kind}: expected a list of field paths")
            return builder(*arg, **options).step
        if kind in ("rename", "build") and not isinstance(arg, Mapping):
            raise ConfigurationError(f"{kind}: expected an object of output: input paths")
        if kind == "template" and "to" not in options:
            raise ConfigurationError("template: needs a format string and a 'to' path")
        return builder(arg, **options).step
    except ConfigurationError as exc:
        raise ConfigurationError(f"{where}: {exc}") from None
