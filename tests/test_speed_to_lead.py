"""Speed to lead and stale leads (DESIGN section 18), through the API: setup's [working_hours],
[sla], a source's first_response_minutes and a status's stale_after_days; the response due time
of a lead from every create path; its first response; filter[sla], filter[stale] and
sort=response_due_at; lead.response_overdue and lead.stale from the clock (on the test's own
time); and the lead document's `sla` and `stale_since` wherever a lead is shown.

Times are pinned through the pipeline's clock (pipeline.utcnow, as conftest.pipeline_data does,
and the modules that write activities and close tasks), so a lead's creation, its moves and its
contacts fall at known moments in known working hours and the expected due times are plain."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from conftest import FORM_ORIGIN, Tenant, lead_body, new_phone, register_webhook, with_form
from leadsvc import followups, history, jsoncodec, listing, pipeline
from leadsvc.clock import Clock
from leadsvc.fields import rfc3339
from leadsvc.models import Event, Lead, Source, Status, Timer, Workspace, utcnow
from leadsvc.provision import apply_setup, parse_setup, read_setup_file

LEAD_TIMER_EVENTS = ["lead.response_overdue", "lead.stale"]


def ist(*moment: int) -> datetime:
    """A wall-clock time in India (the workspaces' zone), as the naive UTC datetime columns hold."""
    return datetime(*moment, tzinfo=ZoneInfo("Asia/Kolkata")).astimezone(UTC).replace(tzinfo=None)


# Office hours on weekdays, and a Monday holiday.
HOURS = {**{day: "09:30-18:30" for day in ("mon", "tue", "wed", "thu", "fri")}, "holidays": ["2026-11-16"]}
MONDAY_TEN = ist(2026, 11, 2, 10, 0)           # Monday 2026-11-02 10:00, inside the window
FRIDAY_EVENING = ist(2026, 11, 6, 18, 0)       # Friday 2026-11-06 18:00, half an hour before closing
NEXT_MONDAY_TEN = ist(2026, 11, 9, 10, 0)      # 60 working minutes after FRIDAY_EVENING
FRIDAY_BEFORE_HOLIDAY = ist(2026, 11, 13, 18, 0)
TUESDAY_AFTER_HOLIDAY = ist(2026, 11, 17, 10, 0)   # 60 working minutes after it: Monday 16th is a holiday


def sla_setup(minutes: int | None = 60, hours: dict | None = HOURS, source_minutes: dict[str, int] | None = None,
              stale: dict[str, int] | None = None, form: bool = False):
    """A change for make_workspace: working hours, an [sla], sources' own minutes and statuses'
    stale_after_days (None leaves a section out)."""
    def change(data):
        if hours is not None:
            data["working_hours"] = hours
        if minutes is not None:
            data["sla"] = {"first_response_minutes": minutes}
        for source in data["sources"]:
            if source["name"] in (source_minutes or {}):
                source["first_response_minutes"] = source_minutes[source["name"]]
        for status in data["statuses"]:
            if status["name"] in (stale or {}):
                status["stale_after_days"] = stale[status["name"]]
        if form:
            with_form(data)
    return change


@pytest.fixture
def sla_workspace(make_workspace):
    """make_workspace with sla_setup's settings; returns the tenant and its setup data, which
    `reapply` runs setup with again, changed."""
    def build(**settings) -> tuple[Tenant, dict]:
        kept = {}

        def change(data):
            sla_setup(**settings)(data)
            kept["data"] = data
        return make_workspace(change), kept["data"]
    return build


def reapply(data: dict, **settings) -> None:
    """Run setup again on the workspace of `data`, with sla_setup's settings instead of its own."""
    changed = json.loads(json.dumps(data))
    for key in ("working_hours", "sla"):
        changed.pop(key, None)
    for item in changed["sources"] + changed["statuses"]:
        item.pop("first_response_minutes", None)
        item.pop("stale_after_days", None)
    sla_setup(**settings)(changed)
    apply_setup(parse_setup(changed))


class Frozen:
    """The pipeline's clock, pinned by the test: leads are created, moved and contacted `at` it."""

    def __init__(self, monkeypatch):
        self.monkeypatch = monkeypatch

    def at(self, moment: datetime | None) -> "Frozen":
        """Pin the time (None: the real time again)."""
        now = utcnow if moment is None else (lambda: moment)
        for module in (pipeline, history, followups):
            self.monkeypatch.setattr(module, "utcnow", now)
        return self


@pytest.fixture
def frozen(monkeypatch) -> Frozen:
    return Frozen(monkeypatch)


def lead_of(client, ws, lead_id: str) -> dict:
    response = client.get(f"/api/v1/leads/{lead_id}", headers=ws.headers())
    assert response.status_code == 200, response.get_json()
    return response.json["data"]


def new_lead(client, ws, **fields) -> dict:
    response = client.post("/api/v1/leads", json=lead_body(ws, **fields), headers=ws.headers())
    assert response.status_code == 201, response.get_json()
    return response.json["data"]


def log(client, ws, lead_id: str, kind: str, at: datetime | None = None, expect: int = 201) -> dict:
    body = {"kind": kind, "summary": f"A {kind}", **({"occurred_at": rfc3339(at)} if at else {})}
    response = client.post(f"/api/v1/leads/{lead_id}/activities", json=body, headers=ws.headers())
    assert response.status_code == expect, response.get_json()
    return response.json["lead"]


def move(client, ws, lead_id: str, status: str) -> dict:
    response = client.post(f"/api/v1/leads/{lead_id}/status", json={"status": ws.ids.statuses[status]},
                           headers=ws.headers())
    assert response.status_code == 200, response.get_json()
    return response.json["data"]


def sla(due: datetime, responded: datetime | None = None, seconds: int | None = None, state: str = "overdue"):
    """A lead document's `sla` object."""
    return {"due_at": rfc3339(due), "responded_at": rfc3339(responded), "response_seconds": seconds, "state": state}


def internal_id(lead_id: str) -> int:
    return Lead.get(Lead.public_id == lead_id).id


# --- setup ------------------------------------------------------------------------------------------

SETUP_TOML = """\
[workspace]
name = "{name}"
timezone = "Asia/Kolkata"

[working_hours]
mon = "09:30-18:30"
tue = "09:30-18:30"
wed = "09:30-18:30"
thu = "09:30-18:30"
fri = "09:30-18:30"
sat = "10:00-14:00"
holidays = [2027-01-26, "2027-03-22"]

[sla]
first_response_minutes = 30

[[members]]
name = "Ada Admin"
email = "admin@t.test"
role = "admin"

[[statuses]]
name = "New"
kind = "open"
stale_after_days = 3

[[statuses]]
name = "Contacted"
kind = "open"
stale_after_days = 7

[[statuses]]
name = "Won"
kind = "won"

[[statuses]]
name = "Lost"
kind = "lost"

[[sources]]
name = "Website"
score = 10

[[sources]]
name = "Portal"
first_response_minutes = 15
"""

WEEKDAY_LINES = "".join(f'{day} = "09:30-18:30"\n' for day in ("mon", "tue", "wed", "thu", "fri"))


@pytest.fixture
def setup_file(tmp_path):
    """Write the setup file for a workspace of its own (with replacements); its path and name."""
    name = f"Speed {uuid.uuid4().hex[:8]}"

    def write(*replacements: tuple[str, str]) -> str:
        text = SETUP_TOML.format(name=name)
        for old, new in replacements:
            assert old in text, f"the test's replacement {old!r} matches nothing"
            text = text.replace(old, new, 1)
        path = tmp_path / f"{uuid.uuid4().hex[:6]}.toml"
        path.write_text(text)
        return str(path)
    write.name = name
    return write


def snapshot(name: str) -> dict[str, list]:
    """Every row setup or its effects could touch in the workspace, as stored."""
    workspace = Workspace.get(Workspace.name == name)
    rows = {model.__name__: list(model.select().where(model.workspace == workspace.id).order_by(model.id).tuples())
            for model in (Status, Source, Lead, Timer)}
    rows["Workspace"] = list(Workspace.select().where(Workspace.id == workspace.id).tuples())
    return rows


def test_a_good_file_stores_hours_sla_and_stale_settings_and_running_it_twice_changes_nothing(run_cli, setup_file):
    path = setup_file()
    first = run_cli("setup", path, "--json")
    assert first.exit_code == 0, first.output
    workspace = Workspace.get(Workspace.name == setup_file.name)
    assert workspace.working_hours == {**{day: "09:30-18:30" for day in ("mon", "tue", "wed", "thu", "fri")},
                                       "sat": "10:00-14:00", "holidays": ["2027-01-26", "2027-03-22"]}
    assert workspace.first_response_minutes == 30
    sources = {s.name: s.first_response_minutes for s in Source.select().where(Source.workspace == workspace.id)}
    assert sources == {"Website": None, "Portal": 15}
    statuses = {s.name: s.stale_after_days for s in Status.select().where(Status.workspace == workspace.id)}
    assert statuses == {"New": 3, "Contacted": 7, "Won": None, "Lost": None}

    before = snapshot(setup_file.name)
    second = run_cli("setup", path, "--json")
    assert second.exit_code == 0, second.output
    assert json.loads(second.stdout) == json.loads(first.stdout)
    assert snapshot(setup_file.name) == before


BAD_FILES = {
    # name: (replacement in the good file, what the message must say)
    "a window that ends before it starts": (('mon = "09:30-18:30"', 'mon = "18:00-09:00"'),
                                            "working_hours.mon: '18:00-09:00' ends before it starts"),
    "hours past the day": (('tue = "09:30-18:30"', 'tue = "25:00-26:00"'),
                           "working_hours.tue: '25:00-26:00' is not a window"),
    "an hour of one digit": (('wed = "09:30-18:30"', 'wed = "9:30-18:30"'),
                             "working_hours.wed: '9:30-18:30' is not a window"),
    "a window past midnight": (('thu = "09:30-18:30"', 'thu = "09:30-24:30"'),
                               "working_hours.thu: '09:30-24:30': a day ends at 24:00"),
    "an unknown weekday": (('thu = "09:30-18:30"', 'thurs = "09:30-18:30"'), "working_hours.thurs: unknown key"),
    "a holiday that is no date": (('"2027-03-22"', '"2027-02-30"'),
                                  "working_hours.holidays[1]: '2027-02-30' is not a date"),
    "a holiday named, not dated": (('[2027-01-26,', '["Republic Day",'),
                                   "working_hours.holidays[0]: 'Republic Day' is not a date"),
    "a holiday with a time": (('[2027-01-26,', '[2027-01-26T10:00:00,'), "working_hours.holidays[0]: "),
    "hours without a weekday": ((WEEKDAY_LINES + 'sat = "10:00-14:00"\n', ''),
                                "working_hours: Give at least one weekday's window"),
    "no response minutes": (("first_response_minutes = 30\n", ""),
                            "sla.first_response_minutes: Missing data for required field"),
    "response minutes 0": (("first_response_minutes = 30", "first_response_minutes = 0"),
                           "sla.first_response_minutes: Must be greater than or equal to 1"),
    "response minutes over a week": (("first_response_minutes = 30", "first_response_minutes = 10081"),
                                     "sla.first_response_minutes: Must be greater than or equal to 1"),
    "response minutes as text": (("first_response_minutes = 30", 'first_response_minutes = "30"'),
                                 "sla.first_response_minutes: Not a valid integer"),
    "a source's response minutes 0": (("first_response_minutes = 15", "first_response_minutes = 0"),
                                      "sources[1].first_response_minutes: Must be greater than or equal to 1"),
    "a source's response minutes over a week": (("first_response_minutes = 15", "first_response_minutes = 10081"),
                                                "sources[1].first_response_minutes: Must be greater than or equal"),
    "stale_after_days on a won status": (('kind = "won"\n', 'kind = "won"\nstale_after_days = 30\n'),
                                         "statuses[2].stale_after_days: Only an open status's leads go stale"),
    "stale_after_days on a lost status": (('kind = "lost"\n', 'kind = "lost"\nstale_after_days = 30\n'),
                                          "statuses[3].stale_after_days: Only an open status's leads go stale"),
    "stale_after_days 0": (("stale_after_days = 3", "stale_after_days = 0"),
                           "statuses[0].stale_after_days: Must be greater than or equal to 1"),
}


@pytest.mark.parametrize("case", BAD_FILES)
def test_a_bad_setting_is_refused_naming_its_key_and_nothing_changes(client, run_cli, setup_file, frozen, case):
    # A workspace that has the good settings already, and a lead they gave a due time and timers.
    tenant = Tenant(apply_setup(read_setup_file(setup_file())))
    frozen.at(MONDAY_TEN)
    lead = new_lead(client, tenant, source=None)
    assert lead["sla"]["due_at"] == rfc3339(MONDAY_TEN + timedelta(minutes=30)) and lead["stale_since"] is not None
    frozen.at(None)
    before = snapshot(setup_file.name)
    replacement, message = BAD_FILES[case]
    # The bad setting, and changes elsewhere in the file that a partial apply would have written.
    path = setup_file(replacement, ("stale_after_days = 7", "stale_after_days = 9"), ("score = 10", "score = 11"))
    result = run_cli("setup", path, "--json")
    assert result.exit_code != 0
    assert "was not applied; nothing changed" in result.stderr
    assert message in result.stderr, result.stderr
    assert "Traceback" not in result.output
    assert snapshot(setup_file.name) == before


def test_setup_applies_changed_settings_and_turns_left_out_sections_off(client, run_cli, setup_file):
    path = setup_file()
    assert run_cli("setup", path).exit_code == 0
    changed = setup_file(('sat = "10:00-14:00"\n', ''), ("first_response_minutes = 30", "first_response_minutes = 45"),
                         ("stale_after_days = 3", "stale_after_days = 5"))
    assert run_cli("setup", changed).exit_code == 0
    workspace = Workspace.get(Workspace.name == setup_file.name)
    assert "sat" not in workspace.working_hours and workspace.first_response_minutes == 45
    assert Status.get((Status.workspace == workspace.id) & (Status.name == "New")).stale_after_days == 5
    without = setup_file((WEEKDAY_LINES + 'sat = "10:00-14:00"\nholidays = [2027-01-26, "2027-03-22"]\n', ''),
                         ("[working_hours]\n", ""), ("[sla]\nfirst_response_minutes = 30\n", ""),
                         ("first_response_minutes = 15\n", ""), ("stale_after_days = 3\n", ""))
    assert run_cli("setup", without).exit_code == 0
    workspace = Workspace.get(Workspace.name == setup_file.name)
    assert workspace.working_hours is None and workspace.first_response_minutes is None
    assert Source.get((Source.workspace == workspace.id) & (Source.name == "Portal")).first_response_minutes is None
    assert Status.get((Status.workspace == workspace.id) & (Status.name == "New")).stale_after_days is None


# --- the response due time of a new lead -------------------------------------------------------------

def create_by_api(client, ws) -> str:
    return new_lead(client, ws)["id"]


def create_in_a_batch(client, ws) -> str:
    response = client.post("/api/v1/leads/batch", json={"leads": [lead_body(ws)]}, headers=ws.headers())
    assert response.status_code == 200 and response.json["data"][0]["status"] == 201, response.get_json()
    return response.json["data"][0]["lead"]["id"]


def create_by_form(client, ws) -> str:
    phone = new_phone()
    response = client.post(f"/api/v1/forms/{ws.ids.forms['Website enquiry']}/submissions",
                           json={"first_name": "Asha", "phone": phone}, headers={"Origin": FORM_ORIGIN})
    assert response.status_code == 201, response.get_json()
    return Lead.get(Lead.phone == phone).public_id


def create_by_import(client, ws, run_cli, tmp_path) -> str:
    phone = new_phone()
    path = tmp_path / "leads.csv"
    path.write_text(f"first_name,phone,source\nImported,{phone},Website\n")
    result = run_cli("import", str(path), "--workspace", ws.public_id)
    assert result.exit_code == 0, result.output
    return Lead.get(Lead.phone == phone).public_id


CREATE_PATHS = {"POST /leads": create_by_api, "POST /leads/batch": create_in_a_batch,
                "a web form": create_by_form, "CSV import": create_by_import}


@pytest.mark.parametrize("path", CREATE_PATHS)
def test_every_create_path_gives_a_new_lead_its_due_time_in_working_minutes(client, sla_workspace, frozen, run_cli,
                                                                          tmp_path, path):
    ws, _ = sla_workspace(minutes=60, form=True)
    create = CREATE_PATHS[path]
    extra = (run_cli, tmp_path) if path == "CSV import" else ()
    frozen.at(FRIDAY_EVENING)
    lead_id = create(client, ws, *extra)
    frozen.at(FRIDAY_BEFORE_HOLIDAY)
    over_the_holiday = create(client, ws, *extra)
    frozen.at(None)
    lead = lead_of(client, ws, lead_id)
    assert lead["created_at"] == rfc3339(FRIDAY_EVENING)
    # Half an hour on Friday, the weekend closed, half an hour on Monday.
    assert lead["sla"] == sla(NEXT_MONDAY_TEN)
    assert lead_of(client, ws, over_the_holiday)["sla"] == sla(TUESDAY_AFTER_HOLIDAY)


def test_the_longest_window_in_the_fewest_hours_setup_accepts_is_a_due_time_years_ahead(client, sla_workspace,
                                                                                       frozen):
    # One hour on Sundays and 10,080 minutes: the 168th Sunday's hour, more than three years on.
    ws, _ = sla_workspace(minutes=10_080, hours={"sun": "09:00-10:00"})
    frozen.at(MONDAY_TEN)
    lead = new_lead(client, ws)
    assert lead["sla"]["due_at"] == rfc3339(ist(2026, 11, 8, 10, 0) + timedelta(weeks=167))


def test_a_sources_own_minutes_win_for_its_leads(client, sla_workspace, frozen):
    ws, _ = sla_workspace(minutes=60, source_minutes={"Referral": 15})
    frozen.at(FRIDAY_EVENING)
    referral = new_lead(client, ws, source=ws.ids.sources["Referral"])
    website = new_lead(client, ws, source=ws.ids.sources["Website"])
    no_source = new_lead(client, ws, source=None)
    batch = client.post("/api/v1/leads/batch", json={"leads": [lead_body(ws, source=ws.ids.sources["Referral"])]},
                        headers=ws.headers()).json["data"][0]["lead"]
    assert referral["sla"]["due_at"] == batch["sla"]["due_at"] == rfc3339(FRIDAY_EVENING + timedelta(minutes=15))
    assert website["sla"]["due_at"] == no_source["sla"]["due_at"] == rfc3339(NEXT_MONDAY_TEN)


def test_without_an_sla_a_lead_has_none_even_with_working_hours(client, sla_workspace):
    ws, _ = sla_workspace(minutes=None, source_minutes=None)
    lead = new_lead(client, ws)
    assert lead["sla"] is None and lead_of(client, ws, lead["id"])["sla"] is None
    assert Lead.get(Lead.public_id == lead["id"]).response_due_at is None


def test_without_an_sla_a_sources_own_minutes_give_no_due_time(client, sla_workspace):
    # DESIGN 18: sla is null for a workspace without [sla]; a source's minutes replace the workspace's.
    ws, _ = sla_workspace(minutes=None, source_minutes={"Referral": 15})
    referral = new_lead(client, ws, source=ws.ids.sources["Referral"])
    assert referral["sla"] is None and Lead.get(Lead.public_id == referral["id"]).response_due_at is None


def test_leads_created_before_the_sla_was_set_keep_none(client, sla_workspace, frozen):
    ws, data = sla_workspace(minutes=None)
    frozen.at(MONDAY_TEN)
    before = new_lead(client, ws)
    reapply(data, minutes=60)
    after = new_lead(client, ws)
    log(client, ws, before["id"], "call", MONDAY_TEN + timedelta(minutes=5))
    frozen.at(None)
    assert lead_of(client, ws, before["id"])["sla"] is None
    assert lead_of(client, ws, after["id"])["sla"] == sla(MONDAY_TEN + timedelta(hours=1))
    listed = client.get("/api/v1/leads?filter[sla]=due,overdue,met,missed", headers=ws.headers()).json["data"]
    assert [lead["id"] for lead in listed] == [after["id"]]


def test_changing_the_hours_or_the_minutes_later_leaves_existing_due_times_as_they_were(client, sla_workspace, frozen):
    ws, data = sla_workspace(minutes=60)
    frozen.at(FRIDAY_EVENING)
    kept = new_lead(client, ws)
    reapply(data, minutes=15, hours={day: "00:00-24:00" for day in ("mon", "tue", "wed", "thu", "fri", "sat", "sun")})
    changed = new_lead(client, ws)
    reapply(data, minutes=120, hours=None)
    around_the_clock = new_lead(client, ws)
    frozen.at(None)
    assert lead_of(client, ws, kept["id"])["sla"]["due_at"] == rfc3339(NEXT_MONDAY_TEN)
    assert lead_of(client, ws, changed["id"])["sla"]["due_at"] == rfc3339(FRIDAY_EVENING + timedelta(minutes=15))
    assert lead_of(client, ws, around_the_clock["id"])["sla"]["due_at"] == rfc3339(FRIDAY_EVENING + timedelta(hours=2))


# --- the first response ---------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["call", "email", "whatsapp", "sms", "meeting", "visit"])
def test_a_logged_contact_is_the_first_response(client, sla_workspace, frozen, kind):
    ws, _ = sla_workspace(minutes=60)
    frozen.at(MONDAY_TEN)
    lead = new_lead(client, ws)
    shown = log(client, ws, lead["id"], kind, MONDAY_TEN + timedelta(minutes=20))
    expected = sla(MONDAY_TEN + timedelta(hours=1), MONDAY_TEN + timedelta(minutes=20), 20 * 60, "met")
    assert shown["sla"] == expected
    frozen.at(None)
    assert lead_of(client, ws, lead["id"])["sla"] == expected


def test_a_completed_contact_task_is_the_first_response_and_a_completed_todo_is_not(client, sla_workspace, frozen):
    ws, _ = sla_workspace(minutes=60)
    frozen.at(MONDAY_TEN)
    lead = new_lead(client, ws)

    def task(kind: str) -> str:
        response = client.post(f"/api/v1/leads/{lead['id']}/tasks", headers=ws.headers(), json={
            "kind": kind, "title": f"A {kind}", "due_at": rfc3339(MONDAY_TEN + timedelta(hours=2))})
        assert response.status_code == 201, response.get_json()
        return response.json["data"]["id"]

    todo, call = task("todo"), task("call")
    frozen.at(MONDAY_TEN + timedelta(minutes=30))
    assert client.post(f"/api/v1/tasks/{todo}/complete", json={}, headers=ws.headers()).status_code == 200
    assert lead_of(client, ws, lead["id"])["sla"]["responded_at"] is None
    frozen.at(MONDAY_TEN + timedelta(minutes=45))
    done = client.post(f"/api/v1/tasks/{call}/complete", json={"outcome": "Spoke to her"}, headers=ws.headers())
    assert done.status_code == 200, done.get_json()
    frozen.at(None)
    assert lead_of(client, ws, lead["id"])["sla"] == sla(MONDAY_TEN + timedelta(hours=1),
                                                         MONDAY_TEN + timedelta(minutes=45), 45 * 60, "met")


def test_a_move_out_of_the_first_status_is_the_first_response(client, sla_workspace, frozen):
    ws, _ = sla_workspace(minutes=60)
    frozen.at(MONDAY_TEN)
    contacted, lost = new_lead(client, ws), new_lead(client, ws)
    frozen.at(MONDAY_TEN + timedelta(minutes=90))
    assert move(client, ws, contacted["id"], "Contacted")["sla"] == sla(
        MONDAY_TEN + timedelta(hours=1), MONDAY_TEN + timedelta(minutes=90), 90 * 60, "missed")
    frozen.at(MONDAY_TEN + timedelta(minutes=10))
    assert move(client, ws, lost["id"], "Lost")["sla"]["responded_at"] == rfc3339(MONDAY_TEN + timedelta(minutes=10))


def test_a_note_and_a_move_between_later_statuses_are_no_response(client, sla_workspace, frozen):
    ws, _ = sla_workspace(minutes=60)
    frozen.at(MONDAY_TEN)
    lead = new_lead(client, ws)
    frozen.at(MONDAY_TEN + timedelta(minutes=5))
    note = client.post(f"/api/v1/leads/{lead['id']}/notes", json={"body": "Wants a villa"}, headers=ws.headers())
    assert note.status_code == 201
    assert lead_of(client, ws, lead["id"])["sla"] == sla(MONDAY_TEN + timedelta(hours=1))
    # A lead already in a later status (put there directly: no move out of the first one was made).
    Lead.update(status=Status.get(Status.public_id == ws.ids.statuses["Contacted"]).id) \
        .where(Lead.public_id == lead["id"]).execute()
    frozen.at(MONDAY_TEN + timedelta(minutes=10))
    assert move(client, ws, lead["id"], "Qualified")["sla"] == sla(MONDAY_TEN + timedelta(hours=1))
    assert Lead.get(Lead.public_id == lead["id"]).first_response_at is None


def test_the_first_response_is_stamped_once_and_an_earlier_contact_logged_later_wins(client, sla_workspace, frozen):
    ws, _ = sla_workspace(minutes=60)
    frozen.at(MONDAY_TEN)
    lead = new_lead(client, ws)
    due = MONDAY_TEN + timedelta(hours=1)
    first = sla(due, MONDAY_TEN + timedelta(minutes=20), 20 * 60, "met")
    assert log(client, ws, lead["id"], "call", MONDAY_TEN + timedelta(minutes=20))["sla"] == first
    assert log(client, ws, lead["id"], "whatsapp", MONDAY_TEN + timedelta(minutes=50))["sla"] == first
    frozen.at(MONDAY_TEN + timedelta(minutes=55))
    assert move(client, ws, lead["id"], "Contacted")["sla"] == first
    assert move(client, ws, lead["id"], "Qualified")["sla"] == first
    # A call made before the first one, logged afterwards: the first response moves back to it.
    earlier = sla(due, MONDAY_TEN + timedelta(minutes=5), 5 * 60, "met")
    assert log(client, ws, lead["id"], "call", MONDAY_TEN + timedelta(minutes=5))["sla"] == earlier
    frozen.at(None)
    assert lead_of(client, ws, lead["id"])["sla"] == earlier


def test_the_response_time_counts_working_seconds_only(client, sla_workspace, frozen):
    ws, _ = sla_workspace(minutes=60)
    frozen.at(FRIDAY_EVENING)
    met, missed = new_lead(client, ws), new_lead(client, ws)
    frozen.at(None)
    # Monday 09:45: two and a half days later, 45 working minutes (30 on Friday, 15 on Monday).
    assert log(client, ws, met["id"], "call", ist(2026, 11, 9, 9, 45))["sla"] == sla(
        NEXT_MONDAY_TEN, ist(2026, 11, 9, 9, 45), 45 * 60, "met")
    # Tuesday 09:40: 30 + 540 + 10 minutes.
    assert log(client, ws, missed["id"], "sms", ist(2026, 11, 10, 9, 40))["sla"] == sla(
        NEXT_MONDAY_TEN, ist(2026, 11, 10, 9, 40), 580 * 60, "missed")


def test_the_state_is_due_then_overdue_without_a_response(client, sla_workspace, frozen):
    ws, _ = sla_workspace(minutes=60, hours=None)
    due = new_lead(client, ws)   # now: its due time is an hour ahead
    assert due["sla"]["state"] == "due" and due["sla"]["responded_at"] is None
    frozen.at(MONDAY_TEN)
    overdue = new_lead(client, ws)
    frozen.at(None)
    assert lead_of(client, ws, overdue["id"])["sla"] == sla(MONDAY_TEN + timedelta(hours=1))


# --- the lead list ------------------------------------------------------------------------------------

def listed(client, ws, query: str) -> list[str]:
    response = client.get(f"/api/v1/leads?{query}", headers=ws.headers())
    assert response.status_code == 200, response.get_json()
    return [lead["id"] for lead in response.json["data"]]


def walk(client, ws, url: str) -> list[str]:
    seen = []
    while url:
        response = client.get(url, headers=ws.headers())
        assert response.status_code == 200, response.get_json()
        seen += [lead["id"] for lead in response.json["data"]]
        url = response.json["links"]["next"]
    return seen


@pytest.fixture
def four_states(client, sla_workspace, frozen):
    """A lead in each state and one created before the workspace had an SLA."""
    ws, data = sla_workspace(minutes=None)
    frozen.at(MONDAY_TEN)
    leads = {"none": new_lead(client, ws)["id"]}
    reapply(data, minutes=60)
    leads.update({state: new_lead(client, ws)["id"] for state in ("overdue", "met", "missed")})
    log(client, ws, leads["met"], "call", MONDAY_TEN + timedelta(minutes=59))
    log(client, ws, leads["missed"], "call", MONDAY_TEN + timedelta(minutes=61))
    frozen.at(None)
    leads["due"] = new_lead(client, ws)["id"]
    return ws, leads


def test_filter_sla_selects_leads_by_state_one_or_several(client, four_states):
    ws, leads = four_states
    for state in ("due", "overdue", "met", "missed"):
        assert listed(client, ws, f"filter[sla]={state}") == [leads[state]]
        assert lead_of(client, ws, leads[state])["sla"]["state"] == state
    assert set(listed(client, ws, "filter[sla]=met,missed")) == {leads["met"], leads["missed"]}
    assert set(listed(client, ws, "filter[sla]=due,overdue,met,missed")) == set(leads.values()) - {leads["none"]}


@pytest.mark.parametrize("value", ["late", "met,late", "", "MET"])
def test_a_bad_sla_filter_is_a_422_problem_naming_it(client, ws, value):
    response = client.get("/api/v1/leads", query_string={"filter[sla]": value}, headers=ws.headers())
    assert response.status_code == 422
    assert response.content_type == "application/problem+json"
    assert "filter[sla]" in response.json["errors"]


def test_sort_by_response_due_at_earliest_first_without_one_last_across_pages(client, sla_workspace, frozen):
    ws, data = sla_workspace(minutes=None, hours=None)
    frozen.at(MONDAY_TEN)
    without = [new_lead(client, ws)["id"] for _ in range(2)]
    reapply(data, minutes=60, hours=None)
    created = {}
    for hours in (5, 1, 3, 1, 4, 2):   # out of order, and two leads due at the same time
        frozen.at(MONDAY_TEN + timedelta(hours=hours))
        created.setdefault(hours, []).append(new_lead(client, ws)["id"])
    frozen.at(None)
    expected = [lead for hours in sorted(created) for lead in sorted(created[hours])] + sorted(without)
    assert walk(client, ws, "/api/v1/leads?sort=response_due_at&page[size]=3") == expected
    assert walk(client, ws, "/api/v1/leads?sort=response_due_at&page[size]=1") == expected
    assert listed(client, ws, "sort=response_due_at&filter[sla]=overdue&page[size]=2") == expected[:2]


def test_filter_stale_selects_leads_whose_stale_since_has_passed(client, sla_workspace, frozen):
    ws, _ = sla_workspace(minutes=None, stale={"New": 3})
    frozen.at(MONDAY_TEN)
    stale, moved, won = new_lead(client, ws), new_lead(client, ws), new_lead(client, ws)
    move(client, ws, moved["id"], "Contacted")   # a status without stale_after_days
    for status in ("Contacted", "Qualified", "Proposal", "Won"):
        move(client, ws, won["id"], status)
    frozen.at(None)
    fresh = new_lead(client, ws)
    assert lead_of(client, ws, stale["id"])["stale_since"] == rfc3339(MONDAY_TEN + timedelta(days=3))
    assert lead_of(client, ws, moved["id"])["stale_since"] is None
    assert lead_of(client, ws, won["id"])["stale_since"] is None
    assert datetime.fromisoformat(fresh["stale_since"].rstrip("Z")) > utcnow() + timedelta(days=2)
    assert listed(client, ws, "filter[stale]=true") == [stale["id"]]
    assert set(listed(client, ws, "filter[stale]=false")) == {moved["id"], won["id"], fresh["id"]}
    response = client.get("/api/v1/leads?filter[stale]=sometimes", headers=ws.headers())
    assert response.status_code == 422 and "filter[stale]" in response.json["errors"]


def test_filter_stale_finds_a_lead_stale_the_shortest_setting_after_its_creation(client, sla_workspace, frozen):
    # filter[stale]=true also bounds created_at by the shortest stale_after_days: a lead at that
    # bound exactly is still found, and a workspace without the setting has no stale lead.
    ws, _ = sla_workspace(minutes=None, stale={"New": 3, "Contacted": 5})
    frozen.at(MONDAY_TEN)
    lead = new_lead(client, ws)
    for moment, found in ((MONDAY_TEN + timedelta(days=3), [lead["id"]]),
                          (MONDAY_TEN + timedelta(days=3, microseconds=-1), [])):
        frozen.monkeypatch.setattr(listing, "utcnow", lambda: moment)
        assert listed(client, ws, "filter[stale]=true") == found
    bare, _ = sla_workspace(minutes=None)
    frozen.at(None)
    new_lead(client, bare)
    assert listed(client, bare, "filter[stale]=true") == []
    assert len(listed(client, bare, "filter[stale]=false")) == 1


# --- the clock's timers ------------------------------------------------------------------------------

@pytest.fixture
def ticking(app):
    """A clock on the test's own time; what earlier tests of the run left armed is not this test's."""
    Timer.delete().execute()
    return Clock(app.config["LEADSVC"])


def watch(client, ws) -> None:
    """Events are written only for a webhook that wants them."""
    register_webhook(client, ws, "http://127.0.0.1:9/lead-timers", LEAD_TIMER_EVENTS)


def fired(lead_id: str, event_type: str | None = None) -> list[tuple[str, dict]]:
    """(type, data) of the timer events written for the lead, oldest first."""
    bodies = [jsoncodec.decode(event.body) for event in Event.select().where(Event.type.in_(LEAD_TIMER_EVENTS))
              .order_by(Event.id)]
    return [(body["type"], body["data"]) for body in bodies if body["data"]["lead"]["id"] == lead_id
            and event_type in (None, body["type"])]


def test_response_overdue_fires_once_when_the_due_time_passes_unanswered(client, sla_workspace, frozen, ticking):
    ws, _ = sla_workspace(minutes=60)
    watch(client, ws)
    frozen.at(MONDAY_TEN)
    lead = new_lead(client, ws)
    frozen.at(None)
    due = MONDAY_TEN + timedelta(hours=1)
    ticking.tick(due - timedelta(seconds=1))
    assert fired(lead["id"]) == []
    assert ticking.tick(due) == 1
    ticking.tick(due + timedelta(minutes=5))
    ticking.tick(utcnow())
    [(kind, data)] = fired(lead["id"])
    assert kind == "lead.response_overdue"
    assert data["lead"]["sla"] == sla(due) and data["lead"]["id"] == lead["id"]
    # A response after it was announced announces nothing more.
    log(client, ws, lead["id"], "call", due + timedelta(minutes=30))
    ticking.tick(utcnow() + timedelta(days=30))
    assert len(fired(lead["id"])) == 1


def test_a_response_before_the_due_time_disarms_response_overdue(client, sla_workspace, frozen, ticking):
    ws, _ = sla_workspace(minutes=60)
    watch(client, ws)
    frozen.at(MONDAY_TEN)
    called, moved = new_lead(client, ws), new_lead(client, ws)
    log(client, ws, called["id"], "call", MONDAY_TEN + timedelta(minutes=30))
    frozen.at(MONDAY_TEN + timedelta(minutes=40))
    move(client, ws, moved["id"], "Contacted")
    frozen.at(None)
    assert not Timer.select().where(Timer.subject.in_([internal_id(called["id"]), internal_id(moved["id"])])).exists()
    ticking.tick(utcnow() + timedelta(days=30))
    assert fired(called["id"]) == fired(moved["id"]) == []


def test_a_lead_goes_stale_once_per_episode_and_a_move_or_contact_starts_another(client, sla_workspace, frozen,
                                                                               ticking):
    ws, _ = sla_workspace(minutes=None, stale={"New": 3, "Contacted": 7})
    watch(client, ws)
    start = ist(2026, 10, 1, 12, 0)
    frozen.at(start)
    lead = new_lead(client, ws)
    assert lead["stale_since"] == rfc3339(start + timedelta(days=3))
    ticking.tick(start + timedelta(days=3) - timedelta(seconds=1))
    assert fired(lead["id"]) == []
    ticking.tick(start + timedelta(days=3))
    ticking.tick(start + timedelta(days=3, hours=5))
    assert [kind for kind, _ in fired(lead["id"])] == ["lead.stale"]
    assert fired(lead["id"])[0][1]["lead"]["stale_since"] == rfc3339(start + timedelta(days=3))

    # A contact four days in: stale again three days after it.
    frozen.at(start + timedelta(days=4))
    assert log(client, ws, lead["id"], "call", start + timedelta(days=4))["stale_since"] == \
        rfc3339(start + timedelta(days=7))
    # A contact dated before the last touch changes nothing.
    assert log(client, ws, lead["id"], "email", start + timedelta(days=1))["stale_since"] == \
        rfc3339(start + timedelta(days=7))
    ticking.tick(start + timedelta(days=7))
    assert len(fired(lead["id"], "lead.stale")) == 2

    # A move: Contacted's seven days from the move.
    frozen.at(start + timedelta(days=8))
    assert move(client, ws, lead["id"], "Contacted")["stale_since"] == rfc3339(start + timedelta(days=15))
    ticking.tick(start + timedelta(days=14))
    assert len(fired(lead["id"], "lead.stale")) == 2
    ticking.tick(start + timedelta(days=15))
    assert len(fired(lead["id"], "lead.stale")) == 3

    # Into a status without the setting: never stale, nothing armed.
    frozen.at(start + timedelta(days=16))
    assert move(client, ws, lead["id"], "Qualified")["stale_since"] is None
    assert not Timer.select().where(Timer.subject == internal_id(lead["id"])).exists()
    ticking.tick(start + timedelta(days=400))
    assert len(fired(lead["id"], "lead.stale")) == 3


def test_changing_stale_after_days_redates_a_status_leads_and_those_already_stale_fire_at_the_next_tick(
        client, sla_workspace, frozen, ticking):
    ws, data = sla_workspace(minutes=None, stale={"New": 10})
    watch(client, ws)
    # Times to the microsecond, and one on a whole second (stored without a fraction).
    now = utcnow().replace(microsecond=123456)
    older_at, newer_at, contacted_at = now - timedelta(days=5), (now - timedelta(days=1)).replace(microsecond=0), \
        now - timedelta(hours=1)
    frozen.at(older_at)
    older = new_lead(client, ws)
    frozen.at(newer_at)
    newer = new_lead(client, ws)
    frozen.at(contacted_at)
    contacted = new_lead(client, ws)
    log(client, ws, contacted["id"], "call", contacted_at)
    move(client, ws, contacted["id"], "Contacted")
    frozen.at(None)
    assert lead_of(client, ws, older["id"])["stale_since"] == rfc3339(older_at + timedelta(days=10))
    assert lead_of(client, ws, contacted["id"])["stale_since"] is None
    ticking.tick(now)
    assert fired(older["id"]) == fired(newer["id"]) == []

    reapply(data, minutes=None, stale={"New": 3, "Contacted": 2})
    assert lead_of(client, ws, older["id"])["stale_since"] == rfc3339(older_at + timedelta(days=3))
    assert lead_of(client, ws, newer["id"])["stale_since"] == rfc3339(newer_at + timedelta(days=3))
    assert lead_of(client, ws, contacted["id"])["stale_since"] == rfc3339(contacted_at + timedelta(days=2))
    assert listed(client, ws, "filter[stale]=true") == [older["id"]]
    ticking.tick(now)
    assert [kind for kind, _ in fired(older["id"])] == ["lead.stale"]
    assert fired(newer["id"]) == fired(contacted["id"]) == []
    ticking.tick(newer_at + timedelta(days=3) - timedelta(microseconds=1))
    assert fired(newer["id"]) == []
    ticking.tick(newer_at + timedelta(days=3))
    assert len(fired(newer["id"])) == len(fired(contacted["id"])) == 1
    assert len(fired(older["id"])) == 1

    # The setting taken away: no lead of the status is or goes stale, and nothing is armed for them.
    frozen.at(now)
    fresh = new_lead(client, ws)
    frozen.at(None)
    reapply(data, minutes=None, stale={"Contacted": 2})
    assert lead_of(client, ws, fresh["id"])["stale_since"] is None
    assert lead_of(client, ws, older["id"])["stale_since"] is None
    assert not Timer.select().where((Timer.kind == "lead.stale") & Timer.subject.in_(
        [internal_id(older["id"]), internal_id(newer["id"]), internal_id(fresh["id"])])).exists()
    ticking.tick(now + timedelta(days=30))
    assert fired(fresh["id"]) == []


def test_erased_leads_fire_nothing(client, sla_workspace, frozen, ticking):
    ws, _ = sla_workspace(minutes=60, stale={"New": 3})
    watch(client, ws)
    frozen.at(MONDAY_TEN)
    lead, kept = new_lead(client, ws), new_lead(client, ws)
    frozen.at(None)
    erased = client.post(f"/api/v1/leads/{lead['id']}/erase", json={"reason": "Asked to be forgotten"},
                         headers=ws.headers())
    assert erased.status_code == 200, erased.get_json()
    ticking.tick(MONDAY_TEN + timedelta(days=30))
    assert fired(lead["id"]) == []
    assert [kind for kind, _ in fired(kept["id"])] == ["lead.response_overdue", "lead.stale"]


# --- the lead document ------------------------------------------------------------------------------

def test_sla_and_stale_since_appear_in_the_lead_the_list_and_webhook_payloads(client, sla_workspace, frozen,
                                                                            ticking, receiver, deliverer):
    ws, _ = sla_workspace(minutes=60, stale={"New": 3})
    register_webhook(client, ws, receiver.url, ["lead.created", "lead.activity_logged", *LEAD_TIMER_EVENTS])
    frozen.at(MONDAY_TEN)
    lead = new_lead(client, ws)
    frozen.at(None)
    ticking.tick(MONDAY_TEN + timedelta(days=3))
    log(client, ws, lead["id"], "call", MONDAY_TEN + timedelta(days=3, hours=1))
    deliverer.deliver_due()

    shown = lead_of(client, ws, lead["id"])
    # Monday 10:00 to Thursday 11:00: 8.5 h on Monday, 9 h on Tuesday and Wednesday, 1.5 h on Thursday.
    answered = sla(MONDAY_TEN + timedelta(hours=1), MONDAY_TEN + timedelta(days=3, hours=1), 28 * 3600, "missed")
    assert shown["sla"] == answered
    assert shown["stale_since"] == rfc3339(MONDAY_TEN + timedelta(days=6, hours=1))
    [item] = [row for row in client.get("/api/v1/leads", headers=ws.headers()).json["data"] if row["id"] == lead["id"]]
    assert (item["sla"], item["stale_since"]) == (shown["sla"], shown["stale_since"])

    received = {event["type"]: event["data"]["lead"] for event in receiver.events()}
    assert sorted(received) == sorted(["lead.created", "lead.response_overdue", "lead.stale",
                                       "lead.activity_logged"])
    unanswered = sla(MONDAY_TEN + timedelta(hours=1))
    assert received["lead.created"]["sla"] == received["lead.response_overdue"]["sla"] == unanswered
    assert received["lead.created"]["stale_since"] == received["lead.stale"]["stale_since"] \
        == rfc3339(MONDAY_TEN + timedelta(days=3))
    assert (received["lead.activity_logged"]["sla"], received["lead.activity_logged"]["stale_since"]) \
        == (shown["sla"], shown["stale_since"])
