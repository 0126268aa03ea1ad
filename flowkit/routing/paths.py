"""Field paths into decoded records: ``"user.age"``, ``"items[0].sku"``, or a list of keys.

A path is parsed once into a tuple of keys (str) and list indexes (int). ``resolve`` reads
it: dicts and lists by subscript, other objects (msgspec Structs) by attribute, and a path
that leads nowhere gives ``MISSING`` instead of raising.

>>> path = parse_path("items[-1].sku")
>>> path, path_text(path), resolve({"items": [{"sku": "A"}, {"sku": "B"}]}, path)
(('items', -1, 'sku'), 'items[-1].sku', 'B')
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any, Final

from ..errors import ConfigurationError

__all__ = ["MISSING", "Path", "PathLike", "parse_path", "path_text", "resolve"]

Path = tuple[str | int, ...]
"""A parsed path: keys (str) and list indexes (int)."""

PathLike = str | Sequence[str | int]
"""A path as users write it: text, or a list of keys and indexes."""


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Final = _Missing()
"""What ``resolve`` returns for a path that leads nowhere."""


_PART = re.compile(r"([^.\[\]]*)((?:\[-?[0-9]+\])*)")
_INDEX = re.compile(r"\[(-?[0-9]+)\]")


def parse_path(path: PathLike) -> Path:
    """Split a field path into keys and list indexes (a list of keys is taken as is).

    >>> parse_path("items[0].sku")
    ('items', 0, 'sku')
    >>> parse_path(["key.with.dots", 2])
    ('key.with.dots', 2)
    """
    if not isinstance(path, str):
        given = tuple(path) if isinstance(path, list | tuple) else ()
        if not given or not all(
            isinstance(k, str | int) and not isinstance(k, bool) for k in given
        ):
            raise ConfigurationError(f"bad field path {path!r}: need keys (str) and indexes (int)")
        return given
    keys: list[str | int] = []
    for i, part in enumerate(path.split(".")):
        match = _PART.fullmatch(part)
        if match is None:
            raise ConfigurationError(f"bad field path {path!r}: use name[0] for a list index")
        name, indexes = match.groups()
        if name:
            keys.append(name)
        elif i > 0 or not indexes:
            raise ConfigurationError(f"bad field path {path!r}: empty name")
        keys.extend(int(n) for n in _INDEX.findall(indexes))
    return tuple(keys)


def path_text(path: Path) -> str | list[str | int]:
    """The path as text when it reads back the same, else as a list of keys."""
    text = _as_text(path)
    return list(path) if text is None else text


@functools.lru_cache(maxsize=1024)  # a failing record names its path: not parsed each time
def _as_text(path: Path) -> str | None:
    text = "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in path).lstrip(".")
    return text if _parse_or_none(text) == path else None


def _parse_or_none(text: str) -> Path | None:
    try:
        return parse_path(text)
    except ConfigurationError:
        return None


def resolve(value: Any, path: Path) -> Any:
    """The value at ``path``, or ``MISSING``; objects without ``[]`` are read by attribute.

    >>> resolve({"a": [{"b": 1}]}, ("a", 0, "b")), resolve({"a": 1}, ("b",))
    (1, MISSING)
    """
    for key in path:
        cls = value.__class__
        if cls is dict:  # decoded JSON: no exception for a miss
            value = value.get(key, MISSING)
        elif isinstance(key, str) and _by_attribute(cls):  # a Struct or other object
            value = MISSING if key[:1] == "_" else getattr(value, key, MISSING)
        else:
            try:
                value = value[key]
            except (LookupError, TypeError):
                return MISSING
        if value is MISSING:
            return MISSING
    return value


_BY_ATTRIBUTE: dict[type, bool] = {}


def _by_attribute(cls: type) -> bool:
    """Whether values of ``cls`` are read by attribute: objects are, JSON values never."""
    known = _BY_ATTRIBUTE.get(cls)
    if known is None:  # cached: hasattr on a class raises and swallows an exception if false
        scalar = issubclass(cls, int | float | complex | type(None))
        known = _BY_ATTRIBUTE[cls] = not scalar and not hasattr(cls, "__getitem__")
    return known
