"""What a windowed table hands out: closed windows (``on_close``, ``to=``/``emit=``) and late
records (``late=`` a topic or an async callable), delivered by the worker, never per record.

A closed window's delivery that fails (``on_close`` or ``emit`` raises, or ``emit``
returns a value that is not of the ``to`` topic's type) follows the table's ``on_error``:
``"dead_letter"`` (default: the window result goes to the app's dead-letter topic with
headers naming the error, and the other deliveries go on), ``"log"`` (logged and counted
in ``table.callback_errors``) or ``"stop"`` (the worker stops). Late records for an
async callable or a topic wait in the store until the worker's next flush (after every
fetch and before every commit), so a commit never passes a late record not delivered.
"""

from __future__ import annotations

import inspect
import traceback
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import msgspec
import structlog

from ...records import Message
from ...topics import Topic
from ...windows import Window, WindowResult

if TYPE_CHECKING:
    from .store import WindowedStore
    from .table import WindowedTable

__all__ = ["EMIT_ON", "ON_ERROR", "Late", "deliver_closed", "deliver_late"]

log = structlog.get_logger(__name__)

ON_ERROR = ("dead_letter", "log", "stop")
EMIT_ON = ("close", "update")

Send = Callable[..., Awaitable[Any]]
Late = tuple[Any, Window, Any, "Message | None"]
"""(key, window, amount, the late record or None) of a late add, waiting for delivery."""

_ENCODE = msgspec.json.Encoder()


def result_of(
    table: WindowedTable[Any, Any], key: Any, window: Window, value: Any, final: bool = True
) -> Any:
    """The record the ``to`` topic gets for one key of a window: its final value, or a
    running one (``final`` false, with ``emit_on="update"``)."""
    if table.emit_fn is None:
        return WindowResult(key=key, start=window.start, end=window.end, value=value, final=final)
    if table.emit_on == "update":
        out = table.emit_fn(key, window, value, final)
    else:
        out = table.emit_fn(key, window, value)
    to = table.to
    expected = None if to is None else to.value_type
    if isinstance(expected, type) and expected is not object and not isinstance(out, expected):
        raise TypeError(
            f"table {table.name!r}: emit returned {type(out).__qualname__}, but topic "
            f"{to.name!r} takes {to.value_type_name}"  # type: ignore[union-attr]
        )
    return out


REPLAYED = (("flowkit.replayed", b"true"),)
"""The header of a ``to=`` result that a restart emits again."""


async def deliver_closed(
    table: WindowedTable[Any, Any],
    store: WindowedStore,
    emissions: list[tuple[Any, Window, Any]],
    send: Send,
    dlq: str,
    *,
    final: bool = True,
    replayed: bool = False,
) -> None:
    """Each key of each closed window (``final``) to ``on_close``, ``on_update`` and the
    ``to`` topic; or each running update (not ``final``) to ``on_update`` and ``to``;
    ``replayed``: an earlier run emitted them (marked for ``on_close`` and ``to``)."""
    to = table.to
    on_update = table.on_update
    headers = REPLAYED if replayed else ()
    for key, window, value in emissions:
        if on_update is not None:
            try:
                result = on_update(key, window, value, final)
                if inspect.isawaitable(result):
                    await result
            except Exception as exc:  # the result still goes to `to=` below
                await _failed(table, store, key, window, value, exc, send, dlq)
        if final and table.on_close is not None:
            try:
                on_close: Callable[..., Any] = table.on_close
                if table.on_close_replayed:
                    result = on_close(key, window, value, replayed=replayed)
                else:
                    result = on_close(key, window, value)
                if inspect.isawaitable(result):
                    await result
            except Exception as exc:  # the result still goes to `to=` below
                await _failed(table, store, key, window, value, exc, send, dlq)
        if to is not None:
            try:
                out = result_of(table, key, window, value, final)
            except Exception as exc:
                await _failed(table, store, key, window, value, exc, send, dlq)
                continue
            await send(
                to.name,
                to.encode(out),
                key=to.encode_key(key) if not isinstance(key, bytes) else key,
                headers=headers,
            )


async def _failed(
    table: WindowedTable[Any, Any],
    store: WindowedStore,
    key: Any,
    window: Window,
    value: Any,
    exc: Exception,
    send: Send,
    dlq: str,
) -> None:
    store.callback_errors += 1
    log.error(
        "window result failed",
        table=table.name,
        key=key,
        window_start=window.start,
        value=value,
        action=table.on_error,
        error=repr(exc),
    )
    if table.on_error == "stop":
        raise exc
    if table.on_error == "log":
        return
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    headers = (
        ("flowkit.error.type", type(exc).__name__.encode()),
        ("flowkit.error.message", str(exc).encode()[:4096]),
        ("flowkit.error.stage", b"window_close"),
        ("flowkit.error.traceback", tb.encode()[-4096:]),
        ("flowkit.table", table.name.encode()),
        ("flowkit.window.start", str(window.start).encode()),
        ("flowkit.window.end", str(window.end).encode()),
    )
    result = WindowResult(key=key, start=window.start, end=window.end, value=value)
    await send(dlq, _ENCODE.encode(result), key=_ENCODE.encode(key), headers=headers)


async def deliver_late(table: WindowedTable[Any, Any], store: WindowedStore, send: Send) -> None:
    """Late records waiting in ``store`` to the ``late`` topic or async callable."""
    waiting, store.late_out = store.late_out, []
    late = table.late
    for i, (key, window, amount, message) in enumerate(waiting):
        try:
            if isinstance(late, Topic):
                if message is None:
                    continue  # _late only defers records of an agent
                await send(
                    late.name,
                    message.value,
                    key=message.key,
                    headers=(
                        *message.headers,
                        ("flowkit.table", table.name.encode()),
                        ("flowkit.window.start", str(window.start).encode()),
                    ),
                    timestamp_ms=message.timestamp,
                )
                continue
            try:
                await late(key, window, amount)  # type: ignore[operator]
            except Exception as exc:  # the user's callback: logged and counted, not fatal
                store.callback_errors += 1
                log.error("late callback failed", table=table.name, key=key, error=repr(exc))
        except BaseException:
            store.late_out[:0] = waiting[i:]  # a failed send or a cancel: delivered later
            raise
