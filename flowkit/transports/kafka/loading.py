"""Committed offsets while the group coordinator is still loading them.

After a broker restart, Apache Kafka's group coordinator answers an OffsetFetch with a
group-level error (``COORDINATOR_LOAD_IN_PROGRESS``) until it has read its
``__consumer_offsets`` partition, a second or so. aiokafka (0.14) reads only the
per-partition error codes of the answer, which are then empty, so it takes it for "nothing
committed": a worker that joins its group in that second starts over at the earliest record
of every partition, and processes the whole input again. Seen in
tests/kafka/test_broker_loss.py; Tansu never answers so.

``guard`` wraps one consumer's coordinator so that a group-level error of an OffsetFetch
answer is raised as aiokafka raises a partition's: it then retries a retriable one (loading,
another coordinator) after its backoff, and raises the rest. It reads aiokafka's
coordinator from the inside, so ``guard`` does nothing on an aiokafka release it was not
checked against, or whose parts are not there.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import aiokafka
import aiokafka.errors as kerr

__all__ = ["CHECKED_RELEASES", "guard"]

CHECKED_RELEASES = ("0.14.",)


def guard(kafka: Any, *, stable: bool = False) -> bool:
    """Make ``kafka``'s (a started group consumer's) committed-offset fetches raise a
    group-level error instead of reading it as "nothing committed"; False if it cannot.

    ``stable`` (exactly-once): the fetches also wait for offsets a transaction has not
    committed yet (``generations.fetch_stable``)."""
    coordinator: Any = getattr(kafka, "_coordinator", None)
    send = getattr(coordinator, "_send_req", None)
    if (
        not aiokafka.__version__.startswith(CHECKED_RELEASES)
        or send is None
        or not hasattr(coordinator, "coordinator_dead")
    ):
        return False

    stable_fetch: Callable[[Any, Any], Awaitable[Any]] | None = None
    if stable:
        from .generations import fetch_stable as stable_fetch

    async def send_req(request: Any) -> Any:
        if stable_fetch is not None and request.API_KEY == _OFFSET_FETCH:
            response = await stable_fetch(send, request)
        else:
            response = await send(request)
        code = getattr(response, "error_code", 0) if request.API_KEY == _OFFSET_FETCH else 0
        if code:
            error = kerr.for_code(code)
            if error is kerr.NotCoordinatorForGroupError:
                coordinator.coordinator_dead()  # as aiokafka does for a partition's
            raise error()
        return response

    coordinator._send_req = send_req
    return True


_OFFSET_FETCH = 9  # the Kafka protocol's API key of OffsetFetch
