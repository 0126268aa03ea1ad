"""Find the App named by ``"module:attr"`` (uvicorn's import string, with its messages).

Every failure is one ``AppNotFound`` line that says what to fix; nothing is printed here.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import traceback

from ..app import App
from ..errors import AppNotFound, FlowkitError

__all__ = ["load_app"]

_EXAMPLE = '"module:attribute", e.g. "examples.clickstream:app"'


def load_app(spec: str, *, app_dir: str | None = ".") -> App:
    """The App named by ``spec``: an App instance, or a zero-argument function returning one.

    ``app_dir`` (the current directory by default) goes first on ``sys.path``, as uvicorn
    does, so ``flowkit worker examples.clickstream:app`` works from a project's root.
    """
    module_name, attr_path = _split(spec)
    if app_dir is not None:
        path = os.path.abspath(app_dir)
        if path not in sys.path:
            sys.path.insert(0, path)
    try:
        module = _import(module_name)
    except AppNotFound as exc:
        if module_name.endswith(".py") and str(exc).startswith("could not import"):
            raise AppNotFound(f"{exc}; {_module_not_file(spec)}") from None
        raise
    obj: object = module
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise AppNotFound(
                f"attribute {attr_path!r} not found in module {module_name!r}"
            ) from None
    if isinstance(obj, App):
        return obj
    return _call_factory(spec, obj)


def _split(spec: str) -> tuple[str, str]:
    module_name, sep, attr_path = spec.partition(":")
    valid = (
        sep
        and all(part.isidentifier() for part in module_name.split("."))
        and all(part.isidentifier() for part in attr_path.split("."))
    )
    if not valid:
        if sep and module_name.endswith(".py"):
            raise AppNotFound(f"invalid app {spec!r}: {_module_not_file(spec)}")
        raise AppNotFound(f"invalid app {spec!r}: expected {_EXAMPLE}")
    return module_name, attr_path


def _module_not_file(spec: str) -> str:
    """``name the module, not its file: a.b:app`` for the file path ``a/b.py:app``."""
    path, _, attr_path = spec.partition(":")
    module = path.removesuffix(".py").replace("\\", "/").removeprefix("./").strip("/")
    return f"name the module, not its file: {module.replace('/', '.')}:{attr_path}"


def _import(module_name: str) -> object:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # The module itself (or a package above it) is missing: say so. A missing import
        # *inside* the user's module is their error, reported like any other below.
        missing = exc.name or ""
        if missing == module_name or module_name.startswith(f"{missing}."):
            raise AppNotFound(f"could not import module {module_name!r}: {exc}") from None
        raise AppNotFound(_raised_while(f"importing module {module_name!r}", exc)) from None
    except (Exception, SystemExit) as exc:
        raise AppNotFound(_raised_while(f"importing module {module_name!r}", exc)) from None


def _call_factory(spec: str, obj: object) -> App:
    if isinstance(obj, type) or not callable(obj):
        raise AppNotFound(
            f"{spec!r} is {_a(obj)}, not a flowkit.App "
            "(or a function with no arguments that returns one)"
        )
    if inspect.iscoroutinefunction(obj):
        raise AppNotFound(f"{spec!r} is an async function: an app factory must be a plain def")
    try:
        inspect.signature(obj).bind()
    except TypeError:
        raise AppNotFound(
            f"{spec!r} is a function that needs arguments: an app factory must take none"
        ) from None
    except ValueError:
        pass  # no signature to inspect (a builtin): just call it
    try:
        app = obj()
    except (Exception, SystemExit) as exc:
        raise AppNotFound(_raised_while(f"calling {spec!r}", exc)) from None
    if not isinstance(app, App):
        raise AppNotFound(f"{spec!r} returned {_a(app)}, not a flowkit.App")
    return app


_FLOWKIT = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _raised_while(doing: str, exc: BaseException) -> str:
    """``error while importing module 'x': ValueError: bad (at x.py:3)``, on one line.

    A declaration flowkit refused (a ``FlowkitError``) is its own message, at the user's
    line that made it: ``agent 'a': sink must be ..., not int 42 (at x.py:7)``.
    """
    where = ""
    # The deepest frame outside flowkit: the user's line, not the check that refused it.
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if _theirs(f.filename)]
    # A SyntaxError's message already names the file and line.
    if frames and not (isinstance(exc, SyntaxError) and exc.filename):
        filename = frames[-1].filename
        try:
            filename = os.path.relpath(filename)
        except ValueError:
            pass  # another drive (Windows): keep it absolute
        where = f" (at {filename}:{frames[-1].lineno})"
    message = " ".join(str(exc).split())
    if isinstance(exc, FlowkitError) and message:
        return f"{message}{where}"
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return f"error while {doing}: {text}{where}"


def _theirs(filename: str) -> bool:
    return not os.path.abspath(filename).startswith(_FLOWKIT)


def _a(obj: object) -> str:
    if isinstance(obj, type):
        return f"the class {obj.__qualname__}"
    name = type(obj).__name__
    return f"an {name}" if name[:1].lower() in "aeiou" else f"a {name}"
