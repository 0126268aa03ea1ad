"""Windowed tables: the declaration with its per-record ``add`` (``table.py``), stage 1 per
source partition (``stage1.py``), stage 2 on the owning partition (``owner.py``), one
worker's state of both (``store.py``) and the wire format between them (``wire.py``);
session windows in ``session_*.py`` and sliding windows in ``sliding_*.py``, on the same
two phases."""

from __future__ import annotations

from .owner import Emission
from .session_store import SessionStore
from .session_table import SessionTable
from .sliding_store import SlidingStore
from .sliding_table import SlidingTable
from .store import WindowedStore
from .table import WindowedTable
from .windowset import WindowSet

__all__ = [
    "Emission",
    "SessionStore",
    "SessionTable",
    "SlidingStore",
    "SlidingTable",
    "WindowSet",
    "WindowedStore",
    "WindowedTable",
]
