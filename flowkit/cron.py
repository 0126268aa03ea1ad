"""Cron schedules for ``@app.crontab``, computed by croniter (a maintained cron library)
in a time zone, so "at 9:00 in Paris" stays 9:00 across daylight saving changes.

>>> from datetime import datetime, UTC
>>> hourly = Cron("0 * * * *")
>>> start = datetime(2026, 3, 29, 0, 30, tzinfo=UTC).timestamp()
>>> datetime.fromtimestamp(hourly.next_after(start), UTC).isoformat()
'2026-03-29T01:00:00+00:00'
>>> Cron("0 9 * * *", "Europe/Paris")
Cron('0 9 * * *', 'Europe/Paris')
"""

from __future__ import annotations

from datetime import UTC, datetime, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .errors import DefinitionError

__all__ = ["Cron"]


class Cron:
    """A cron expression (``"0 * * * *"``: every hour on the hour) in a time zone.

    ``timezone`` is a ``tzinfo`` or an IANA name (``"Europe/Paris"``); UTC by default.
    """

    def __init__(self, expression: str, timezone: tzinfo | str | None = None) -> None:
        # croniter (with dateutil) loads only when an app declares a crontab: it would
        # add about 5% to every `import flowkit`.
        from croniter import CroniterError, croniter

        if not isinstance(expression, str):
            raise DefinitionError(f"crontab must be a string like '0 * * * *', not {expression!r}")
        try:
            croniter(expression)
        except (CroniterError, ValueError) as exc:
            raise DefinitionError(
                f"crontab {expression!r} is not a cron expression: {exc}"
            ) from None
        self.expression = expression
        self.tz = _zone(timezone)

    def __repr__(self) -> str:
        return f"Cron({self.expression!r}, {self.zone_name!r})"

    @property
    def zone_name(self) -> str:
        """The time zone's name (``"UTC"``, ``"Europe/Paris"``)."""
        return getattr(self.tz, "key", None) or str(self.tz)

    def next_after(self, ts: float) -> float:
        """The first time the schedule fires after ``ts`` (seconds since the epoch)."""
        from croniter import croniter

        start = datetime.fromtimestamp(ts, self.tz)
        nxt: datetime = croniter(self.expression, start).get_next(datetime)
        return nxt.timestamp()


def _zone(timezone: tzinfo | str | None) -> tzinfo:
    if timezone is None:
        return UTC
    if isinstance(timezone, tzinfo):
        return timezone
    if isinstance(timezone, str):
        try:
            return ZoneInfo(timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise DefinitionError(
                f"crontab timezone {timezone!r} is not a known time zone"
            ) from None
    raise DefinitionError(
        f"crontab timezone must be a tzinfo or a name like 'Europe/Paris', not {timezone!r}"
    )
