"""Runnable flowkit examples: `flowkit worker examples.clickstream:app`."""
