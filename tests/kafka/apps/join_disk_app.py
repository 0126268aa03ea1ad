"""The join app (``join_app``) with the join's buffers on local disk (``rocksdb://``); the
data directory is the worker's ``--data-dir``."""

from __future__ import annotations

from tests.kafka.apps.join_app import make_app

app = make_app("rocksdb://")
