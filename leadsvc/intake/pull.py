"""IndiaMART's CRM listing API, pulled on the clock for each connector that names its CRM key
(crm_key_env): a timer per connector (PULL), armed by setup and again after each run at the
connector's pull_after.

A run asks for the window since the last one that succeeded (pulled_until, a few minutes before
it, since a record may be listed a little after its time; at most seven days back, what
IndiaMART lists in one call; the first run, the last day), with the times as IndiaMART writes
them (IST, `26-Nov-202609:00:00`). IndiaMART's answer says in its `CODE`, not in the HTTP
status, what became of the call: 200 records in RESPONSE, 204 none, 429 wait (15 minutes), 401
a key it does not know (the connector shows it), anything else an error for the next interval.
Each record goes the way of a push (indiamart.lead, intake.take): UNIQUE_QUERY_ID makes a record
pulled twice a no-op. A record's QUERY_TIME is not read: the window asked for says what was
pulled, and the record is kept as IndiaMART sent it, so a date that does not parse fails nothing.

The request goes through outbound.py's Sender (one timeout for the whole answer, an answer cut
at KEPT_ANSWER) from the clock's thread, after the timer's transaction commits (clock.py's
follow-up), so the pull holds no transaction while it waits for IndiaMART.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, Mapping
from urllib.parse import urlencode

from .. import clock
from ..db import transaction
from ..models import Connector, utcnow
from ..outbound import Answer, Sender, operator_settings
from . import indiamart, take

log = logging.getLogger("leadsvc.intake")

PULL = "intake.indiamart_pull"          # the timer kind, one per pulling connector
FIRST_WINDOW = timedelta(days=1)        # what a connector's first run asks for
LONGEST_WINDOW = timedelta(days=7)      # IndiaMART lists at most seven days in one call
OVERLAP = timedelta(minutes=5)          # each window starts this long before the last one ended
WAIT_WHEN_BLOCKED = timedelta(minutes=15)   # after CODE 429: IndiaMART blocks a key that calls again sooner
# A run's claim on its connector outlasts its request (the timeout) and its records' creates.
LEASE_PAST_TIMEOUT = timedelta(minutes=2)
# Bytes of a listing read: seven busy days of records are well under it; a longer answer is refused unread.
KEPT_ANSWER = 8 * 1024 * 1024
ERROR_LENGTH = 500                      # connector.last_error's width
IST = timezone(timedelta(hours=5, minutes=30), "IST")
MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def pulls(connector: Connector) -> bool:
    """Whether the clock pulls this connector: IndiaMART's, with a CRM key named."""
    return connector.kind == "indiamart" and bool((connector.settings or {}).get("crm_key_env"))


def arm(connector: Connector) -> None:
    """Arm the connector's pull (setup, in its transaction): at its pull_after, or now if that is
    past or it never ran; disarmed for a connector that does not pull."""
    if not pulls(connector):
        clock.disarm(PULL, connector.id)
        return
    now = utcnow()
    clock.arm(PULL, connector.id, connector.workspace_id, max(connector.pull_after or now, now))


def indiamart_time(at: datetime) -> str:
    """A naive UTC time as IndiaMART writes times: DD-Mon-YYYYHH:MM:SS in IST (English months,
    whatever the process's locale)."""
    ist = at.replace(tzinfo=UTC).astimezone(IST)
    return f"{ist.day:02d}-{MONTHS[ist.month - 1]}-{ist.year:04d}{ist:%H:%M:%S}"


def window(connector: Connector, now: datetime) -> tuple[datetime, datetime]:
    """The start and end (naive UTC) of what a run at `now` asks for."""
    start = connector.pulled_until - OVERLAP if connector.pulled_until is not None else now - FIRST_WINDOW
    return max(start, now - LONGEST_WINDOW), now


def listing_url(base: str, key: str, start: datetime, end: datetime) -> str:
    query = urlencode({"glusr_crm_key": key, "start_time": indiamart_time(start), "end_time": indiamart_time(end)})
    return f"{base}{'&' if '?' in base else '?'}{query}"


def read_listing(answer: Answer) -> tuple[int | None, list[dict[str, Any]], str]:
    """IndiaMART's CODE (None when the answer has none), the records of its RESPONSE, and what
    it says (its MESSAGE, or why the answer cannot be read)."""
    if answer.status is None:
        return None, [], answer.error or "No answer."
    if not answer.whole:
        return None, [], f"IndiaMART's answer was longer than {KEPT_ANSWER // (1024 * 1024)} MiB, or cut off; " \
                         "it was not read."
    try:
        data = json.loads(answer.body or "")
    except ValueError:
        return None, [], f"IndiaMART answered HTTP {answer.status} with something that is not JSON."
    if not isinstance(data, dict):
        return None, [], f"IndiaMART answered HTTP {answer.status} with JSON that is not its listing."
    code = data.get("CODE")
    code = int(code) if isinstance(code, int) or (isinstance(code, str) and code.strip().isdigit()) else None
    records = data.get("RESPONSE")
    message = data.get("MESSAGE") if isinstance(data.get("MESSAGE"), str) else ""
    if code is None:
        return None, [], f"IndiaMART answered HTTP {answer.status} without a CODE."
    return code, [each for each in records if isinstance(each, dict)] if isinstance(records, list) else [], message


# --- a run -------------------------------------------------------------------------------------

@clock.timer(PULL)
def start(connector_id: int, due: datetime, now: datetime, settings: dict):
    """Claim the connector's run (its pull_after moves past the run's longest time, and the
    timer with it, in case this process never finishes it) and return the run, for after the commit."""
    connector = Connector.get_or_none(Connector.id == connector_id)
    if connector is None or not pulls(connector):
        return None
    interval = timedelta(seconds=settings["connectors"]["indiamart_interval"])
    lease = now + max(interval, timedelta(seconds=settings["webhooks"]["timeout"]) + LEASE_PAST_TIMEOUT)
    Connector.update(pull_after=lease).where(Connector.id == connector.id).execute()
    clock.arm(PULL, connector.id, connector.workspace_id, lease)
    return functools.partial(run, connector.id, now, lease, settings)


def run(connector_id: int, now: datetime, lease: datetime, settings: Mapping[str, Any]) -> None:
    """One pull: ask IndiaMART for the window, take its records, and record how it went."""
    connector = Connector.get_or_none((Connector.id == connector_id) & (Connector.pull_after == lease))
    if connector is None or not pulls(connector):   # deleted, claimed again, or no longer pulled (setup)
        return
    interval = timedelta(seconds=settings["connectors"]["indiamart_interval"])
    start_at, end_at = window(connector, now)
    name = connector.settings["crm_key_env"]
    key = os.environ.get(name, "")
    if not key:
        finish(connector, lease, now + interval,
               error=f"The environment variable {name} (crm_key_env) is not set: IndiaMART cannot be pulled.")
        return
    sender = Sender(operator_settings(settings["webhooks"]["timeout"]))
    try:
        answer = sender.get(listing_url(settings["connectors"]["indiamart_url"], key, start_at, end_at),
                            {"Accept": "application/json"}, keep=KEPT_ANSWER)
    finally:
        sender.close()
    code, records, message = read_listing(answer)
    said = f": {message}" if message else "."
    if code == 200 or code == 204:
        # The pull works again: what each record makes of the connector's health is its own.
        Connector.update(last_error=None, last_error_at=None).where(Connector.id == connector.id).execute()
        for record in records if code == 200 else []:
            take(connector, record, indiamart.lead(record, connector.settings or {}), settings)
        finish(connector, lease, now + interval, pulled_until=end_at)
    elif code == 429:
        finish(connector, lease, now + WAIT_WHEN_BLOCKED,
               error=f"IndiaMART asked for a pause (CODE 429){said} The next pull waits 15 minutes.")
    elif code == 401:
        finish(connector, lease, now + interval, error=f"IndiaMART does not accept the CRM key of {name} (CODE 401)"
                                                       f"{said} Generate a key in IndiaMART's Lead Manager and set it.")
    elif code is None:
        finish(connector, lease, now + interval, error=f"The pull from IndiaMART failed: {message}")
    else:
        finish(connector, lease, now + interval, error=f"IndiaMART answered CODE {code}{said}")


def finish(connector: Connector, lease: datetime, pull_after: datetime, *, pulled_until: datetime | None = None,
           error: str | None = None) -> None:
    """Record a run on its connector, if the run still holds it, and arm the next at pull_after."""
    changes: dict[Any, Any] = {Connector.pull_after: pull_after}
    if pulled_until is not None:
        changes[Connector.pulled_until] = pulled_until
    if error is not None:
        changes.update({Connector.last_error: error[:ERROR_LENGTH], Connector.last_error_at: utcnow()})
        log.warning("connector %s: %s", connector.public_id, error)
    with transaction():
        if Connector.update(changes).where((Connector.id == connector.id) & (Connector.pull_after == lease)).execute():
            clock.arm(PULL, connector.id, connector.workspace_id, pull_after)
