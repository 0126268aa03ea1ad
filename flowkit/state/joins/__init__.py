"""Windowed stream-stream joins: the declaration (``declaration.py``) and the per-worker
buffers of both sides (``store.py``), backed by one changelog."""

from __future__ import annotations

from .declaration import StreamJoin
from .store import Joined, JoinStore

__all__ = ["JoinStore", "Joined", "StreamJoin"]
