"""Streams: ``Stream`` (what an agent iterates), ``StreamSource`` (the runtime side: the
queued batches and the one read position) and the compiled loop between them."""

from __future__ import annotations

from .batches import Barrier, Batch
from .source import StreamSource
from .stream import Stream

__all__ = ["Barrier", "Batch", "Stream", "StreamSource"]
