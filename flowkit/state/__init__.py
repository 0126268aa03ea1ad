"""Tables and their state: declarations (``tables.py``, ``windowed/``), the per-worker
stores that hold their contents (``stores.py``, ``windowed/store.py``)."""

from __future__ import annotations

from .base import TableBase
from .joins import Joined, JoinStore, StreamJoin
from .stores import GlobalStore, TableStore
from .tables import GlobalTable, Table
from .windowed import (
    SessionStore,
    SessionTable,
    SlidingStore,
    SlidingTable,
    WindowedStore,
    WindowedTable,
    WindowSet,
)

__all__ = [
    "GlobalStore",
    "GlobalTable",
    "JoinStore",
    "Joined",
    "SessionStore",
    "SessionTable",
    "SlidingStore",
    "SlidingTable",
    "StreamJoin",
    "Table",
    "TableBase",
    "TableStore",
    "WindowSet",
    "WindowedStore",
    "WindowedTable",
]
