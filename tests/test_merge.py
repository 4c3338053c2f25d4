"""Merging duplicates and undoing a merge (DESIGN section 21): the field rule and `prefer`, the
history that moves, tombstones out of every list and report but still matched as duplicates, the
problem a merged id answers, bad input, undo, erasure and subject access, and races."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from conftest import FORM_ORIGIN, email_lead_body, register_webhook, with_form
from leadsvc.models import Activity, AuditEntry, Event, Lead, Merge, MergeMove, Task, Transition, utcnow
from served import call

ADMIN = "admin@t.test"


def post(client, ws, path, body=None, email=ADMIN):
    return client.post(path, json=body, headers=ws.headers(email))


def get(client, ws, path, email=ADMIN):
    return client.get(path, headers=ws.headers(email))


def merge(client, ws, survivor, *duplicates, expect=200, email=ADMIN, **body):
    response = post(client, ws, f"/api/v1/leads/{survivor}/merge", {"duplicates": list(duplicates), **body}, email)
    assert response.status_code == expect, response.get_json()
    return response.json


def with_history(client, ws, lead_id):
    """A note, a call, a stage move and an open task on the lead."""
    path = f"/api/v1/leads/{lead_id}"
    assert post(client, ws, f"{path}/notes", {"body": "Prefers evenings"}).status_code == 201
    assert post(client, ws, f"{path}/activities", {"kind": "call", "summary": "Called"}).status_code == 201
    assert post(client, ws, f"{path}/status", {"status": ws.ids.statuses["Contacted"]}).status_code == 200
    due = (utcnow() + timedelta(days=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert post(client, ws, f"{path}/tasks", {"kind": "call", "title": "Call back", "due_at": due}).status_code == 201


def history_counts(lead_id: str) -> dict[str, int]:
    lead = Lead.get(Lead.public_id == lead_id)
    return {model.__name__: model.select().where(model.lead == lead.id).count()
            for model in (Activity, Transition, Task, AuditEntry)}


def everything(client, ws, lead_id):
    return get(client, ws, f"/api/v1/leads/{lead_id}?include=activities,notes,tasks").json["data"]


# --- merging -----------------------------------------------------------------------------------

def test_a_merge_keeps_the_survivor_fills_its_empty_fields_and_moves_the_history(client, ws, make_lead):
    survivor = make_lead(ws, first_name="Asha", last_name=None, email=None,
                         custom_fields={"product_interest": "villa"})
    first = make_lead(ws, phone=None, **email_lead_body(first_name="A.", last_name="Rao", estimated_value=900000,
                                                        custom_fields={"product_interest": "2bhk", "family_size": 4}))
    second = make_lead(ws, first_name="Someone", last_name="Else", source=ws.ids.sources["Referral"])
    with_history(client, ws, first["id"])
    moved = history_counts(first["id"])
    kept = history_counts(survivor["id"])

    answer = merge(client, ws, survivor["id"], first["id"], second["id"])
    lead = answer["data"]
    assert answer["merge"]["id"].startswith("mrg_") and answer["merge"]["merged"] == [first["id"], second["id"]]
    assert lead["id"] == survivor["id"] and lead["owner"] == survivor["owner"]
    assert lead["contact"]["first_name"] == "Asha" and lead["contact"]["last_name"] == "Rao"
    assert lead["contact"]["phone"] == survivor["contact"]["phone"]
    assert lead["contact"]["email"] == first["contact"]["email"]
    assert lead["estimated_value"] == 900000.0 and lead["source"] == survivor["source"]
    assert lead["custom_fields"] == {"product_interest": "villa", "family_size": 4}
    assert lead["open_tasks"] == 1

    after = history_counts(survivor["id"])
    assert after["Activity"] > kept["Activity"] + moved["Activity"]   # the second's too
    assert after["Transition"] == kept["Transition"] + moved["Transition"] + 1   # second's first transition
    assert history_counts(first["id"]) == {"Activity": 0, "Transition": 0, "Task": 0, "AuditEntry": 0}
    shown = everything(client, ws, survivor["id"])
    assert [note["body"] for note in shown["notes"]] == ["Prefers evenings"]
    assert any(activity["kind"] == "call" for activity in shown["activities"])
    audit = get(client, ws, f"/api/v1/leads/{survivor['id']}/audit?page[size]=200").json["data"]
    merged_entries = [entry for entry in audit if entry["action"] == "merged"]
    assert len(merged_entries) == 1
    assert any(entry["action"] == "note_added" for entry in audit)   # the duplicate's, moved


def test_a_merged_id_is_a_404_naming_its_survivor_and_leaves_every_list(client, ws, make_lead):
    survivor, duplicate = make_lead(ws, "n1@t.test", first_name="Meera"), make_lead(ws, first_name="Meera")
    merge(client, ws, survivor["id"], duplicate["id"])
    gone = get(client, ws, f"/api/v1/leads/{duplicate['id']}")
    assert gone.status_code == 404 and gone.json["code"] == "not_found"
    assert gone.json["merged_into"] == survivor["id"]
    assert gone.headers["Content-Type"] == "application/problem+json"
    # An agent who does not see the survivor learns nothing of it.
    hidden = get(client, ws, f"/api/v1/leads/{duplicate['id']}", email="s1@t.test")
    assert hidden.status_code == 404 and "merged_into" not in hidden.json
    listed = [lead["id"] for lead in get(client, ws, "/api/v1/leads?page[size]=200").json["data"]]
    assert survivor["id"] in listed and duplicate["id"] not in listed
    found = [lead["id"] for lead in get(client, ws, "/api/v1/leads?q=meera").json["data"]]
    assert found == [survivor["id"]]
    by_phone = get(client, ws, f"/api/v1/leads?q={duplicate['contact']['phone'][-6:]}").json["data"]
    assert by_phone == []
    exported = get(client, ws, "/api/v1/leads/export.csv").get_data(as_text=True)
    assert survivor["id"] in exported and duplicate["id"] not in exported
    funnel = get(client, ws, "/api/v1/reports/funnel").json["data"]
    conversion = get(client, ws, "/api/v1/reports/conversion").json["data"]
    assert funnel["leads"] == 1 and funnel["stages"][0]["reached"] == 1
    assert conversion["overall"]["leads"] == 1


def test_every_contact_of_the_merged_leads_finds_the_survivor(client, ws, make_lead):
    survivor = make_lead(ws)
    duplicate = make_lead(ws, phone=None, **email_lead_body())
    third = make_lead(ws)
    merge(client, ws, survivor["id"], duplicate["id"], third["id"], prefer={"phone": third["id"]})
    # The survivor took the third's phone: its own stays matched, through the third's tombstone.
    for sent in ({"phone": survivor["contact"]["phone"]}, {"phone": third["contact"]["phone"]},
                 {"email": duplicate["contact"]["email"]}):
        again = post(client, ws, "/api/v1/leads", {**sent, "first_name": "Back"})
        assert again.status_code == 200 and again.json["duplicate"] is True, again.json
        assert again.json["data"]["id"] == survivor["id"]
        assert again.json["matched_on"] == list(sent)
    batch = post(client, ws, "/api/v1/leads/batch", {"leads": [{"phone": third["contact"]["phone"]}]}).json
    assert batch["data"][0]["status"] == 200 and batch["data"][0]["lead"]["id"] == survivor["id"]
    upsert = post(client, ws, "/api/v1/leads", {"email": duplicate["contact"]["email"], "last_name": "Filled",
                                                "on_duplicate": "fill_empty"}).json
    assert upsert["data"]["id"] == survivor["id"]
    # A PATCH to a merged lead's phone is the 409 of a phone another lead has.
    taken = client.patch(f"/api/v1/leads/{make_lead(ws)['id']}", json={"phone": survivor["contact"]["phone"]},
                         headers=ws.headers())
    assert taken.status_code == 409


def test_a_web_form_submission_with_a_merged_leads_phone_finds_the_survivor(client, make_workspace, make_lead):
    ws = make_workspace(with_form)
    survivor, duplicate = make_lead(ws), make_lead(ws)
    merge(client, ws, survivor["id"], duplicate["id"])
    form = ws.ids.forms["Website enquiry"]
    sent = client.post(f"/api/v1/forms/{form}/submissions", json={"phone": duplicate["contact"]["phone"]},
                       headers={"Origin": FORM_ORIGIN})
    assert sent.status_code in (200, 201), sent.get_data(as_text=True)
    submissions = Activity.select().where((Activity.kind == "duplicate_submission") & (
        Activity.lead == Lead.get(Lead.public_id == survivor["id"]).id))
    assert submissions.count() == 1


def test_prefer_picks_the_lead_a_field_comes_from(client, ws, make_lead):
    survivor = make_lead(ws, first_name="Old", estimated_value=100)
    duplicate = make_lead(ws, first_name="New", estimated_value=200, custom_fields={"product_interest": "2bhk"})
    lead = merge(client, ws, survivor["id"], duplicate["id"],
                 prefer={"first_name": duplicate["id"], "estimated_value": survivor["id"],
                         "email": duplicate["id"]})["data"]
    assert lead["contact"]["first_name"] == "New" and lead["estimated_value"] == 100.0
    assert lead["custom_fields"] == {"product_interest": "2bhk"}


def test_a_dry_run_answers_the_lead_and_the_moves_and_changes_nothing(client, ws, make_lead):
    survivor, duplicate = make_lead(ws, last_name=None), make_lead(ws, last_name="Kumar")
    with_history(client, ws, duplicate["id"])
    before = (history_counts(survivor["id"]), history_counts(duplicate["id"]))
    answer = merge(client, ws, survivor["id"], duplicate["id"], dry_run=True)
    assert answer["data"]["contact"]["last_name"] == "Kumar" and "merge" not in answer
    assert answer["moves"] == {"activities": history_counts(duplicate["id"])["Activity"], "notes": 1, "tasks": 1,
                               "transitions": 2, "consents": 0}
    assert (history_counts(survivor["id"]), history_counts(duplicate["id"])) == before
    assert get(client, ws, f"/api/v1/leads/{survivor['id']}").json["data"]["contact"]["last_name"] == ""
    assert get(client, ws, f"/api/v1/leads/{duplicate['id']}").status_code == 200
    assert Merge.select().count() == 0 or not Merge.select().where(
        Merge.survivor == Lead.get(Lead.public_id == survivor["id"]).id).exists()


def test_do_not_contact_and_a_withdrawn_consent_carry_over(client, ws, make_lead):
    survivor = make_lead(ws, consent={"purpose": "Follow-up", "notice_version": "2026-11"})
    duplicate = make_lead(ws, consent={"purpose": "Follow-up", "notice_version": "2026-11"})
    assert post(client, ws, f"/api/v1/leads/{duplicate['id']}/consent/withdraw").status_code == 200
    lead = merge(client, ws, survivor["id"], duplicate["id"])["data"]
    assert lead["do_not_contact"] is True and lead["consent"]["withdrawn_at"] is not None
    call_ = post(client, ws, f"/api/v1/leads/{survivor['id']}/activities", {"kind": "call", "summary": "x"})
    assert call_.status_code == 409


def test_an_open_task_whose_assignee_cannot_see_the_survivor_goes_to_its_owner(client, ws, make_lead):
    survivor = make_lead(ws, owner="s1@t.test")
    duplicate = make_lead(ws, owner="n2@t.test")
    due = (utcnow() + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    task = post(client, ws, f"/api/v1/leads/{duplicate['id']}/tasks",
                {"kind": "call", "title": "Ring", "due_at": due, "assignee": ws.ids.members["n2@t.test"]}).json["data"]
    merge(client, ws, survivor["id"], duplicate["id"])
    moved = get(client, ws, f"/api/v1/tasks/{task['id']}").json["data"]
    assert moved["assignee"]["id"] == ws.ids.members["s1@t.test"] and moved["lead"]["id"] == survivor["id"]
    assert get(client, ws, f"/api/v1/tasks/{task['id']}", email="s1@t.test").status_code == 200


def test_a_merge_writes_one_event(client, ws, make_lead, receiver):
    register_webhook(client, ws, receiver.url, events=["lead.merged", "lead.unmerged"])
    survivor, duplicate = make_lead(ws), make_lead(ws)
    answer = merge(client, ws, survivor["id"], duplicate["id"])
    bodies = [json.loads(event.body) for event in Event.select().where(Event.type == "lead.merged")
              if json.loads(event.body)["data"]["lead"]["id"] == survivor["id"]]
    assert len(bodies) == 1
    assert bodies[0]["data"]["merged"] == [duplicate["id"]] and bodies[0]["data"]["merge"] == answer["merge"]["id"]
    assert post(client, ws, f"/api/v1/merges/{answer['merge']['id']}/undo").status_code == 200
    assert Event.select().where(Event.type == "lead.unmerged").count() >= 1


# --- what a merge refuses ------------------------------------------------------------------------

def test_bad_merges_are_problems_that_change_nothing(client, ws, other_ws, make_lead):
    survivor, *duplicates = [make_lead(ws) for _ in range(6)]
    foreign = make_lead(other_ws)
    cases = [
        ({"duplicates": [survivor["id"]]}, 422, "duplicates"),
        ({"duplicates": [duplicates[0]["id"], duplicates[0]["id"]]}, 422, "duplicates"),
        ({"duplicates": [lead["id"] for lead in duplicates[:5]]}, 422, "duplicates"),
        ({"duplicates": []}, 422, "duplicates"),
        ({"duplicates": [duplicates[0]["id"]], "prefer": {"phone": duplicates[1]["id"]}}, 422, "prefer.phone"),
        ({"duplicates": [duplicates[0]["id"]], "prefer": {"status": duplicates[0]["id"]}}, 422, "prefer.status"),
        ({"duplicates": [duplicates[0]["id"]], "prefer": {"custom_fields.nope": duplicates[0]["id"]}}, 422,
         "prefer.custom_fields.nope"),
        ({"duplicates": ["src_0000000000000000"]}, 422, "duplicates.0"),
        ({"duplicates": [duplicates[0]["id"]], "extra": 1}, 422, "extra"),
        ({"duplicates": [foreign["id"]]}, 404, None),
    ]
    for body, status, field in cases:
        response = post(client, ws, f"/api/v1/leads/{survivor['id']}/merge", body)
        assert response.status_code == status, (body, response.json)
        assert response.headers["Content-Type"] == "application/problem+json"
        if field:
            assert field in response.json["errors"], (body, response.json)
    assert not Lead.select().where(Lead.merged_into.is_null(False) & Lead.public_id.in_(
        [lead["id"] for lead in (survivor, *duplicates, foreign)])).exists()
    # A lead of another workspace as the survivor is 404 too; an agent's lead outside its scope as well.
    assert post(client, ws, f"/api/v1/leads/{foreign['id']}/merge",
                {"duplicates": [survivor["id"]]}).status_code == 404
    mine, theirs = make_lead(ws, owner="n1@t.test"), make_lead(ws, owner="s1@t.test")
    assert post(client, ws, f"/api/v1/leads/{mine['id']}/merge", {"duplicates": [theirs["id"]]},
                email="n1@t.test").status_code == 404


def test_a_merged_or_erased_lead_cannot_be_merged(client, ws, make_lead):
    survivor, duplicate, other = make_lead(ws), make_lead(ws), make_lead(ws)
    merge(client, ws, survivor["id"], duplicate["id"])
    assert merge(client, ws, other["id"], duplicate["id"], expect=409)["code"] == "conflict"
    erased = make_lead(ws)
    assert post(client, ws, f"/api/v1/leads/{erased['id']}/erase", {"reason": "asked"}).status_code == 200
    merge(client, ws, other["id"], erased["id"], expect=409)
    assert post(client, ws, f"/api/v1/leads/{duplicate['id']}/merge",
                {"duplicates": [other["id"]]}).status_code == 404   # a tombstone is no survivor


# --- undo --------------------------------------------------------------------------------------

def test_undo_restores_each_lead_and_keeps_changes_made_since(client, ws, make_lead):
    survivor = make_lead(ws, first_name="Asha", last_name=None, email=None, estimated_value=None)
    duplicate = make_lead(ws, phone=None, **email_lead_body(first_name="A", last_name="Rao", estimated_value=5000))
    third = make_lead(ws, last_name="Nair")
    with_history(client, ws, duplicate["id"])
    own = {lead["id"]: history_counts(lead["id"]) for lead in (survivor, duplicate, third)}
    answer = merge(client, ws, survivor["id"], duplicate["id"], third["id"], prefer={"phone": third["id"]})
    # Changed since: the estimated value (kept), and a note on the survivor (stays on it).
    changed = client.patch(f"/api/v1/leads/{survivor['id']}", json={"estimated_value": 7000}, headers=ws.headers())
    assert changed.status_code == 200
    assert post(client, ws, f"/api/v1/leads/{survivor['id']}/notes", {"body": "After the merge"}).status_code == 201

    undone = post(client, ws, f"/api/v1/merges/{answer['merge']['id']}/undo")
    assert undone.status_code == 200, undone.json
    lead = undone.json["data"]
    assert lead["contact"]["last_name"] == "" and lead["contact"]["email"] is None
    assert lead["contact"]["phone"] == survivor["contact"]["phone"]
    assert lead["estimated_value"] == 7000.0
    assert undone.json["merge"]["undone_at"] is not None
    restored = {doc["id"]: doc for doc in undone.json["restored"]}
    assert restored[duplicate["id"]]["contact"]["email"] == duplicate["contact"]["email"]
    assert restored[third["id"]]["contact"]["phone"] == third["contact"]["phone"]
    for original in (duplicate, third):
        read = get(client, ws, f"/api/v1/leads/{original['id']}")
        assert read.status_code == 200 and read.json["data"]["contact"] == original["contact"]
    assert history_counts(duplicate["id"])["Activity"] == own[duplicate["id"]]["Activity"]
    assert history_counts(duplicate["id"])["Task"] == own[duplicate["id"]]["Task"] == 1
    assert [note["body"] for note in everything(client, ws, survivor["id"])["notes"]] == ["After the merge"]
    assert [note["body"] for note in everything(client, ws, duplicate["id"])["notes"]] == ["Prefers evenings"]
    assert MergeMove.select().where(MergeMove.merge == Merge.get(Merge.public_id == answer["merge"]["id"])).count() == 0
    # Each contact finds its own lead again.
    again = post(client, ws, "/api/v1/leads", {"phone": third["contact"]["phone"]}).json
    assert again["data"]["id"] == third["id"]
    assert post(client, ws, f"/api/v1/merges/{answer['merge']['id']}/undo").status_code == 409   # once


def test_a_merged_lead_leaves_its_owners_open_leads_and_an_undo_gives_it_back(client, ws, make_lead):
    def open_leads(email):
        members = get(client, ws, "/api/v1/members").json["data"]
        return next(m["open_leads"] for m in members if m["email"] == email)

    survivor = make_lead(ws, "n1@t.test")
    duplicate = make_lead(ws, "s1@t.test", phone=None, **email_lead_body())
    before = {email: open_leads(email) for email in ("n1@t.test", "s1@t.test")}
    answer = merge(client, ws, survivor["id"], duplicate["id"])
    assert open_leads("s1@t.test") == before["s1@t.test"] - 1   # the tombstone is nobody's open lead
    assert open_leads("n1@t.test") == before["n1@t.test"]
    assert post(client, ws, f"/api/v1/merges/{answer['merge']['id']}/undo").status_code == 200
    assert {email: open_leads(email) for email in before} == before


def test_undo_gives_a_deactivated_owners_lead_and_tasks_to_the_survivors_owner(client, ws, make_lead):
    survivor = make_lead(ws, "n1@t.test")
    duplicate = make_lead(ws, "s1@t.test", phone=None, **email_lead_body())
    due = (utcnow() + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    task = post(client, ws, f"/api/v1/leads/{duplicate['id']}/tasks",
                {"kind": "call", "title": "Ring", "due_at": due, "assignee": ws.ids.members["s1@t.test"]}).json["data"]
    answer = merge(client, ws, survivor["id"], duplicate["id"])
    left = ws.ids.members["s1@t.test"]
    assert post(client, ws, f"/api/v1/members/{left}/deactivate", {"reassign_to": "routing"}).status_code == 202
    assert post(client, ws, f"/api/v1/merges/{answer['merge']['id']}/undo").status_code == 200
    back = everything(client, ws, duplicate["id"])
    assert back["owner"]["id"] == ws.ids.members["n1@t.test"]
    assert next(t for t in back["tasks"] if t["id"] == task["id"])["assignee"]["id"] == ws.ids.members["n1@t.test"]
    entry = (AuditEntry.select().join(Lead, on=(AuditEntry.lead == Lead.id))
             .where((Lead.public_id == duplicate["id"]) & (AuditEntry.action == "unmerged")).get())
    assert entry.changes["owner"] == {"old": left, "new": ws.ids.members["n1@t.test"]}


def test_undo_is_refused_after_30_days_an_erasure_or_another_merge(client, ws, make_lead):
    def merged():
        survivor, duplicate = make_lead(ws, "n1@t.test"), make_lead(ws)
        return survivor, duplicate, merge(client, ws, survivor["id"], duplicate["id"])["merge"]["id"]

    _, _, old = merged()
    Merge.update(created_at=utcnow() - timedelta(days=31)).where(Merge.public_id == old).execute()
    assert post(client, ws, f"/api/v1/merges/{old}/undo").status_code == 409

    survivor, _, erased = merged()
    assert post(client, ws, f"/api/v1/leads/{survivor['id']}/erase", {"reason": "asked"}).status_code == 200
    assert post(client, ws, f"/api/v1/merges/{erased}/undo").status_code == 409

    survivor, _, first = merged()
    other = make_lead(ws)
    merge(client, ws, other["id"], survivor["id"])
    assert post(client, ws, f"/api/v1/merges/{first}/undo").status_code == 409
    # Someone who does not see the survivor finds no merge.
    _, _, hidden = merged()
    assert post(client, ws, f"/api/v1/merges/{hidden}/undo", email="s1@t.test").status_code == 404


def test_a_merged_id_followed_through_two_merges(client, ws, make_lead):
    first, second, third = make_lead(ws), make_lead(ws), make_lead(ws)
    merge(client, ws, second["id"], first["id"])
    merge(client, ws, third["id"], second["id"])
    assert get(client, ws, f"/api/v1/leads/{first['id']}").json["merged_into"] == third["id"]
    again = post(client, ws, "/api/v1/leads", {"phone": first["contact"]["phone"]}).json
    assert again["data"]["id"] == third["id"]


# --- privacy -----------------------------------------------------------------------------------

def test_erasing_a_person_erases_survivors_and_tombstones_and_their_merge(client, ws, make_lead):
    survivor = make_lead(ws)
    duplicate = make_lead(ws, phone=None, **email_lead_body(first_name="Kavya"))
    answer = merge(client, ws, survivor["id"], duplicate["id"], prefer={"email": duplicate["id"]})
    subject = get(client, ws, f"/api/v1/privacy/subject?email={duplicate['contact']['email']}").json["data"]["leads"]
    assert {lead["id"] for lead in subject} == {survivor["id"], duplicate["id"]}
    assert next(lead for lead in subject if lead["id"] == duplicate["id"])["merged_into"] == survivor["id"]
    assert len(next(lead for lead in subject if lead["id"] == survivor["id"])["activities"]) > 2

    erased = post(client, ws, "/api/v1/privacy/erasures", {"email": duplicate["contact"]["email"],
                                                           "reason": "asked"}).json["data"]["erased"]
    assert sorted(erased) == sorted([survivor["id"], duplicate["id"]])
    rows = Lead.select().where(Lead.public_id.in_(erased))
    assert all(row.erased_at and row.phone is None and row.email is None and row.first_name == "" for row in rows)
    kept = Merge.get(Merge.public_id == answer["merge"]["id"])
    assert kept.before is None and kept.after is None and kept.tombstones is None
    # The person may come back as a new lead.
    assert post(client, ws, "/api/v1/leads", {"email": duplicate["contact"]["email"]}).status_code == 201


# --- races ---------------------------------------------------------------------------------------

def race(live_server, *requests):
    """Send the requests at once (method, path, body, headers); their (status, body)."""
    start = threading.Barrier(len(requests))

    def send(request):
        method, path, body, headers = request
        start.wait()
        reply = call(live_server, method, path, json_body=body, headers=headers)
        return reply.status, reply.json()

    with ThreadPoolExecutor(len(requests)) as pool:
        return list(pool.map(send, requests))


def test_a_merge_racing_a_create_with_a_duplicates_phone(live_server, client, ws, make_lead):
    headers = ws.headers()
    for _ in range(3):
        survivor, duplicate = make_lead(ws), make_lead(ws)
        (merged, _), (created, body) = race(
            live_server, ("POST", f"/api/v1/leads/{survivor['id']}/merge", {"duplicates": [duplicate["id"]]}, headers),
            ("POST", "/api/v1/leads", {"phone": duplicate["contact"]["phone"]}, headers))
        assert merged == 200 and created == 200, body
        assert body["data"]["id"] in (survivor["id"], duplicate["id"])   # before the merge, or after it
        assert Lead.select().where(Lead.phone == duplicate["contact"]["phone"]).count() == 1
        activities = Activity.select().where((Activity.kind == "duplicate_submission") & Activity.lead.in_(
            Lead.select(Lead.id).where(Lead.public_id.in_([survivor["id"], duplicate["id"]])))).count()
        assert activities == 1


def test_a_merge_racing_an_update_of_a_duplicate(live_server, ws, make_lead):
    headers = ws.headers()
    for _ in range(3):
        survivor, duplicate = make_lead(ws), make_lead(ws, last_name=None)
        (merged, _), (updated, body) = race(
            live_server, ("POST", f"/api/v1/leads/{survivor['id']}/merge", {"duplicates": [duplicate["id"]]}, headers),
            ("PATCH", f"/api/v1/leads/{duplicate['id']}", {"last_name": "Late"}, headers))
        assert merged == 200
        assert updated in (200, 404), body
        if updated == 404:
            assert body["merged_into"] == survivor["id"]
        else:   # the update came first, and the survivor took its value
            assert Lead.get(Lead.public_id == survivor["id"]).last_name in ("Late", survivor["contact"]["last_name"])


def test_two_merges_of_the_same_lead_at_once(live_server, ws, make_lead):
    headers = ws.headers()
    for _ in range(3):
        first, second, duplicate = make_lead(ws), make_lead(ws), make_lead(ws)
        with_phone = {"duplicates": [duplicate["id"]]}
        results = race(live_server, ("POST", f"/api/v1/leads/{first['id']}/merge", with_phone, headers),
                       ("POST", f"/api/v1/leads/{second['id']}/merge", with_phone, headers),
                       ("POST", f"/api/v1/leads/{second['id']}/merge", {"duplicates": [first["id"]]}, headers))
        statuses = sorted(status for status, _ in results)
        assert statuses.count(200) >= 1 and set(statuses) <= {200, 404, 409}, results
        row = Lead.get(Lead.public_id == duplicate["id"])
        assert row.merged_into_id is not None
        moved = Transition.select().where(Transition.lead == row.id).count()
        assert moved == 0   # its history went to one survivor, once
