"""Windowed stream-stream joins: the declaration (``declaration.py``) and the per-worker
buffers of both sides (``store.py``), backed by one changelog; on ``rocksdb://`` the buffers
are in a database per partition (``rocks.py``: opening it, and writing it at checkpoints;
``disk.py``: matching over it; ``diskscans.py``: closing windows and expiring records by
scans of its time index; ``diskpart.py``: one partition's buffers and database;
``layout.py``: its keys; ``disktimes.py``: which keys may be on disk)."""

from __future__ import annotations

from .declaration import StreamJoin
from .store import Joined, JoinStore

__all__ = ["JoinStore", "Joined", "StreamJoin"]
