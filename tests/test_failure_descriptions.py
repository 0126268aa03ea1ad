"""describe_failure: each kind of failure formatted once, and never another's description."""

from __future__ import annotations

from flowkit.deadletter import MAX_TRACEBACK, _described_as, describe_failure, short_traceback


def fresh(error: BaseException) -> tuple[bytes, bytes, bytes]:
    text = str(error)
    return (
        type(error).__name__.encode(),
        text.encode()[:MAX_TRACEBACK],
        short_traceback(error).encode()[-MAX_TRACEBACK:],
    )


def fail(n: int) -> None:
    raise ValueError("same text")


def one() -> None:
    fail(1)


def two() -> None:
    fail(2)


def caught(call: object) -> BaseException:
    try:
        call()  # type: ignore[operator]
    except BaseException as exc:
        return exc
    raise AssertionError("did not raise")


def chained() -> None:
    try:
        fail(0)
    except ValueError as exc:
        raise KeyError("outer") from exc


def in_handling() -> None:
    try:
        fail(0)
    except ValueError:
        raise KeyError("outer")  # noqa: B904 - the context is what is tested


def suppressed() -> None:
    try:
        fail(0)
    except ValueError:
        raise KeyError("outer") from None


def cyclic() -> None:
    a, b = ValueError("a"), KeyError("b")
    try:
        raise a
    except ValueError:
        try:
            raise b
        except KeyError:
            a.__context__ = b
            raise a from None


def test_a_failure_is_described_as_if_formatted_afresh_each_time() -> None:
    for call in (one, two, chained, in_handling, suppressed, cyclic):
        first, second = caught(call), caught(call)
        assert describe_failure(first) == fresh(first)
        assert describe_failure(second) == fresh(second)  # from the cache: still its own


def test_the_same_place_reached_by_another_path_has_its_own_traceback() -> None:
    _described_as.clear()
    a, b = caught(one), caught(two)
    assert describe_failure(a)[2] != describe_failure(b)[2]
    assert b"in two" in describe_failure(b)[2] and b"in one" in describe_failure(a)[2]
    assert len(_described_as) == 2
