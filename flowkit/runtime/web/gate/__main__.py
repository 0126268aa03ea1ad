"""``python -I -S .../flowkit/runtime/web/gate/__main__.py LISTENING_FD CONTROL_FD
MAX_CONNECTIONS MAX_OVERFLOW ANSWER_LIFE``: the gate's process (``process.main``), run as
a script, so that it imports nothing of flowkit (whose package would import all of it) or
of the app."""

from __future__ import annotations

import importlib
import os
import sys
import types

if __name__ == "__main__":
    # A script is no package's module: make this folder the package ``gate`` (without
    # running its ``__init__``), whose modules import each other as usual.
    package = types.ModuleType("gate")
    package.__path__ = [os.path.dirname(os.path.abspath(__file__))]
    sys.modules["gate"] = package
    importlib.import_module("gate.process").main(sys.argv[1:])
