"""``python -m flowkit.cli`` is the ``flowkit`` command."""

from __future__ import annotations

from . import main

if __name__ == "__main__":
    main()
