"""Raises while it is imported."""

import flowkit

app = flowkit.App("boom")
settings: dict[str, str] = {}
port = int(settings["PORT"])
