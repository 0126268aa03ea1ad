"""Windowed stream-stream joins: the declaration (``declaration.py``) and the per-worker
buffers of both sides (``store.py``), backed by one changelog; on ``rocksdb://`` the buffers
are in a database per partition (``rocks.py``: opening and writing it; ``disk.py``: the
join's work over it; ``layout.py``: its keys)."""

from __future__ import annotations

from .declaration import StreamJoin
from .store import Joined, JoinStore

__all__ = ["JoinStore", "Joined", "StreamJoin"]
