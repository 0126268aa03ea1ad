"""The exactly-once app (``eos_app``) with its table, its windowed table and its join's
buffers on local disk (``rocksdb://``); the data directory is the worker's ``--data-dir``."""

from __future__ import annotations

from tests.kafka.apps.eos_app import make_app

app = make_app("rocksdb://")
