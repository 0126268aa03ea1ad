"""Imports a package that is not installed."""

import flowkit_no_such_dependency  # noqa: F401

import flowkit

app = flowkit.App("missing")
