"""What the operator's commands share: the app and broker they act on, parsed values.

Each command loads the app, takes the broker URL (``--broker``, ``$FLOWKIT_BROKER``, else
the app's own) and refuses ``memory://``: an embedded broker lives inside one worker
process, so nothing outside it can read or write it.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ..app import App
from ..codecs import DECODE_FAILURES, decode_error_message
from ..errors import ConfigurationError
from ..state import WindowedTable
from ..transports import Transport, parse_broker_url, transport_from_url
from .loader import load_app

__all__ = ["group_topics", "kafka_app", "open_transport", "parse_typed"]


def kafka_app(app: str, broker: str | None, what: str) -> tuple[App, str]:
    """The loaded app and its broker URL; a ``memory://`` broker is a clear error."""
    the_app = load_app(app)
    url = broker or the_app.broker
    parse_broker_url(url)
    if url.startswith("memory://"):
        raise ConfigurationError(
            f"a memory:// broker lives inside one worker process; {what} needs Kafka "
            "(--broker kafka://... or $FLOWKIT_BROKER)"
        )
    return the_app, url


def open_transport(app: App, url: str) -> Transport:
    """The transport to ``url`` with the app's own client settings, as its workers use
    (security settings declared on the App included); a bad one is a
    ``ConfigurationError`` before anything connects."""
    return transport_from_url(url, **app.client_settings_for(url))


def group_topics(app: App) -> list[str]:
    """What the app's consumer group reads: its agents' topics and its windowed tables'
    repartition topics."""
    names = {a.topic if isinstance(a.topic, str) else a.topic.name for a in app.agents}
    names.update(t.repartition_topic for t in app.tables.values() if isinstance(t, WindowedTable))
    return sorted(names)


def parse_typed(text: str, type_: Any, what: str) -> Any:
    """``text`` as a value of ``type_``: as-is for ``str`` and ``bytes``, else JSON
    decoded and validated against the type (a one-line ``ConfigurationError`` if not)."""
    if type_ is str:
        return text
    if type_ is bytes:
        return text.encode()
    try:
        return msgspec.json.decode(text, type=type_)
    except msgspec.ValidationError as exc:
        raise ConfigurationError(f"{what} {text!r} is not a valid {_name(type_)}: {exc}") from None
    except msgspec.DecodeError as exc:
        raise ConfigurationError(f"{what} {text!r} is not JSON: {exc}") from None
    except DECODE_FAILURES as exc:  # nested too deep (RecursionError), ...
        shown = text if len(text) <= 80 else text[:80] + "..."
        raise ConfigurationError(
            f"{what} {shown!r} is not JSON: {decode_error_message(exc)}"
        ) from None


def _name(type_: Any) -> str:
    return getattr(type_, "__name__", None) or repr(type_)
