"""A timer kind for the tests only, registered where this module is imported: the test process,
and `leadsvc worker` processes started through WORKER_COMMAND, so that no test code lives in the
package. Its subject is a lead; firing writes a `test.fired` event on that lead (a row in the
timer's transaction, counted by the tests) and raises for the leads in `failing`."""

from __future__ import annotations

import os
import sys
from datetime import datetime
from pathlib import Path

from leadsvc import clock, events
from leadsvc.models import Event, Lead

KIND = "test.fired"
failing: set[int] = set()   # leads whose timer raises after writing its event


@clock.timer(KIND)
def fire(subject: int, due: datetime, now: datetime, settings: dict) -> None:
    lead = Lead.get_by_id(subject)
    events.write(lead.workspace_id, KIND, {"lead": lead.public_id, "due": due.isoformat()}, (), lead=lead.id)
    if subject in failing:
        raise RuntimeError("a poisoned timer")


def fired(lead_id: int) -> list[Event]:
    """The events the timer of this lead wrote and committed."""
    return list(Event.select().where((Event.type == KIND) & (Event.lead == lead_id)).order_by(Event.id))


# `leadsvc worker` with this kind registered: the tests folder on the path, then the command line.
WORKER_COMMAND = [sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv.pop(1)); import timer_kind; "
                  "from leadsvc.cli import cli; cli(prog_name='leadsvc')", str(Path(__file__).parent),
                  "--config", os.devnull, "worker"]
