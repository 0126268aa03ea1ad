"""The simplest filter and map lambdas, written into the compiled stream loop.

``stream.filter(lambda v: v.event_type == "view")`` costs a Python call per record (about
400 instructions, more than the test itself) when the loop calls the lambda. A lambda of
one of these exact forms is instead written into the loop as the expression it computes::

    lambda v: v.a.b                      # any chain of attributes
    lambda v: v.a.b <op> CONSTANT        # op: == != < <= > >= is, is not, in, not in

A join's key function, ``on="a"`` (an ``operator.attrgetter``) or ``lambda v: v.a``, is
written in as ``v.a`` the same way (``key_form``).

It is recognised from its bytecode (``dis``), not from its source text: one argument, no
closure, no defaults read, and exactly the instructions of that form, else the loop calls
the function as before. Only the attribute names (identifiers, from the code object) and
the operator (from a fixed table) are written into the loop's source; the constant is passed
in as an argument, as the functions are. The expression computes what the lambda computes,
in the same order, so the results and the exceptions are the same; only a traceback shows
the loop's line instead of the lambda's.
"""

from __future__ import annotations

import dis
import inspect
import keyword
import operator
import types
import weakref
from typing import Any

__all__ = ["NO_CONSTANT", "inline_form", "key_form"]

NO_CONSTANT: Any = object()

_known: weakref.WeakKeyDictionary[types.CodeType, tuple[str, Any] | None]
_known = weakref.WeakKeyDictionary()
_COMPARE = {"==", "!=", "<", "<=", ">", ">="}
_IGNORED = {"RESUME", "NOP", "CACHE", "EXTENDED_ARG"}
_NOT_PLAIN = (
    inspect.CO_VARARGS
    | inspect.CO_VARKEYWORDS
    | inspect.CO_GENERATOR
    | inspect.CO_COROUTINE
    | inspect.CO_ASYNC_GENERATOR
    | inspect.CO_ITERABLE_COROUTINE
)


def inline_form(fn: Any) -> tuple[str, Any] | None:
    """``(expression, constant)`` for a lambda of an inlinable form, else None.

    The expression reads the value as ``v`` and the constant as ``{c}``, for example
    ``("v.event_type == {c}", "view")``; ``constant`` is ``NO_CONSTANT`` for ``v.a.b``.
    """
    if type(fn) is not types.FunctionType:
        return None
    code = fn.__code__
    # Read once per code object: an agent started again after each failed record would
    # otherwise disassemble its lambdas each time.
    try:
        return _known[code]
    except KeyError:
        form = _known[code] = _read(code)
        return form


def _read(code: types.CodeType) -> tuple[str, Any] | None:
    if (
        code.co_argcount != 1
        or code.co_kwonlyargcount
        or code.co_flags & _NOT_PLAIN
        or code.co_freevars
        or code.co_cellvars
    ):
        return None
    ops = [i for i in dis.get_instructions(code) if i.opname not in _IGNORED]
    arg = code.co_varnames[0]
    if len(ops) < 3 or ops[0].opname != "LOAD_FAST" or ops[0].argval != arg:
        return None
    if ops[-1].opname != "RETURN_VALUE":
        return None
    n = 1
    attrs: list[str] = []
    while n < len(ops) and ops[n].opname == "LOAD_ATTR":
        name = ops[n].argval
        if not _plain(name):
            return None
        attrs.append(name)
        n += 1
    if not attrs:
        return None
    read = "v." + ".".join(attrs)
    rest = ops[n:-1]
    if not rest:
        return read, NO_CONSTANT
    if len(rest) != 2 or rest[0].opname != "LOAD_CONST":
        return None
    op = _operator(rest[1])
    if op is None:
        return None
    return f"{read} {op} {{c}}", rest[0].argval


def key_form(on: Any) -> str | None:
    """``v.a.b`` for a key function that reads a chain of attributes, else None."""
    if type(on) is operator.attrgetter:
        names = on.__reduce__()[1]
        if len(names) != 1 or not isinstance(names[0], str):
            return None
        attrs = names[0].split(".")
        if all(_plain(name) for name in attrs):
            return "v." + ".".join(attrs)
        return None
    form = inline_form(on)
    return form[0] if form is not None and form[1] is NO_CONSTANT else None


def _plain(name: object) -> bool:
    return isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name)


def _operator(ins: dis.Instruction) -> str | None:
    if ins.opname == "COMPARE_OP":
        return ins.argval if ins.argval in _COMPARE else None
    if ins.opname == "IS_OP" and ins.arg in (0, 1):
        return "is not" if ins.arg else "is"
    if ins.opname == "CONTAINS_OP" and ins.arg in (0, 1):
        return "not in" if ins.arg else "in"
    return None
