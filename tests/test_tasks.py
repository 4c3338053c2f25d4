"""Tasks: follow-ups on leads. The resource, its scope and assignee rules, what completing one logs,
what the lead keeps of its open tasks, and the bad input that changes nothing."""

from __future__ import annotations

from datetime import timedelta

import pytest

from conftest import ROLE_EMAILS
from leadsvc.fields import rfc3339
from leadsvc.models import Activity, AuditEntry, Lead, Member, Task, utcnow


def at(**delta) -> str:
    """An RFC 3339 time this far from now."""
    return rfc3339(utcnow() + timedelta(**delta))


def add_task(client, ws, lead_id, expect=201, as_member="admin@t.test", **fields):
    body = {"kind": "call", "title": "Call back about the villa", "due_at": at(days=1), **fields}
    response = client.post(f"/api/v1/leads/{lead_id}/tasks", json=body, headers=ws.headers(as_member))
    assert response.status_code == expect, response.get_json()
    return response.json["data"] if expect == 201 else response.json


def lead_of(client, ws, lead_id, query=""):
    return client.get(f"/api/v1/leads/{lead_id}{query}", headers=ws.headers()).json["data"]


def test_a_new_task_goes_to_the_leads_owner_and_shows_on_the_lead(client, ws, make_lead):
    lead = make_lead(ws, owner="n1@t.test")
    due = at(days=2)
    response = client.post(f"/api/v1/leads/{lead['id']}/tasks", json={"kind": "call", "title": " Call back ",
                                                                        "due_at": due}, headers=ws.headers())
    assert response.status_code == 201
    task = response.json["data"]
    assert response.headers["Location"].endswith(f"/api/v1/tasks/{task['id']}") and response.headers["ETag"]
    assert task["title"] == "Call back" and task["state"] == "open" and task["overdue"] is False
    assert task["assignee"]["id"] == ws.ids.members["n1@t.test"]
    assert task["lead"] == {"id": lead["id"], "full_name": "Asha Rao"}
    assert task["created_by"]["member"]["id"] == ws.ids.members["admin@t.test"]
    assert task["created_by"]["token"].startswith("tok_")
    shown = lead_of(client, ws, lead["id"])
    assert shown["open_tasks"] == 1 and shown["next_task_due_at"] == task["due_at"]
    row = Lead.get(Lead.public_id == lead["id"])
    assert [a.kind for a in Activity.select().where(Activity.lead == row.id).order_by(Activity.id)][-1] == "task_created"
    audit = AuditEntry.select().where(AuditEntry.lead == row.id).order_by(AuditEntry.id.desc()).first()
    assert audit.action == "task_created" and audit.changes["task"]["new"] == task["id"]


def test_a_task_document_built_by_hand_is_exactly_what_the_task_schema_publishes(client, ws, make_lead):
    from leadsvc.documents import TaskSchema

    lead = make_lead(ws, owner="n1@t.test")
    task = add_task(client, ws, lead["id"], remind_at=at(hours=2), notes="Ask about parking")
    done = client.post(f"/api/v1/tasks/{task['id']}/complete", json={"outcome": "Visiting Sunday"},
                       headers=ws.headers()).json["data"]
    listed = client.get("/api/v1/tasks?filter[state]=done", headers=ws.headers()).json["data"]
    for document in (task, done, *listed):
        assert TaskSchema().validate(document) == {} and set(TaskSchema().fields) == set(document)
    row = Task.get(Task.public_id == done["id"])
    times = ("due_at", "remind_at", "done_at", "created_at")
    assert TaskSchema(only=times).dump({name: getattr(row, name) for name in times}) == {
        name: done[name] for name in times}, "times as the schema writes them"


def test_a_task_reads_with_its_etag(client, ws, make_lead):
    task = add_task(client, ws, make_lead(ws, owner="n1@t.test")["id"])
    response = client.get(f"/api/v1/tasks/{task['id']}", headers=ws.headers("n1@t.test"))
    assert response.status_code == 200 and response.json["data"]["id"] == task["id"] and response.headers["ETag"]


def test_an_unowned_leads_task_goes_to_the_caller(client, ws, make_lead):
    lead = make_lead(ws)
    Lead.update(owner=None).where(Lead.public_id == lead["id"]).execute()
    task = add_task(client, ws, lead["id"])
    assert task["assignee"]["id"] == ws.ids.members["admin@t.test"]


@pytest.mark.parametrize("assignee, expect", [("n1@t.test", 201), ("nmgr@t.test", 201), ("admin@t.test", 201),
                                              ("n2@t.test", 422), ("smgr@t.test", 422), ("s1@t.test", 422)])
def test_the_assignee_must_see_the_lead(client, ws, make_lead, assignee, expect):
    lead = make_lead(ws, owner="n1@t.test")
    answer = add_task(client, ws, lead["id"], expect=expect, assignee=ws.ids.members[assignee])
    if expect == 422:
        assert "assignee" in answer["errors"]
        assert lead_of(client, ws, lead["id"])["open_tasks"] == 0


def test_a_deactivated_member_cannot_hold_a_task(client, ws, make_lead):
    lead = make_lead(ws, owner="n1@t.test")
    Member.update(active=False).where(Member.public_id == ws.ids.members["nmgr@t.test"]).execute()
    answer = add_task(client, ws, lead["id"], expect=422, assignee=ws.ids.members["nmgr@t.test"])
    assert "deactivated" in answer["errors"]["assignee"][0]


BAD_BODIES = [
    ({"due_at": "tomorrow"}, "due_at"),
    ({"due_at": "2026-12-01"}, "due_at"),
    ({"due_at": "2026-12-01T10:00:00"}, "due_at"),
    ({"remind_at": "2030-01-02T10:00:00Z", "due_at": "2030-01-01T10:00:00Z"}, "remind_at"),
    ({"kind": "fax"}, "kind"),
    ({"title": "x" * 201}, "title"),
    ({"title": "   "}, "title"),
    ({"assignee": "Neel"}, "assignee"),
    ({"surprise": 1}, "surprise"),
]


@pytest.mark.parametrize("fields, field", BAD_BODIES, ids=[b[1] + str(i) for i, b in enumerate(BAD_BODIES)])
def test_bad_input_is_422_and_creates_nothing(client, ws, make_lead, fields, field):
    lead = make_lead(ws, owner="n1@t.test")
    answer = add_task(client, ws, lead["id"], expect=422, **fields)
    assert answer["code"] == "validation_failed" and field in answer["errors"]
    assert Task.select().join(Lead, on=Task.lead == Lead.id).where(Lead.public_id == lead["id"]).count() == 0


def test_an_erased_lead_takes_no_task(client, ws, make_lead):
    lead = make_lead(ws, owner="n1@t.test")
    assert client.post(f"/api/v1/leads/{lead['id']}/erase", json={"reason": "asked"}, headers=ws.headers()).status_code == 200
    assert add_task(client, ws, lead["id"], expect=409)["code"] == "conflict"


def test_a_do_not_contact_lead_refuses_outreach_tasks_but_not_a_visit(client, ws, make_lead):
    lead = make_lead(ws, owner="n1@t.test")
    client.patch(f"/api/v1/leads/{lead['id']}", json={"do_not_contact": True}, headers=ws.headers())
    assert add_task(client, ws, lead["id"], expect=409, kind="whatsapp")["code"] == "conflict"
    add_task(client, ws, lead["id"], kind="visit")


def test_completing_a_call_logs_the_call_as_the_activities_route_does(client, ws, make_lead):
    lead = make_lead(ws, owner="n1@t.test")
    task = add_task(client, ws, lead["id"])
    response = client.post(f"/api/v1/tasks/{task['id']}/complete", json={"outcome": "Wants a site visit"},
                           headers=ws.headers("n1@t.test"))
    assert response.status_code == 200
    done = response.json["data"]
    assert done["state"] == "done" and done["done_at"] and done["outcome"] == "Wants a site visit"
    after = lead_of(client, ws, lead["id"], "?include=activities")
    assert after["last_activity_at"] and after["score"] > lead["score"]
    assert after["open_tasks"] == 0 and after["next_task_due_at"] is None
    call = next(a for a in after["activities"] if a["kind"] == "call")
    assert call["summary"] == "Wants a site visit" and call["data"] == {"task": task["id"]}
    again = client.post(f"/api/v1/tasks/{task['id']}/complete", json={}, headers=ws.headers())
    assert again.status_code == 409


def test_completing_a_visit_scores_like_a_meeting(client, ws, make_lead):
    lead = make_lead(ws, owner="n1@t.test")
    task = add_task(client, ws, lead["id"], kind="visit")
    assert client.post(f"/api/v1/tasks/{task['id']}/complete", json={}, headers=ws.headers()).status_code == 200
    after = lead_of(client, ws, lead["id"], "?include=activities")
    assert after["activities"][0]["kind"] == "visit" and after["activities"][0]["summary"] == task["title"]
    assert {"reason": "engagement", "points": 10} in after["score_reasons"]


def test_completing_a_todo_logs_task_completed(client, ws, make_lead):
    lead = make_lead(ws, owner="n1@t.test")
    task = add_task(client, ws, lead["id"], kind="todo", title="Send the brochure")
    assert client.post(f"/api/v1/tasks/{task['id']}/complete", json={}, headers=ws.headers()).status_code == 200
    after = lead_of(client, ws, lead["id"], "?include=activities")
    assert after["activities"][0]["kind"] == "task_completed" and after["last_activity_at"] is None


def test_a_task_completes_without_a_body_and_summarizes_by_its_title(client, ws, make_lead):
    lead = make_lead(ws, owner="n1@t.test")
    task = add_task(client, ws, lead["id"], kind="todo", title="Send the brochure")
    done = client.post(f"/api/v1/tasks/{task['id']}/complete", headers=ws.headers())
    assert done.status_code == 200 and done.json["data"]["state"] == "done" and done.json["data"]["outcome"] is None
    assert lead_of(client, ws, lead["id"], "?include=activities")["activities"][0]["summary"] == "Send the brochure"
    again = client.post(f"/api/v1/tasks/{task['id']}/complete", data="[]", content_type="application/json",
                        headers=ws.headers())
    assert again.status_code == 422 and "body" in again.json["errors"]


def test_completing_a_call_on_a_do_not_contact_lead_is_409_and_changes_nothing(client, ws, make_lead):
    lead = make_lead(ws, owner="n1@t.test")
    task = add_task(client, ws, lead["id"])
    client.patch(f"/api/v1/leads/{lead['id']}", json={"do_not_contact": True}, headers=ws.headers())
    response = client.post(f"/api/v1/tasks/{task['id']}/complete", json={"outcome": "x"}, headers=ws.headers())
    assert response.status_code == 409
    assert client.get(f"/api/v1/tasks/{task['id']}", headers=ws.headers()).json["data"]["state"] == "open"
    assert lead_of(client, ws, lead["id"])["open_tasks"] == 1


def test_cancelling_moves_the_next_task_and_logs_task_cancelled(client, ws, make_lead):
    lead = make_lead(ws, owner="n1@t.test")
    first = add_task(client, ws, lead["id"], due_at=at(hours=3))
    second = add_task(client, ws, lead["id"], due_at=at(days=3))
    assert lead_of(client, ws, lead["id"])["next_task_due_at"] == first["due_at"]
    response = client.post(f"/api/v1/tasks/{first['id']}/cancel", headers=ws.headers())
    assert response.status_code == 200 and response.json["data"]["state"] == "cancelled"
    after = lead_of(client, ws, lead["id"], "?include=activities,tasks")
    assert after["next_task_due_at"] == second["due_at"] and after["open_tasks"] == 1
    assert [t["id"] for t in after["tasks"]] == [second["id"]]
    assert after["activities"][0]["kind"] == "task_cancelled"
    assert client.post(f"/api/v1/tasks/{first['id']}/cancel", headers=ws.headers()).status_code == 409


def test_patch_moves_the_due_time_and_honours_if_match(client, ws, make_lead):
    lead = make_lead(ws, owner="n1@t.test")
    task = add_task(client, ws, lead["id"])
    tag = client.get(f"/api/v1/tasks/{task['id']}", headers=ws.headers()).headers["ETag"]
    later = at(days=5)
    response = client.patch(f"/api/v1/tasks/{task['id']}", json={"due_at": later, "title": "Call again"},
                            headers={**ws.headers(), "If-Match": tag})
    assert response.status_code == 200 and response.json["data"]["title"] == "Call again"
    assert lead_of(client, ws, lead["id"])["next_task_due_at"] == response.json["data"]["due_at"]
    stale = client.patch(f"/api/v1/tasks/{task['id']}", json={"title": "Again"}, headers={**ws.headers(), "If-Match": tag})
    assert stale.status_code == 412
    done = client.post(f"/api/v1/tasks/{task['id']}/complete", json={}, headers={**ws.headers(), "If-Match": tag})
    assert done.status_code == 412


def test_patch_refuses_a_reminder_after_the_due_time_and_a_closed_task(client, ws, make_lead):
    lead = make_lead(ws, owner="n1@t.test")
    task = add_task(client, ws, lead["id"], due_at="2030-01-01T10:00:00Z")
    response = client.patch(f"/api/v1/tasks/{task['id']}", json={"remind_at": "2030-01-01T11:00:00Z"},
                            headers=ws.headers())
    assert response.status_code == 422 and "remind_at" in response.json["errors"]
    client.post(f"/api/v1/tasks/{task['id']}/cancel", headers=ws.headers())
    assert client.patch(f"/api/v1/tasks/{task['id']}", json={"title": "x"}, headers=ws.headers()).status_code == 409


def test_open_tasks_follow_a_change_of_owner(client, ws, make_lead):
    lead = make_lead(ws, owner="n1@t.test")
    mine = add_task(client, ws, lead["id"])
    managers = add_task(client, ws, lead["id"], assignee=ws.ids.members["nmgr@t.test"])
    closed = add_task(client, ws, lead["id"])
    client.post(f"/api/v1/tasks/{closed['id']}/cancel", headers=ws.headers())
    moved = client.patch(f"/api/v1/leads/{lead['id']}", json={"owner": ws.ids.members["s1@t.test"]},
                         headers=ws.headers())
    assert moved.status_code == 200
    assignee = {t: client.get(f"/api/v1/tasks/{t}", headers=ws.headers()).json["data"]["assignee"]["id"]
                for t in (mine["id"], managers["id"], closed["id"])}
    assert assignee == {mine["id"]: ws.ids.members["s1@t.test"], managers["id"]: ws.ids.members["nmgr@t.test"],
                        closed["id"]: ws.ids.members["n1@t.test"]}
    # The lead left the North team: its tasks left n1's and the North manager's scope with it.
    assert client.get(f"/api/v1/tasks/{mine['id']}", headers=ws.headers("n1@t.test")).status_code == 404
    assert client.get(f"/api/v1/tasks/{managers['id']}", headers=ws.headers("nmgr@t.test")).status_code == 404
    assert client.get(f"/api/v1/tasks/{mine['id']}", headers=ws.headers("s1@t.test")).status_code == 200


def test_a_task_on_an_invisible_lead_is_404_to_every_route(client, ws, make_lead):
    task = add_task(client, ws, make_lead(ws, owner="s1@t.test")["id"])
    for method, path in (("GET", ""), ("PATCH", ""), ("POST", "/complete"), ("POST", "/cancel")):
        response = client.open(f"/api/v1/tasks/{task['id']}{path}", method=method, json={},
                               headers=ws.headers("n1@t.test"))
        assert response.status_code == 404, (method, path)
    assert Task.get(Task.public_id == task["id"]).state == "open"


# --- lists -------------------------------------------------------------------------------------

def test_the_leads_tasks_list_open_first_by_due_then_closed_most_recent_first(client, ws, make_lead):
    lead = make_lead(ws, owner="n1@t.test")
    late = add_task(client, ws, lead["id"], due_at=at(days=4))
    soon = add_task(client, ws, lead["id"], due_at=at(days=1))
    done_first = add_task(client, ws, lead["id"])
    done_last = add_task(client, ws, lead["id"])
    client.post(f"/api/v1/tasks/{done_first['id']}/complete", json={}, headers=ws.headers())
    client.post(f"/api/v1/tasks/{done_last['id']}/cancel", headers=ws.headers())
    seen, url = [], f"/api/v1/leads/{lead['id']}/tasks?page[size]=1"
    while url:
        page = client.get(url, headers=ws.headers("n1@t.test")).json
        seen += [t["id"] for t in page["data"]]
        url = page["links"]["next"]
    assert seen == [soon["id"], late["id"], done_last["id"], done_first["id"]]


def test_the_task_list_is_the_callers_scope_with_its_filters(client, ws, make_lead):
    north = make_lead(ws, owner="n1@t.test")
    south = make_lead(ws, owner="s1@t.test")
    overdue = add_task(client, ws, north["id"], due_at=at(hours=-2), kind="whatsapp")
    later = add_task(client, ws, north["id"], due_at=at(days=20), assignee=ws.ids.members["nmgr@t.test"])
    theirs = add_task(client, ws, south["id"], due_at=at(hours=-1))

    def ids(email, query=""):
        response = client.get(f"/api/v1/tasks{query}", headers=ws.headers(email))
        assert response.status_code == 200, response.json
        return [t["id"] for t in response.json["data"]]

    assert ids("n1@t.test", f"?filter[lead]={north['id']},{south['id']}") == [overdue["id"], later["id"]]
    assert ids("nmgr@t.test", "?filter[assignee]=me") == [later["id"]]
    assert ids("admin@t.test", f"?filter[lead]={north['id']},{south['id']}&filter[due]=overdue") == [
        overdue["id"], theirs["id"]]
    assert ids("admin@t.test", f"?filter[lead]={north['id']}&filter[kind]=whatsapp") == [overdue["id"]]
    assert ids("s1@t.test", f"?filter[assignee]={ws.ids.members['n1@t.test']}") == []
    client.post(f"/api/v1/tasks/{overdue['id']}/complete", json={}, headers=ws.headers())
    assert ids("n1@t.test", f"?filter[lead]={north['id']}") == [later["id"]]
    assert ids("n1@t.test", f"?filter[lead]={north['id']}&filter[state]=done,open&sort=-done_at") == [
        overdue["id"], later["id"]]


def test_filter_due_today_is_the_workspaces_day(client, ws, make_lead):
    lead = make_lead(ws, owner="n1@t.test")
    in_a_week = add_task(client, ws, lead["id"], due_at=at(days=8))
    response = client.get(f"/api/v1/tasks?filter[lead]={lead['id']}&filter[due]=next_7_days", headers=ws.headers())
    assert response.status_code == 200 and in_a_week["id"] not in [t["id"] for t in response.json["data"]]
    response = client.get(f"/api/v1/tasks?filter[lead]={lead['id']}&filter[due]=2000-01-01..", headers=ws.headers())
    assert [t["id"] for t in response.json["data"]] == [in_a_week["id"]]


@pytest.mark.parametrize("query, key", [("filter[due]=yesterday", "filter[due]"), ("filter[due]=soon", "filter[due]"),
                                        ("filter[state]=closed", "filter[state]"),
                                        ("filter[assignee]=Neel", "filter[assignee]"),
                                        ("filter[kind]=fax", "filter[kind]"), ("filter[lead]=mem_x", "filter[lead]"),
                                        ("sort=-due_at", "sort"), ("page[after]=garbage", "page[after]")])
def test_a_task_filter_of_the_wrong_shape_is_422(client, ws, query, key):
    response = client.get(f"/api/v1/tasks?{query}", headers=ws.headers())
    assert response.status_code == 422 and key in response.json["errors"]


def test_an_unknown_task_filter_gives_an_empty_page_naming_it(client, ws):
    response = client.get("/api/v1/tasks?filter[colour]=red", headers=ws.headers())
    assert response.status_code == 200 and response.json["meta"]["unknown_filters"] == ["filter[colour]"]


def test_task_pages_follow_their_cursor(client, ws, make_lead):
    lead = make_lead(ws, owner="n1@t.test")
    made = [add_task(client, ws, lead["id"], due_at=at(days=1 + n))["id"] for n in range(5)]
    seen, url = [], f"/api/v1/tasks?filter[lead]={lead['id']}&page[size]=2"
    while url:
        page = client.get(url, headers=ws.headers()).json
        seen += [t["id"] for t in page["data"]]
        url = page["links"]["next"]
    assert seen == made


# --- the lead list ------------------------------------------------------------------------------

def test_the_lead_list_filters_and_sorts_by_the_next_task(client, ws, make_lead):
    overdue, today, later, none = (make_lead(ws, owner="n2@t.test") for _ in range(4))
    add_task(client, ws, overdue["id"], due_at=at(minutes=-5))
    add_task(client, ws, later["id"], due_at=at(days=3))
    add_task(client, ws, today["id"], due_at=at(seconds=30))
    mine = {lead["id"] for lead in (overdue, today, later, none)}

    def ids(query):
        response = client.get(f"/api/v1/leads?{query}&page[size]=200", headers=ws.headers("n2@t.test"))
        assert response.status_code == 200, response.json
        return [lead["id"] for lead in response.json["data"] if lead["id"] in mine]

    assert ids("filter[next_task]=overdue") == [overdue["id"]]
    assert set(ids("filter[next_task]=scheduled")) == {overdue["id"], today["id"], later["id"]}
    assert ids("filter[next_task]=none") == [none["id"]]
    assert ids("sort=next_task_due_at") == [overdue["id"], today["id"], later["id"], none["id"]]
    seen, url = [], "/api/v1/leads?sort=next_task_due_at&page[size]=1"
    while url:
        page = client.get(url, headers=ws.headers("n2@t.test")).json
        seen += [lead["id"] for lead in page["data"] if lead["id"] in mine]
        url = page["links"]["next"]
    assert seen == [overdue["id"], today["id"], later["id"], none["id"]]
    assert client.get("/api/v1/leads?filter[next_task]=soon", headers=ws.headers()).status_code == 422


def test_the_export_has_the_next_task_due_time(client, ws, make_lead):
    lead = make_lead(ws, owner="n1@t.test")
    task = add_task(client, ws, lead["id"])
    text = client.get("/api/v1/leads/export.csv", headers=ws.headers("n1@t.test")).get_data(as_text=True)
    header, *rows = text.splitlines()
    column = header.split(",").index("next_task_due_at")
    row = next(r for r in rows if r.startswith(lead["id"]))
    assert row.split(",")[column] == task["due_at"]


# --- events and privacy -------------------------------------------------------------------------

def test_task_changes_send_their_events_with_the_task_and_the_lead(client, ws, make_lead):
    from leadsvc import jsoncodec
    from leadsvc.models import Event

    client.post("/api/v1/webhooks", json={"url": "http://127.0.0.1:9/tasks", "events": [
        "task.created", "task.updated", "task.completed", "task.cancelled"]}, headers=ws.headers())
    lead = make_lead(ws, owner="n1@t.test")
    first = add_task(client, ws, lead["id"])
    second = add_task(client, ws, lead["id"])
    client.patch(f"/api/v1/tasks/{first['id']}", json={"title": "Call at noon"}, headers=ws.headers())
    client.post(f"/api/v1/tasks/{first['id']}/complete", json={}, headers=ws.headers())
    client.post(f"/api/v1/tasks/{second['id']}/cancel", headers=ws.headers())
    row = Lead.get(Lead.public_id == lead["id"])
    bodies = [jsoncodec.decode(e.body) for e in Event.select().where(Event.lead == row.id).order_by(Event.id)]
    assert [b["type"] for b in bodies] == ["task.created", "task.created", "task.updated", "task.completed",
                                            "task.cancelled"]
    assert bodies[2]["data"]["changes"] == {"title": {"old": "Call back about the villa", "new": "Call at noon"}}
    assert bodies[3]["data"]["task"]["state"] == "done" and bodies[3]["data"]["lead"]["open_tasks"] == 1
    assert bodies[4]["data"]["lead"]["id"] == lead["id"] and bodies[4]["data"]["lead"]["open_tasks"] == 0


def test_erasure_clears_task_text_and_keeps_kinds_and_times(client, ws, make_lead):
    lead = make_lead(ws, owner="n1@t.test")
    task = add_task(client, ws, lead["id"], notes="Her husband decides")
    client.post(f"/api/v1/tasks/{task['id']}/complete", json={"outcome": "Asha will visit"}, headers=ws.headers())
    subject = client.get(f"/api/v1/privacy/subject?phone={lead['contact']['phone'].replace('+', '%2B')}",
                         headers=ws.headers()).json["data"]["leads"][0]
    assert [t["outcome"] for t in subject["tasks"]] == ["Asha will visit"]
    client.post(f"/api/v1/leads/{lead['id']}/erase", json={"reason": "asked"}, headers=ws.headers())
    erased = client.get(f"/api/v1/tasks/{task['id']}", headers=ws.headers()).json["data"]
    assert (erased["title"], erased["notes"], erased["outcome"]) == (None, None, None)
    assert erased["kind"] == "call" and erased["due_at"] == task["due_at"] and erased["done_at"]
    assert erased["lead"]["full_name"] is None
    row = Lead.get(Lead.public_id == lead["id"])
    created = AuditEntry.get((AuditEntry.lead == row.id) & (AuditEntry.action == "task_created"))
    assert created.changes["title"]["new"] == "[erased]" and created.changes["notes"]["new"] == "[erased]"
    assert created.changes["kind"]["new"] == "call"


def test_an_agent_holding_tasks_write_works_its_own_leads(client, ws, make_lead):
    lead = make_lead(ws, owner="n1@t.test")
    agent = ROLE_EMAILS["agent"]
    task = add_task(client, ws, lead["id"], as_member=agent)
    response = client.post(f"/api/v1/tasks/{task['id']}/complete", json={"outcome": "Done"},
                           headers=ws.headers(agent, ("leads:read", "tasks:write")))
    assert response.status_code == 200
    refused = client.post(f"/api/v1/leads/{lead['id']}/tasks", json={"kind": "todo", "title": "x", "due_at": at(days=1)},
                          headers=ws.headers(agent, ("leads:read",)))
    assert refused.status_code == 403


@pytest.mark.only_on("sqlite")
def test_migrating_a_database_with_statistics_keeps_the_lead_lists_on_their_indexes(backend, tmp_path, request):
    """A SQLite database with planner statistics (a bulk load gathers them) but none for the lead's
    new task_sort_at indexes would have its planner take those for the best, and sort a whole
    workspace for every other sort's first page: 0017 gathers theirs."""
    from datetime import datetime

    import peewee as pw

    from conftest import fresh_database
    from leadsvc.db import MigrationRunner
    from leadsvc.models import new_public_id

    db = fresh_database(backend, tmp_path, request)
    runner = MigrationRunner(db, table_name="schema_migration")
    with db.atomic():
        runner.up(target="0016_timers")
    now = datetime(2026, 1, 1)
    pw.Table("workspace").bind(db).insert(public_id=new_public_id("ws_"), name="Stats", timezone="Asia/Kolkata",
                                          currency="INR", created_at=now, refs_version=0).execute()
    workspace = db.execute_sql("SELECT id FROM workspace").fetchone()[0]
    status = pw.Table("status").bind(db).insert(workspace_id=workspace, public_id=new_public_id("st_"), name="New",
                                                position=1, kind="open").execute()
    leads = pw.Table("lead").bind(db)
    for n in range(300):
        leads.insert(workspace_id=workspace, public_id=new_public_id("ld_"), status_id=status, first_name="Asha",
                     last_name="Rao", custom_fields="{}",
                     score_reasons="[]", score=n % 7, engagement=0, version=1, created_at=now, updated_at=now,
                     status_changed_at=now, activity_sort_at=now).execute()
    db.execute_sql("ANALYZE")
    with db.atomic():
        runner.up()
    plan = " ".join(str(row[-1]) for row in db.execute_sql(
        'EXPLAIN QUERY PLAN SELECT id FROM lead WHERE workspace_id = ? ORDER BY created_at DESC, public_id DESC '
        'LIMIT 51', (workspace,)))
    assert "lead_workspace_id_created_at_public_id" in plan and "TEMP B-TREE" not in plan, plan
