"""Working time (working_hours.py): `add` and `between` by intervals, across closed hours,
nights, weekends, holidays, a window to midnight and zones that change their offset; the two
agree with each other for any start; and windows setup refuses."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings, strategies as st

from leadsvc.working_hours import WorkingHours, parse_window

# Reproducible in CI: the same examples on every run.
EXAMPLES = settings(max_examples=400, deadline=None, derandomize=True)

WEEKDAYS = {day: "09:30-18:30" for day in ("mon", "tue", "wed", "thu", "fri")}
# An Indian office: weekdays and a Saturday morning, Republic Day (Tue 2027-01-26) and a Monday
# holiday (2027-03-22).
OFFICE = {**WEEKDAYS, "sat": "10:00-14:00", "holidays": ["2027-01-26", "2027-03-22"]}
LONDON_OFFICE = {day: "09:00-17:00" for day in ("mon", "tue", "wed", "thu", "fri")}
# Two windows that meet at midnight: Monday evening to the end of the day, Tuesday's small hours.
TO_MIDNIGHT = {"mon": "20:00-24:00", "tue": "00:00-02:00"}
ONE_HOUR_A_WEEK = {"sun": "09:00-10:00"}
ALL_DAY = {day: "00:00-24:00" for day in ("mon", "tue", "wed", "thu", "fri", "sat", "sun")}


def local(zone: str, *moment: int) -> datetime:
    """A wall-clock time in the zone, as the naive UTC datetime every column holds."""
    return datetime(*moment, tzinfo=ZoneInfo(zone)).astimezone(UTC).replace(tzinfo=None)


def ist(*moment: int) -> datetime:
    return local("Asia/Kolkata", *moment)


def office() -> WorkingHours:
    return WorkingHours.of(OFFICE, "Asia/Kolkata")


MINUTE, HOUR = 60, 3600

# (case, start, working seconds, the moment they end), in the Indian office's hours.
ADD_CASES = [
    ("start inside a window", ist(2027, 1, 20, 10, 0), 30 * MINUTE, ist(2027, 1, 20, 10, 30)),
    ("start before opening", ist(2027, 1, 20, 7, 0), 30 * MINUTE, ist(2027, 1, 20, 10, 0)),
    ("start after closing", ist(2027, 1, 20, 19, 0), 30 * MINUTE, ist(2027, 1, 21, 10, 0)),
    ("start at closing", ist(2027, 1, 20, 18, 30), MINUTE, ist(2027, 1, 21, 9, 31)),
    ("start on a closed day (Sunday)", ist(2027, 1, 24, 12, 0), 30 * MINUTE, ist(2027, 1, 25, 10, 0)),
    ("a whole day's window, to its last second", ist(2027, 1, 20, 9, 30), 9 * HOUR, ist(2027, 1, 20, 18, 30)),
    ("over a night", ist(2027, 1, 20, 18, 0), HOUR, ist(2027, 1, 21, 10, 0)),
    ("over a weekend (Saturday's morning, Sunday closed)", ist(2027, 1, 23, 13, 0), 2 * HOUR,
     ist(2027, 1, 25, 10, 30)),
    ("Friday evening into Saturday morning", ist(2027, 1, 22, 18, 0), HOUR, ist(2027, 1, 23, 10, 30)),
    ("over a holiday (Republic Day, a Tuesday)", ist(2027, 1, 25, 18, 0), HOUR, ist(2027, 1, 27, 10, 0)),
    ("over a weekend and a Monday holiday", ist(2027, 3, 20, 13, 30), HOUR, ist(2027, 3, 23, 10, 0)),
    # A week of working minutes: three weeks of 5 x 9 h + 4 h, then Monday, Tuesday and 3 h of Wednesday.
    ("the longest response window, 10,080 minutes", ist(2027, 2, 1, 9, 30), 10_080 * MINUTE,
     ist(2027, 2, 24, 12, 30)),
]


@pytest.mark.parametrize("start,seconds,end", [case[1:] for case in ADD_CASES], ids=[case[0] for case in ADD_CASES])
def test_add_finds_the_moment_a_number_of_working_seconds_after_a_start(start, seconds, end):
    assert office().add(start, seconds) == end


# (case, start, end, the working seconds between them), in the Indian office's hours.
BETWEEN_CASES = [
    ("inside one window", ist(2027, 1, 20, 10, 0), ist(2027, 1, 20, 12, 0), 2 * HOUR),
    ("from before opening to after closing", ist(2027, 1, 20, 7, 0), ist(2027, 1, 20, 20, 0), 9 * HOUR),
    ("over a night", ist(2027, 1, 20, 18, 0), ist(2027, 1, 21, 10, 0), HOUR),
    ("over a weekend", ist(2027, 1, 22, 18, 0), ist(2027, 1, 25, 10, 0), 30 * MINUTE + 4 * HOUR + 30 * MINUTE),
    ("over a holiday", ist(2027, 1, 25, 18, 0), ist(2027, 1, 27, 10, 0), HOUR),
    ("over a weekend and a Monday holiday", ist(2027, 3, 20, 13, 30), ist(2027, 3, 23, 10, 0), HOUR),
    ("both ends on a closed day", ist(2027, 1, 24, 8, 0), ist(2027, 1, 24, 20, 0), 0),
    ("both ends in one night", ist(2027, 1, 20, 19, 0), ist(2027, 1, 21, 9, 0), 0),
    ("a holiday from morning to night", ist(2027, 1, 26, 0, 0), ist(2027, 1, 26, 23, 59), 0),
    ("the same moment", ist(2027, 1, 20, 10, 0), ist(2027, 1, 20, 10, 0), 0),
    ("end before start", ist(2027, 1, 21, 12, 0), ist(2027, 1, 20, 10, 0), 0),
    ("a week: 5 x 9 h and Saturday's 4 h", ist(2027, 2, 1, 0, 0), ist(2027, 2, 8, 0, 0), 49 * HOUR),
]


@pytest.mark.parametrize("start,end,seconds", [case[1:] for case in BETWEEN_CASES],
                         ids=[case[0] for case in BETWEEN_CASES])
def test_between_counts_the_working_seconds_from_a_start_to_an_end(start, end, seconds):
    assert office().between(start, end) == seconds


def test_the_office_hours_are_in_the_workspaces_time_zone_india_half_an_hour_off_utc():
    hours = office()
    # 09:30 IST is 04:00 UTC: a lead at 03:00 UTC (08:30 IST) is answered from 04:00 UTC on.
    assert hours.add(datetime(2027, 1, 25, 3, 0), HOUR) == datetime(2027, 1, 25, 5, 0)
    assert hours.between(datetime(2027, 1, 25, 3, 0), datetime(2027, 1, 25, 13, 30)) == 9 * HOUR   # to 18:30 IST
    # The same hours in UTC open five and a half hours later in UTC terms.
    utc = WorkingHours.of(OFFICE, "UTC")
    assert utc.add(datetime(2027, 1, 25, 3, 0), HOUR) == datetime(2027, 1, 25, 10, 30)


@pytest.mark.parametrize("setting", [None, {}], ids=["no setting", "an empty setting"])
def test_without_working_hours_the_clock_runs_around_the_clock(setting):
    hours = WorkingHours.of(setting, "Asia/Kolkata")
    saturday_night = ist(2027, 1, 23, 23, 0)
    assert hours.add(saturday_night, 90 * MINUTE) == saturday_night + timedelta(minutes=90)
    assert hours.between(saturday_night, saturday_night + timedelta(days=3)) == 3 * 24 * HOUR
    assert hours.between(saturday_night, saturday_night - timedelta(hours=1)) == 0
    assert WorkingHours.always().add(saturday_night, 0) == saturday_night


def test_windows_that_meet_at_midnight_are_one_stretch_of_working_time():
    hours = WorkingHours.of(TO_MIDNIGHT, "UTC")
    monday_late = datetime(2027, 1, 25, 23, 0)
    assert hours.add(monday_late, 2 * HOUR) == datetime(2027, 1, 26, 1, 0)
    assert hours.between(monday_late, datetime(2027, 1, 26, 1, 0)) == 2 * HOUR
    # The window to 24:00 ends at the next day's midnight: 4 h on Monday, none left after Tuesday 02:00.
    assert hours.between(datetime(2027, 1, 25, 0, 0), datetime(2027, 1, 26, 0, 0)) == 4 * HOUR
    assert hours.add(datetime(2027, 1, 26, 1, 30), HOUR) == datetime(2027, 2, 1, 20, 30)


def test_a_window_of_the_whole_day_every_day_is_the_clock_around_the_clock():
    hours, always = WorkingHours.of(ALL_DAY, "UTC"), WorkingHours.always()
    start = datetime(2027, 1, 24, 17, 45, 12)
    for seconds in (0, 1, HOUR, 25 * HOUR, 10_080 * MINUTE):
        assert hours.add(start, seconds) == always.add(start, seconds)
    assert hours.between(start, start + timedelta(days=9, seconds=7)) == 9 * 24 * HOUR + 7


def test_a_zone_with_daylight_saving_places_each_days_window_in_that_days_offset():
    london = WorkingHours.of(LONDON_OFFICE, "Europe/London")
    # Friday 2027-03-26 16:00 GMT (UTC) plus 2 h: 1 h on Friday, then Monday 09:00 BST, which is 08:00 UTC.
    friday = local("Europe/London", 2027, 3, 26, 16, 0)
    assert friday == datetime(2027, 3, 26, 16, 0)
    assert london.add(friday, 2 * HOUR) == local("Europe/London", 2027, 3, 29, 10, 0) == datetime(2027, 3, 29, 9, 0)
    assert london.between(friday, datetime(2027, 3, 29, 9, 0)) == 2 * HOUR
    # A whole Sunday is 23 hours on the day the clocks go forward and 25 on the day they go back.
    sundays = WorkingHours.of({"sun": "00:00-24:00"}, "Europe/London")
    assert sundays.between(local("Europe/London", 2027, 3, 28, 0, 0), local("Europe/London", 2027, 3, 29, 0, 0)) \
        == 23 * HOUR
    assert sundays.between(local("Europe/London", 2027, 10, 31, 0, 0), local("Europe/London", 2027, 11, 1, 0, 0)) \
        == 25 * HOUR
    assert sundays.add(local("Europe/London", 2027, 3, 28, 0, 0), 23 * HOUR) == datetime(2027, 3, 28, 23, 0)


def test_a_response_window_longer_than_a_horizon_of_days_is_still_found():
    # Open one hour a week: the longest response window (10,080 minutes, 168 h) ends on the 168th
    # Sunday, more than three years on. Setup accepts these hours, so the arithmetic must answer.
    hours = WorkingHours.of(ONE_HOUR_A_WEEK, "UTC")
    monday = datetime(2027, 1, 4, 0, 0)
    first_sunday = datetime(2027, 1, 10, 9, 0)
    assert hours.add(monday, 10_080 * MINUTE) == first_sunday + timedelta(weeks=167, hours=1)
    assert hours.between(monday, first_sunday + timedelta(weeks=167, hours=1)) == 168 * HOUR


def test_between_counts_a_span_of_years_whole():
    hours = WorkingHours.of(ALL_DAY, "UTC")
    start = datetime(2027, 1, 4, 12, 0)
    assert hours.between(start, start + timedelta(days=1000)) == 1000 * 24 * HOUR
    assert office().between(ist(2027, 2, 1, 0, 0), ist(2027, 2, 1, 0, 0) + timedelta(weeks=150)) \
        == 150 * 49 * HOUR - 9 * HOUR   # less the one holiday in the span, Monday 2027-03-22


# --- add and between agree ---------------------------------------------------------------------

HOURS = {
    "Indian office": (OFFICE, "Asia/Kolkata"),
    "London office": (LONDON_OFFICE, "Europe/London"),
    "Sundays in London": ({"sun": "00:00-24:00"}, "Europe/London"),
    "windows to midnight in Kolkata": (TO_MIDNIGHT, "Asia/Kolkata"),
    "one hour a week": (ONE_HOUR_A_WEEK, "UTC"),
    "around the clock": (None, "Asia/Kolkata"),
}
starts = st.datetimes(min_value=datetime(2026, 1, 1), max_value=datetime(2028, 12, 31))
spans = st.integers(min_value=0, max_value=10_080 * MINUTE)


@EXAMPLES
@given(name=st.sampled_from(sorted(HOURS)), start=starts, seconds=spans)
def test_between_a_start_and_add_of_it_is_the_seconds_added(name, start, seconds):
    hours = WorkingHours.of(*HOURS[name])
    end = hours.add(start, seconds)
    assert end >= start
    assert hours.between(start, end) == seconds


@EXAMPLES
@given(name=st.sampled_from(sorted(HOURS)), start=starts, first=spans, second=spans)
def test_between_adds_up_over_a_moment_in_between(name, start, first, second):
    # On whole seconds: between() counts whole working seconds, so parts of a second at both
    # cuts could add up to one more than their sum.
    start = start.replace(microsecond=0)
    hours = WorkingHours.of(*HOURS[name])
    middle, end = start + timedelta(seconds=first), start + timedelta(seconds=first + second)
    assert hours.between(start, end) == hours.between(start, middle) + hours.between(middle, end)
    assert hours.between(end, start) == 0


# --- windows ------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,window", [("09:30-18:30", (time(9, 30), time(18, 30))),
                                         ("00:00-24:00", (time(0, 0), None)),
                                         ("23:59-24:00", (time(23, 59), None))])
def test_parse_window_reads_a_window_and_24_00_as_the_end_of_the_day(text, window):
    assert parse_window(text) == window


@pytest.mark.parametrize("text,message", [
    ("18:00-09:00", "ends before it starts"),
    ("10:00-10:00", "ends before it starts"),
    ("25:00-26:00", "is not a window"),
    ("9:30-18:30", "is not a window"),
    ("24:30", "is not a window"),
    ("24:00-24:00", "is not a window"),
    ("09:30-24:30", "a day ends at 24:00"),
    ("09:60-18:00", "is not a window"),
    ("09:30 - 18:30", "is not a window"),
    ("", "is not a window"),
])
def test_parse_window_refuses_what_is_not_one_window_within_a_day(text, message):
    with pytest.raises(ValueError, match=message):
        parse_window(text)
