"""Jobs (DESIGN section 20): a member's deactivation, bulk changes and imports by API, each run in
batches by the clock (on the test's own ticks), with progress at GET /api/v1/jobs/{id}; a job
that a process stopped in the middle is finished by another, no item done twice; bad input
changes nothing."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from collections import Counter
from datetime import timedelta

import pytest

from conftest import WEBHOOK_TEST_ENV, bulk_leads, register_webhook
from leadsvc import jobs, jsoncodec
from leadsvc.clock import Clock
from leadsvc.models import AuditEntry, Event, Job, JobItem, Lead, Member, Task, Timer, utcnow
from served import clean_env, wait_until

ADMIN = "admin@t.test"


@pytest.fixture
def ticking(app):
    """A clock on the test's own ticks; what earlier tests of the run left armed is not this test's."""
    Timer.delete().execute()
    return Clock(app.config["LEADSVC"])


def run_job(clock: Clock, job_id: str, batches: int | None = None) -> Job:
    """Tick (one batch a tick) until the job finishes, or `batches` ticks; the job row."""
    ticks = 0
    while batches is None or ticks < batches:
        job = Job.get(Job.public_id == job_id)
        if job.state in ("succeeded", "failed"):
            return job
        # A batch that raised is tried again a minute later: a tick that fires nothing is a failure.
        assert clock.tick(utcnow() + timedelta(seconds=1)), f"the job's batch did not run: {job.state}, {job.done} done"
        ticks += 1
    return Job.get(Job.public_id == job_id)


def job_document(client, ws, job_id: str, email: str = ADMIN):
    response = client.get(f"/api/v1/jobs/{job_id}", headers=ws.headers(email))
    assert response.status_code == 200, response.json
    return response.json["data"]


def owned_by(ws, email: str) -> list[Lead]:
    return list(Lead.select().where(Lead.owner == ws.member(email).id).order_by(Lead.id))


def assigned_events(lead_ids: list[str]) -> Counter:
    """How many lead.assigned events each lead has."""
    bodies = [jsoncodec.decode(event.body) for event in Event.select().where(Event.type == "lead.assigned")]
    return Counter(body["data"]["lead"]["id"] for body in bodies if body["data"]["lead"]["id"] in lead_ids)


def updates_of(lead_ids: list[str]) -> Counter:
    """How many `updated` audit entries each lead has."""
    return Counter(lead_id for lead_id, in AuditEntry.select(Lead.public_id).join(Lead)
                   .where(Lead.public_id.in_(lead_ids) & (AuditEntry.action == "updated")).tuples())


# --- deactivation ------------------------------------------------------------------------------

def test_deactivation_revokes_tokens_at_once_and_a_job_reassigns_open_leads_with_their_tasks(
        client, ws, make_lead, ticking):
    register_webhook(client, ws, "http://127.0.0.1:9/jobs", ["lead.assigned"])
    leads = [make_lead(ws, owner="n1@t.test") for _ in range(30)]
    task = client.post(f"/api/v1/leads/{leads[0]['id']}/tasks", headers=ws.headers(),
                       json={"kind": "call", "title": "Call back", "due_at": "2030-01-01T10:00:00Z"}).json["data"]
    agent = ws.headers("n1@t.test")
    assert client.get("/api/v1/leads", headers=agent).status_code == 200
    lead_ids = [lead["id"] for lead in leads]
    before = assigned_events(lead_ids)

    response = client.post(f"/api/v1/members/{ws.ids.members['n1@t.test']}/deactivate",
                           json={"reassign_to": ws.ids.members["n2@t.test"]}, headers=ws.headers())
    assert response.status_code == 202, response.json
    job = response.json["data"]
    assert job["id"].startswith("job_") and job["kind"] == "deactivate" and job["state"] == "queued"
    assert job["total"] == 30 and job["done"] == 0 and job["finished_at"] is None
    assert client.get("/api/v1/leads", headers=agent).status_code == 401
    assert not ws.member("n1@t.test").active

    run_job(ticking, job["id"], batches=1)
    partway = job_document(client, ws, job["id"])
    assert partway["state"] == "running" and 0 < partway["done"] < 30
    finished = run_job(ticking, job["id"])
    document = job_document(client, ws, job["id"])
    assert document["state"] == "succeeded" and document["done"] == 30 and document["failed"] == 0
    assert document["finished_at"] is not None and finished.position == 30
    assert owned_by(ws, "n1@t.test") == [] and len(owned_by(ws, "n2@t.test")) == 30
    assert JobItem.select().where(JobItem.job == finished.id).count() == 0
    assert assigned_events(lead_ids) - before == Counter(lead_ids)   # one each
    moved = Task.get(Task.public_id == task["id"])
    assert moved.assignee_id == ws.member("n2@t.test").id
    audit = AuditEntry.select().join(Lead).where((Lead.public_id == leads[1]["id"]) & (AuditEntry.action == "updated"))
    assert [entry.changes["owner"]["new"] for entry in audit.order_by(AuditEntry.id)][-1] == ws.ids.members["n2@t.test"]


def test_deactivation_by_routing_gives_each_lead_to_an_active_agent(client, ws, make_lead, ticking):
    leads = [make_lead(ws, owner="n1@t.test") for _ in range(6)]
    response = client.post(f"/api/v1/members/{ws.ids.members['n1@t.test']}/deactivate",
                           json={"reassign_to": "routing"}, headers=ws.headers())
    assert response.status_code == 202, response.json
    assert run_job(ticking, response.json["data"]["id"]).state == "succeeded"
    owners = {Lead.get(Lead.public_id == lead["id"]).owner_id for lead in leads}
    assert ws.member("n1@t.test").id not in owners and None not in owners


@pytest.mark.parametrize("case", ["unknown_target", "target_inactive", "target_itself", "already_inactive",
                                  "yourself", "unknown_member", "bad_value"])
def test_deactivation_refuses_bad_input_and_changes_nothing(client, ws, make_lead, case):
    make_lead(ws, owner="n1@t.test")
    agent = ws.headers("n1@t.test")
    members = ws.ids.members
    subject, target, status = members["n1@t.test"], members["n2@t.test"], 422
    if case == "unknown_target":
        target = "mem_" + "x" * 20
    elif case == "target_inactive" or case == "already_inactive":
        Member.update(active=False).where(Member.public_id == (members["n2@t.test"] if case == "target_inactive"
                                                                else subject)).execute()
        status = 409 if case == "already_inactive" else 422
    elif case == "target_itself":
        target = subject
    elif case == "yourself":
        subject, status = members[ADMIN], 409
    elif case == "unknown_member":
        subject, status = "mem_" + "y" * 20, 404
    elif case == "bad_value":
        target = "everyone"
    jobs_before = Job.select().count()
    response = client.post(f"/api/v1/members/{subject}/deactivate", json={"reassign_to": target},
                           headers=ws.headers())
    assert response.status_code == status, response.json
    assert response.content_type == "application/problem+json"
    if status == 422:
        assert "reassign_to" in response.json["errors"]
    assert Job.select().count() == jobs_before
    if case != "already_inactive":
        assert ws.member("n1@t.test").active
        assert client.get("/api/v1/leads", headers=agent).status_code == 200


# --- a job stopped in the middle ---------------------------------------------------------------

def test_a_job_stopped_mid_way_is_finished_by_another_process_with_no_item_done_twice(
        client, ws, make_lead, make_app, ticking):
    leads = [make_lead(ws, owner="n1@t.test") for _ in range(60)]
    ids = [lead["id"] for lead in leads]
    before = updates_of(ids)
    response = client.post(f"/api/v1/members/{ws.ids.members['n1@t.test']}/deactivate",
                           json={"reassign_to": ws.ids.members["n2@t.test"]}, headers=ws.headers())
    job_id = response.json["data"]["id"]
    run_job(ticking, job_id, batches=1)
    stopped_at = Job.get(Job.public_id == job_id).done
    assert 0 < stopped_at < 60
    # The first process is gone; another app and clock (as after a restart) pick the job up.
    restarted = make_app()
    clock = Clock(restarted.config["LEADSVC"])
    assert run_job(clock, job_id).state == "succeeded"
    assert updates_of(ids) - before == Counter(ids)   # each lead once, none twice
    assert len(owned_by(ws, "n2@t.test")) == 60


# `leadsvc worker`, reading no config file but the environment's settings.
WORKER = [sys.executable, "-c", "from leadsvc.cli import cli; cli(prog_name='leadsvc')", "--config", os.devnull,
          "worker"]


@pytest.mark.slow
def test_a_worker_killed_mid_job_leaves_whole_batches_and_another_finishes_with_no_lead_done_twice(
        client, ws, database_url, tmp_path, ticking):
    bulk_leads(ws, 2400, random.Random(3))   # 800 open leads of n1, created without history
    leaving = ws.member("n1@t.test")
    ids = [lead_id for lead_id, in Lead.select(Lead.public_id).where(Lead.owner == leaving.id).tuples()]
    response = client.post(f"/api/v1/members/{leaving.public_id}/deactivate",
                           json={"reassign_to": ws.ids.members["n2@t.test"]}, headers=ws.headers())
    job_id = response.json["data"]["id"]
    env = clean_env(LEADSVC_DATABASE_URL=database_url, LEADSVC_CLOCK_INTERVAL="1", **WEBHOOK_TEST_ENV)

    def worker(name: str) -> subprocess.Popen:
        with open(tmp_path / f"{name}.log", "ab") as out:
            return subprocess.Popen(WORKER, env=env, stdout=out, stderr=subprocess.STDOUT)

    first = worker("first")
    try:
        wait_until(lambda: Job.get(Job.public_id == job_id).done >= 100, 120, "the first worker did some batches")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    job = Job.get(Job.public_id == job_id)
    assert job.state == "running" and 0 < job.done < len(ids) == job.total
    # What was committed is whole batches: the leads moved are exactly those the job counts done.
    assert Lead.select().where(Lead.public_id.in_(ids) & (Lead.owner == ws.member("n2@t.test").id)).count() == job.done
    second = worker("second")
    try:
        wait_until(lambda: Job.get(Job.public_id == job_id).state == "succeeded", 300, "the second worker finished")
    finally:
        second.terminate()
        second.wait(30)
    assert updates_of(ids) == Counter(ids)   # one `updated` audit entry per lead: none twice
    assert Lead.select().where(Lead.public_id.in_(ids) & (Lead.owner == leaving.id)).count() == 0


def test_a_batch_that_fails_undoes_its_items_and_is_done_again(client, ws, make_lead, ticking, monkeypatch):
    leads = [make_lead(ws, owner="n1@t.test") for _ in range(5)]
    response = client.post(f"/api/v1/members/{ws.ids.members['n1@t.test']}/deactivate",
                           json={"reassign_to": ws.ids.members["n2@t.test"]}, headers=ws.headers())
    job_id = response.json["data"]["id"]
    real = jobs.WORK["deactivate"]
    calls = []

    def crash_on_the_third(job, item, actor, refs):
        calls.append(item.position)
        real(job, item, actor, refs)
        if len(calls) == 3:
            raise RuntimeError("the process died")

    monkeypatch.setitem(jobs.WORK, "deactivate", crash_on_the_third)
    monkeypatch.setattr(jobs, "BATCH_SECONDS", 60)   # one batch takes all five, however slow the machine
    ticking.tick(utcnow() + timedelta(seconds=1))
    job = Job.get(Job.public_id == job_id)
    assert job.done == 0 and job.position == 0 and len(owned_by(ws, "n1@t.test")) == 5
    monkeypatch.setitem(jobs.WORK, "deactivate", real)
    # Tried again after the clock's retry delay.
    ticking.tick(utcnow() + timedelta(minutes=2))
    assert run_job(ticking, job_id).state == "succeeded"
    assert len(owned_by(ws, "n2@t.test")) == 5
    assert assigned_events([lead["id"] for lead in leads]) == Counter()   # no webhook wants them here


# --- who sees a job ----------------------------------------------------------------------------

def test_a_job_is_visible_to_its_creator_and_admins_only(client, ws, other_ws, make_lead):
    make_lead(ws, owner="n1@t.test")
    response = client.post("/api/v1/leads/bulk", headers=ws.headers("nmgr@t.test"),
                           json={"action": "move", "filter": {}, "params": {"status": ws.ids.statuses["Contacted"]}})
    assert response.status_code == 202, response.json
    job_id = response.json["data"]["id"]
    assert client.get(f"/api/v1/jobs/{job_id}", headers=ws.headers("nmgr@t.test")).status_code == 200
    assert client.get(f"/api/v1/jobs/{job_id}", headers=ws.headers(ADMIN)).status_code == 200
    assert client.get(f"/api/v1/jobs/{job_id}", headers=ws.headers("n1@t.test")).status_code == 404
    assert client.get(f"/api/v1/jobs/{job_id}", headers=other_ws.headers()).status_code == 404


# --- bulk changes ------------------------------------------------------------------------------

def test_a_bulk_move_counts_and_lists_the_leads_that_cannot_move_and_moves_the_others(client, ws, make_lead, ticking):
    leads = [make_lead(ws, owner="n1@t.test") for _ in range(4)]
    won = leads[0]["id"]
    for status in ("Contacted", "Qualified", "Proposal", "Won"):
        client.post(f"/api/v1/leads/{won}/status", json={"status": ws.ids.statuses[status]}, headers=ws.headers())
    ids = [lead["id"] for lead in leads]
    body = {"action": "move", "ids": ids, "params": {"status": ws.ids.statuses["Contacted"]}}
    dry = client.post("/api/v1/leads/bulk", json={**body, "dry_run": True}, headers=ws.headers())
    assert dry.status_code == 200 and dry.json == {"data": {"count": 4}}
    response = client.post("/api/v1/leads/bulk", json=body, headers=ws.headers())
    assert response.status_code == 202, response.json
    run_job(ticking, response.json["data"]["id"])
    job = job_document(client, ws, response.json["data"]["id"])
    assert job["state"] == "succeeded" and job["total"] == 4 and job["done"] == 4 and job["failed"] == 1
    assert job["errors"] == [{"item": won, "code": "conflict", "detail": job["errors"][0]["detail"]}]
    statuses = {lead_id: Lead.get(Lead.public_id == lead_id).status.public_id for lead_id in ids}
    assert [statuses[lead_id] for lead_id in ids[1:]] == [ws.ids.statuses["Contacted"]] * 3


def test_a_bulk_change_works_over_the_callers_scope_only(client, ws, make_lead, ticking):
    mine = [make_lead(ws, owner="n1@t.test")["id"] for _ in range(3)]
    theirs = make_lead(ws, owner="s1@t.test")["id"]
    body = {"action": "add_task", "filter": {"q": "Asha"},
            "params": {"kind": "call", "title": "Call about the offer", "due_at": "2030-01-01T10:00:00Z"}}
    response = client.post("/api/v1/leads/bulk", json=body, headers=ws.headers("nmgr@t.test"))
    assert response.status_code == 202, response.json
    assert run_job(ticking, response.json["data"]["id"]).state == "succeeded"
    with_task = {lead_id for lead_id, in Task.select(Lead.public_id).join(Lead, on=(Task.lead == Lead.id))
                 .where(Task.title == "Call about the offer").tuples()}
    assert set(mine) <= with_task and theirs not in with_task
    refused = client.post("/api/v1/leads/bulk", headers=ws.headers("nmgr@t.test"),
                          json={"action": "add_task", "ids": [theirs], "params": body["params"]})
    assert refused.status_code == 422 and "ids" in refused.json["errors"]


def test_bulk_assign_to_a_member_and_by_routing(client, ws, make_lead, ticking):
    leads = [make_lead(ws, owner="n1@t.test")["id"] for _ in range(3)]
    response = client.post("/api/v1/leads/bulk", headers=ws.headers(),
                           json={"action": "assign", "ids": leads, "params": {"owner": ws.ids.members["n2@t.test"]}})
    assert response.status_code == 202, response.json
    run_job(ticking, response.json["data"]["id"])
    assert {Lead.get(Lead.public_id == lead_id).owner_id for lead_id in leads} == {ws.member("n2@t.test").id}
    response = client.post("/api/v1/leads/bulk", headers=ws.headers(),
                           json={"action": "assign", "ids": leads, "params": {"routing": True}})
    assert response.status_code == 202, response.json
    assert run_job(ticking, response.json["data"]["id"]).state == "succeeded"
    assert None not in {Lead.get(Lead.public_id == lead_id).owner_id for lead_id in leads}


def test_bulk_needs_the_ability_of_its_action(client, ws, make_lead):
    lead = make_lead(ws)["id"]
    response = client.post("/api/v1/leads/bulk", headers=ws.headers(ADMIN, ("leads:read", "leads:update")),
                           json={"action": "move", "ids": [lead], "params": {"status": ws.ids.statuses["Contacted"]}})
    assert response.status_code == 403


@pytest.mark.parametrize("body, field", [
    ({"action": "move", "filter": {"colour": "red"}, "params": {"status": "{Contacted}"}}, "filter.colour"),
    ({"action": "move", "filter": {"status": "Contacted"}, "params": {"status": "{Contacted}"}}, "filter.status"),
    ({"action": "paint", "filter": {}, "params": {}}, "action"),
    ({"action": "move", "filter": {}, "params": {"owner": "{n2}"}}, "params.status"),
    ({"action": "move", "filter": {}, "params": {"status": "{Contacted}", "reason": "lr_" + "x" * 20}},
     "params.reason"),
    ({"action": "assign", "filter": {}, "params": {"status": "{Contacted}"}}, "params.status"),
    ({"action": "assign", "filter": {}, "params": {}}, "params.owner"),
    ({"action": "add_task", "filter": {}, "params": {"title": "No kind"}}, "params.kind"),
    ({"action": "move", "params": {"status": "{Contacted}"}}, "filter"),
    ({"action": "move", "filter": {}, "ids": [], "params": {"status": "{Contacted}"}}, "ids"),
    ({"action": "move", "ids": ["ld_" + "z" * 20], "params": {"status": "{Contacted}"}}, "ids"),
])
def test_bulk_refuses_bad_input_and_changes_nothing(client, ws, make_lead, body, field):
    make_lead(ws)

    def filled(value):
        if isinstance(value, dict):
            return {key: filled(item) for key, item in value.items()}
        if isinstance(value, str) and value.startswith("{"):
            name = value.strip("{}")
            return ws.ids.statuses.get(name) or ws.ids.members[f"{name}@t.test"]
        return value

    jobs_before = Job.select().count()
    response = client.post("/api/v1/leads/bulk", json=filled(body), headers=ws.headers())
    assert response.status_code == 422, response.json
    assert field in response.json["errors"], response.json
    assert Job.select().count() == jobs_before


def test_bulk_refuses_more_than_ten_thousand_leads_and_takes_ten_thousand_ids(client, ws):
    bulk_leads(ws, 10_001, random.Random(7))
    body = {"action": "move", "filter": {}, "params": {"status": ws.ids.statuses["Contacted"]}}
    jobs_before = Job.select().count()
    response = client.post("/api/v1/leads/bulk", json=body, headers=ws.headers())
    assert response.status_code == 422 and "filter" in response.json["errors"]
    ids = [lead_id for lead_id, in Lead.select(Lead.public_id)
           .where(Lead.workspace == ws.member(ADMIN).workspace_id).tuples()]
    del body["filter"]
    response = client.post("/api/v1/leads/bulk", json={**body, "ids": ids}, headers=ws.headers())
    assert response.status_code == 422 and "ids" in response.json["errors"]
    counted = client.post("/api/v1/leads/bulk", json={**body, "ids": ids[:10_000], "dry_run": True},
                          headers=ws.headers())   # far more than a JSON body may otherwise hold
    assert counted.status_code == 200 and counted.json == {"data": {"count": 10_000}}
    assert Job.select().count() == jobs_before


# --- imports -----------------------------------------------------------------------------------

CSV = "text/csv"


def test_an_import_creates_each_row_as_the_caller_and_reports_rows_that_fail(client, ws, ticking):
    rows = ["first_name,last_name,phone,email,source",
            "Asha,Rao,98765 11111,,Website",
            "Ravi,Kumar,12345,,Website",                      # row 3: not a mobile
            "",                                               # a blank line
            "Meera,Iyer,,meera.import@example.com,Nowhere",   # row 5: unknown source
            "Kiran,Das,98765 11111,,"]                        # row 6: a duplicate of row 2
    response = client.post("/api/v1/imports", data="\n".join(rows) + "\n", content_type=CSV,
                           headers=ws.headers("nmgr@t.test"))
    assert response.status_code == 202, response.json
    job_id = response.json["data"]["id"]
    assert response.json["data"]["kind"] == "import"
    assert run_job(ticking, job_id).state == "succeeded"
    job = job_document(client, ws, job_id, "nmgr@t.test")
    assert job["failed"] == 2 and job["done"] == job["total"] == 5
    assert [(error["item"], error["code"]) for error in job["errors"]] == [("row 3", "validation_failed"),
                                                                         ("row 5", "validation_failed")]
    assert "phone" in job["errors"][0]["detail"] and "source" in job["errors"][1]["detail"]
    created = Lead.get(Lead.phone == "+919876511111")
    assert created.channel == "import" and created.first_name == "Asha"


@pytest.mark.parametrize("body, content_type, status", [
    ("name,phone\nAsha,9876511112\n", CSV, 422),
    ("", CSV, 422),
    ("first_name,phone\nAsha,9876511112\n", "application/json", 415),
    ("first_name,phone\n\x00,9876511112\n", CSV, 422),
])
def test_an_import_that_cannot_be_read_is_refused_at_once_and_creates_nothing(client, ws, body, content_type, status):
    jobs_before, leads_before = Job.select().count(), Lead.select().count()
    response = client.post("/api/v1/imports", data=body, content_type=content_type, headers=ws.headers())
    assert response.status_code == status and response.content_type == "application/problem+json"
    if status == 422:
        assert "body" in response.json["errors"]
    assert (Job.select().count(), Lead.select().count()) == (jobs_before, leads_before)


def test_an_import_over_the_size_limit_is_413(make_app, ws):
    app = make_app(api={"max_import_bytes": 1000})
    body = "first_name,phone\n" + "Asha,9876511113\n" * 100
    response = app.test_client().post("/api/v1/imports", data=body, content_type=CSV, headers=ws.headers())
    assert response.status_code == 413 and response.json["code"] == "payload_too_large"
    small = app.test_client().post("/api/v1/imports", data="first_name,phone\nAsha,9876511113\n", content_type=CSV,
                                   headers=ws.headers())
    assert small.status_code == 202


def test_an_import_larger_than_a_json_body_is_taken(client, ws, ticking):
    body = "first_name,email\n" + "".join(f"Bulk,bulk.{i}.{ws.public_id.lower()}@example.com\n" for i in range(3000))
    assert len(body) > 65536
    response = client.post("/api/v1/imports", data=body, content_type=CSV, headers=ws.headers())
    assert response.status_code == 202 and response.json["data"]["total"] == 3000


def test_an_erasure_blanks_the_persons_rows_still_waiting_in_an_import(client, ws, ticking):
    body = "first_name,phone,email\nAsha,98765 22222,\nRavi,,ravi.waiting@example.com\nMeera,98765 33333,\n"
    job_id = client.post("/api/v1/imports", data=body, content_type=CSV, headers=ws.headers()).json["data"]["id"]
    for erasure in ({"phone": "+919876522222"}, {"email": "ravi.waiting@example.com"}):
        response = client.post("/api/v1/privacy/erasures", json={**erasure, "reason": "Asked to be forgotten"},
                               headers=ws.headers())
        assert response.status_code == 200, response.json
    cells = [item.data["cells"] for item in JobItem.select().join(Job).where(Job.public_id == job_id)
             .order_by(JobItem.position)]
    assert cells == [[], [], ["Meera", "98765 33333", ""]]
    assert run_job(ticking, job_id).state == "succeeded"
    assert not Lead.select().where(Lead.phone == "+919876522222").exists()
    assert Lead.select().where(Lead.phone == "+919876533333").exists()
