"""Code generation shared by filters and transforms: source to one fast Python function.

User data never becomes source: ``Codegen.const`` puts a placeholder string in the source,
and the compiled code object gets the real value in its constants. Each generated function
has its own file name, such as ``<flowkit filter 3>``, under which ``linecache`` holds its
source, each line followed by a comment saying what its placeholders stand for, so a
traceback through it shows the line that failed::

    File "<flowkit filter 3>", line 3, in generated
      return True if (v['@0']['@1'] > '@2') else False  # '@0': 'user', '@1': 'age', '@2': 18
"""

from __future__ import annotations

import functools
import itertools
import linecache
import re
import reprlib
import types
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from .paths import Path

__all__ = ["DATA_ERRORS", "EMPTY", "NOTHING", "Codegen"]

# Measured on CPython 3.11 while choosing (a 3-condition AND over decoded dicts): one closure
# per condition costs a Python call per condition (+40-90 ns for a 2-condition AND); one
# generated function whose constants live in closure cells or a globals dict runs 10-25%
# slower than the hand-written lambda; one generated function whose constants are LOAD_CONST
# runs exactly as fast (the same bytecode). So each filter becomes one generated function,
# and no user data is ever put into its source: the source holds only our own tokens and
# placeholder strings ("@3"), it is compiled once per shape (cached), and the placeholders
# among the code object's constants are then swapped for the real keys and values.

_MARK: Final = "@"  # the only string constants in generated code are placeholders
_PLACEHOLDER: Final = re.compile("'" + re.escape(_MARK) + "([0-9]+)'")  # as const() writes it

DATA_ERRORS: Final = (LookupError, TypeError, AttributeError)
"""What odd data raises in generated code; its except branch then takes the slow path."""


class _Nothing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NOTHING"


NOTHING: Final = _Nothing()
"""A missing field in generated code; never seen by users."""

EMPTY: Final[Mapping[Any, Any]] = types.MappingProxyType({})
"""What a missing dict on a path reads as in generated code."""

_files = itertools.count(1)

_shown = reprlib.Repr()  # values named in the source that tracebacks show: long ones cut
_shown.maxstring = _shown.maxother = 60


class Codegen:
    """The source of one generated function; user data goes into ``consts`` only.

    ``kind`` ("filter", "transform") names the function's file in tracebacks.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.consts: list[Any] = []
        self.shown: list[str] = []
        self.names = 0

    def local(self) -> str:
        """A fresh local variable name."""
        self.names += 1
        return f"_t{self.names}"

    def const(self, value: Any, shown: str | None = None) -> str:
        """Source standing for ``value``: a placeholder, swapped for it after compiling.

        A traceback names it as ``shown``: by default the value's repr (shortened), or the
        name of a function or class.
        """
        self.consts.append(value)
        self.shown.append(_show(value) if shown is None else shown)
        return repr(f"{_MARK}{len(self.consts) - 1}")

    def access(self, src: str, path: Path, safe: bool = False) -> str:
        """``src[k1][k2]``; with ``safe``, dict keys are read with ``.get`` (filters._compile)."""
        if not safe:
            return src + "".join(f"[{self.const(key)}]" for key in path)
        last = len(path) - 1
        return src + "".join(
            f"[{self.const(key)}]"
            if isinstance(key, int)
            else f".get({self.const(key)}, {self._missing(i == last)})"
            for i, key in enumerate(path)
        )

    def _missing(self, last: bool) -> str:
        return self.const(NOTHING) if last else self.const(EMPTY, "EMPTY")

    def function(self, body: Sequence[str], fallback: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """``def f(v): try: <body> except DATA_ERRORS: return fallback(v)``."""
        source = _source("\n".join(f"        {line}" for line in body))
        code = _compile(source)
        consts = tuple(self._fill(c) for c in code.co_consts)
        filename = f"<flowkit {self.kind} {next(_files)}>"
        namespace = {"__builtins__": {}, "DATA_ERRORS": DATA_ERRORS, "fallback": fallback}
        # A new file name costs nothing per call: the bytecode and constants are unchanged.
        code = code.replace(co_consts=consts, co_filename=filename)
        function = types.FunctionType(code, namespace)
        lines = [self._annotated(line) for line in source.splitlines(keepends=True)]
        linecache.cache[filename] = (len(source), None, lines, filename)
        weakref.finalize(function, linecache.cache.pop, filename, None)
        return function

    def _annotated(self, line: str) -> str:
        """The line, and a comment with what its placeholders stand for (columns unchanged,
        so a traceback's carets point at the code that failed)."""
        used = dict.fromkeys(int(i) for i in _PLACEHOLDER.findall(line))
        notes = ", ".join(f"'{_MARK}{i}': {self.shown[i]}" for i in used)
        return f"{line.rstrip()}  # {notes}\n" if notes else line

    def _fill(self, const: Any) -> Any:
        if isinstance(const, str) and const.startswith(_MARK):
            return self.consts[int(const[len(_MARK) :])]
        if isinstance(const, tuple):  # dict displays keep their keys in one tuple
            return tuple(self._fill(c) for c in const)
        return const


def _show(value: Any) -> str:
    name = getattr(value, "__qualname__", None) if callable(value) else None
    return name.rpartition("<locals>.")[2] if isinstance(name, str) else _shown.repr(value)


def _source(body: str) -> str:
    return (
        "def generated(v):\n"
        "    try:\n"
        f"{body}\n"
        "    except DATA_ERRORS:\n"
        "        return fallback(v)\n"
    )


@functools.lru_cache(maxsize=512)
def _compile(source: str) -> types.CodeType:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)  # "'str' object is not callable"
        module = compile(source, "<flowkit generated>", "exec")
    return next(c for c in module.co_consts if isinstance(c, types.CodeType))
