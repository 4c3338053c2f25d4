"""Working time: a workspace's weekly hours and holidays, and arithmetic on them by intervals.

A workspace's `[working_hours]` (setup) gives each weekday at most one window, `"09:30-18:30"`, in
its time zone; a day left out is closed, and so is a holiday. Without the section the clock runs
around the clock. `add` finds the moment a number of working seconds after a start (a lead's
response due time), `between` counts the working seconds from one moment to another (its first
response time). Both walk the calendar a day at a time, each day one interval, so their cost
follows the number of days spanned, never the number of seconds. Each day's window is placed in
the time zone on that day, so a zone that changes its offset (daylight saving) is right too.

Every moment in and out is a naive UTC datetime, as every column holds it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any, Iterator, Mapping
from zoneinfo import ZoneInfo

WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
WINDOW = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)-([01]\d|2[0-4]):([0-5]\d)$")


def parse_window(text: str) -> tuple[time, time | None]:
    """`"09:30-18:30"` as (start, end); an end of `24:00` (the end of the day) is None. ValueError
    for anything else, or a window that ends before it starts."""
    found = WINDOW.match(text)
    if found is None:
        raise ValueError(f"{text!r} is not a window; write HH:MM-HH:MM, e.g. \"09:30-18:30\".")
    start_h, start_m, end_h, end_m = map(int, found.groups())
    if end_h == 24 and end_m:
        raise ValueError(f"{text!r}: a day ends at 24:00.")
    start, end = time(start_h, start_m), None if end_h == 24 else time(end_h, end_m)
    if end is not None and end <= start:
        raise ValueError(f"{text!r} ends before it starts; a window cannot span midnight.")
    return start, end


@dataclass(frozen=True)
class WorkingHours:
    """Weekly windows (weekday 0 = Monday -> (start, end), end None for midnight) and holidays, in
    a time zone. `always()` is the clock that runs around the clock."""

    zone: ZoneInfo
    windows: Mapping[int, tuple[time, time | None]]
    holidays: frozenset[date] = frozenset()
    around_the_clock: bool = False

    @classmethod
    def always(cls) -> "WorkingHours":
        return cls(zone=ZoneInfo("UTC"), windows={}, around_the_clock=True)

    @classmethod
    def of(cls, setting: Mapping[str, Any] | None, timezone: str) -> "WorkingHours":
        """From a workspace's stored setting ({"mon": "09:30-18:30", ..., "holidays": [...]}, as
        setup checked it), or around the clock without one."""
        if not setting:
            return cls.always()
        windows = {day: parse_window(setting[name]) for day, name in enumerate(WEEKDAYS) if setting.get(name)}
        holidays = frozenset(date.fromisoformat(day) for day in setting.get("holidays", ()))
        return cls(zone=ZoneInfo(timezone), windows=windows, holidays=holidays)

    def add(self, start: datetime, seconds: int) -> datetime:
        """The moment `seconds` of working time after `start`."""
        if self.around_the_clock:
            return start + timedelta(seconds=seconds)
        if not self.windows:   # setup refuses such hours; without this check the walk would never end
            raise ValueError("no working time: no weekday has a window")
        # Holidays are finitely many and every week past them has a window, so the walk ends,
        # however few working hours a week has.
        left = timedelta(seconds=seconds)
        for opens, closes in self._open_intervals(start):
            span = closes - opens
            if left <= span:
                return opens + left
            left -= span
        raise AssertionError("unreachable: the intervals go on without end")

    def between(self, start: datetime, end: datetime) -> int:
        """Working seconds from `start` to `end` (0 if end is not after start)."""
        if end <= start:
            return 0
        if self.around_the_clock:
            return int((end - start).total_seconds())
        total = timedelta()
        for opens, closes in self._open_intervals(start, until=end):
            total += min(closes, end) - opens
        return int(total.total_seconds())

    def _open_intervals(self, start: datetime, until: datetime | None = None) -> Iterator[tuple[datetime, datetime]]:
        """The working intervals (naive UTC) from `start` on, the first cut to begin at `start`,
        day by day until `until` (without it, for ever)."""
        day = start.replace(tzinfo=UTC).astimezone(self.zone).date()
        last = None if until is None else until.replace(tzinfo=UTC).astimezone(self.zone).date()
        while last is None or day <= last:
            window = self.windows.get(day.weekday())
            if window is not None and day not in self.holidays:
                opens, closes = self._utc(day, window[0]), self._utc(day + timedelta(days=1) if window[1] is None
                                                                     else day, window[1] or time.min)
                opens = max(opens, start)
                if until is not None and opens >= until:
                    return
                if closes > opens:
                    yield opens, closes
            day += timedelta(days=1)

    def _utc(self, day: date, at: time) -> datetime:
        return datetime.combine(day, at, tzinfo=self.zone).astimezone(UTC).replace(tzinfo=None)
