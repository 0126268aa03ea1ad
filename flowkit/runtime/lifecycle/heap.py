"""The objects a worker starts with are kept out of the cycle collector's way while it runs.

CPython's full collections walk every tracked object of the process: the modules, the
app's declaration, the clients, and whatever the program made before the worker. A
worker allocates container objects by the batch (the client's records, outputs waiting
for their acks), so some of them outlive two young collections and are promoted: every
few hundred thousand records that triggers a full collection, which walked ~40 ms of
that start-up heap each time on the Kafka router benchmark (``benchmarks.router_kafka``:
three a 100,000 orders, about 1.2 µs an order, more than the hand-written loop's whole
collector cost). ``gc.freeze()`` moves what exists once the worker has started into a
generation that collections skip; ``gc.unfreeze()`` gives it back when the last worker of
the process stops, so garbage from before the worker is collected then rather than never.

Nothing is lost by it: objects made while the worker runs are collected as before, and the
objects frozen are the ones that live as long as the worker anyway.
"""

from __future__ import annotations

import gc

__all__ = ["release", "retain"]

_running = [0]  # workers of this process between retain() and release()


def retain() -> None:
    """A worker has started: freeze what exists now (again, if another worker runs too:
    what it made since is long-lived as well)."""
    _running[0] += 1
    gc.freeze()


def release() -> None:
    """A worker has stopped: the last one gives the frozen objects back to the collector."""
    if _running[0] <= 0:
        return
    _running[0] -= 1
    if not _running[0]:
        gc.unfreeze()
