"""Privacy (India's DPDP Act): erasure of a lead and of a person, subject access,
consent from forms and API creates, withdrawal and do-not-contact, personal custom fields, and
privacy:manage for admins only."""

from __future__ import annotations

import json
import threading

import pytest

from conftest import FORM_ORIGIN, ROLE_EMAILS, new_phone
from leadsvc import search
from leadsvc.auth import issue_token
from leadsvc.db import database
from leadsvc.models import (Activity, AuditEntry, Consent, Event, IdempotencyKey, Lead, LeadNamePart, Note,
                            Transition)

ADMIN = "admin@t.test"


def post(client, ws, path, body=None, email=ADMIN, **headers):
    return client.post(path, json=body, headers={**ws.headers(email), **headers})


def personal_details(ws, **fields) -> dict:
    """The fields of a lead with something personal in each: names, phone, e-mail, custom fields."""
    return {"first_name": "Asha", "last_name": "Rao", "phone": new_phone(),
            "email": f"asha.{new_phone()[-8:]}@example.com", "source": ws.ids.sources["Website"],
            "custom_fields": {"notes_from_call": "lives near the lake", "product_interest": "villa",
                              "family_size": 4}, **fields}


def with_history(client, make_lead, ws) -> dict:
    """A lead with a note, a call, a stage move with a note, an update, a duplicate submission and
    an API consent: something personal in every kind of history."""
    lead = make_lead(ws, **personal_details(ws, consent={"purpose": "Site visit follow-up",
                                                         "notice_version": "2026-11"}))
    path = f"/api/v1/leads/{lead['id']}"
    assert post(client, ws, f"{path}/notes", {"body": "Asha prefers calls after 6pm"}).status_code == 201
    assert post(client, ws, f"{path}/activities", {"kind": "call", "summary": "Spoke to Asha"}).status_code == 201
    assert post(client, ws, f"{path}/status", {"status": ws.ids.statuses["Contacted"],
                                               "note": "Asha wants a villa"}).status_code == 200
    assert client.patch(path, json={"last_name": "Rao-Menon"}, headers=ws.headers()).status_code == 200
    duplicate = post(client, ws, "/api/v1/leads", {"phone": lead["contact"]["phone"], "first_name": "Asha R"})
    assert duplicate.status_code == 200 and duplicate.json["duplicate"] is True
    return client.get(path, headers=ws.headers()).json["data"]


def erase(client, ws, lead_id, reason="Asked to be forgotten (ticket 42)", email=ADMIN):
    return post(client, ws, f"/api/v1/leads/{lead_id}/erase", {"reason": reason}, email=email)


def lead_row(public_id: str) -> Lead:
    return Lead.get(Lead.public_id == public_id)


# --- erasure of one lead -----------------------------------------------------------------------

def test_erasure_anonymises_the_lead_in_place(client, make_lead, ws):
    lead = with_history(client, make_lead, ws)
    response = erase(client, ws, lead["id"])
    assert response.status_code == 200, response.json
    erased = response.json["data"]
    assert erased["id"] == lead["id"] and erased["erased_at"] is not None
    assert erased["contact"] == {"first_name": None, "last_name": None, "full_name": None, "phone": None,
                                 "email": None}
    # Text fields are personal by default; a choice and a number are not.
    assert erased["custom_fields"] == {"product_interest": "villa", "family_size": 4}
    for kept in ("status", "owner", "team", "source", "score", "score_band", "created_at", "status_changed_at"):
        assert erased[kept] == lead[kept], kept
    assert erased["updated_at"] == erased["erased_at"]
    assert erased["consent"]["purpose"] == "Site visit follow-up" and erased["consent"]["notice_version"] == "2026-11"
    assert erased["consent"]["given_at"] == lead["consent"]["given_at"]
    assert client.get(f"/api/v1/leads/{lead['id']}", headers=ws.headers()).json["data"] == erased


def test_erasure_keeps_the_history_without_the_personal_values(client, make_lead, ws):
    lead = with_history(client, make_lead, ws)
    assert erase(client, ws, lead["id"]).status_code == 200
    row = lead_row(lead["id"])
    assert (row.first_name, row.last_name, row.phone, row.email, row.phone_reversed) == ("", "", None, None, None)
    activities = list(Activity.select().where(Activity.lead == row.id))
    assert {a.kind for a in activities} >= {"created", "assigned", "note", "call", "status_changed", "updated",
                                            "duplicate_submission"}
    assert all(a.summary is None and a.data is None for a in activities)
    assert [n.body for n in Note.select().where(Note.lead == row.id)] == [None]
    transitions = list(Transition.select().where(Transition.lead == row.id).order_by(Transition.at))
    assert len(transitions) == 2 and all(t.note is None for t in transitions)
    assert [c.ip for c in Consent.select().where(Consent.lead == row.id)] == [None]

    audit = client.get(f"/api/v1/leads/{lead['id']}/audit", headers=ws.headers()).json["data"]
    text = json.dumps(audit)
    for value in ("Asha", "Rao", "lake", lead["contact"]["phone"], lead["contact"]["email"]):
        assert value not in text, value
    created = next(entry for entry in audit if entry["action"] == "created")
    assert created["changes"]["phone"] == {"old": None, "new": "[erased]"}
    assert created["changes"]["custom_fields"]["new"] == {"notes_from_call": "[erased]", "product_interest": "villa",
                                                         "family_size": 4}
    assert created["changes"]["status"]["new"] == ws.ids.statuses["New"], "not personal: kept"
    updated = next(entry for entry in audit if entry["action"] == "updated")
    assert updated["changes"] == {"last_name": {"old": "[erased]", "new": "[erased]"}}
    assert updated["actor"]["type"] == "token" and updated["at"]
    erased_entries = [entry for entry in audit if entry["action"] == "erased"]
    assert len(erased_entries) == 1
    assert erased_entries[0]["changes"]["reason"] == {"old": None, "new": "Asked to be forgotten (ticket 42)"}

    with_activities = client.get(f"/api/v1/leads/{lead['id']}?include=activities,notes", headers=ws.headers()).json
    assert all(a["summary"] is None and a["data"] is None for a in with_activities["data"]["activities"])
    assert with_activities["data"]["notes"][0]["body"] is None


def test_erasing_an_erased_lead_is_409_and_nothing_else_can_change_it(client, make_lead, ws):
    lead = make_lead(ws, **personal_details(ws))
    assert erase(client, ws, lead["id"]).status_code == 200
    path = f"/api/v1/leads/{lead['id']}"
    attempts = [
        erase(client, ws, lead["id"]),
        client.patch(path, json={"first_name": "Back"}, headers=ws.headers()),
        post(client, ws, f"{path}/status", {"status": ws.ids.statuses["Contacted"]}),
        post(client, ws, f"{path}/notes", {"body": "Hello"}),
        post(client, ws, f"{path}/activities", {"kind": "meeting", "summary": "Met"}),
        post(client, ws, f"{path}/consent/withdraw"),
    ]
    assert [r.status_code for r in attempts] == [409] * 6
    assert all(r.json["code"] == "conflict" for r in attempts)
    audit = client.get(f"{path}/audit", headers=ws.headers()).json["data"]
    assert [entry["action"] for entry in audit].count("erased") == 1


def test_erasure_needs_a_reason(client, make_lead, ws):
    lead = make_lead(ws, **personal_details(ws))
    for body in ({}, {"reason": "   "}):
        response = post(client, ws, f"/api/v1/leads/{lead['id']}/erase", body)
        assert response.status_code == 422 and "reason" in response.json["errors"]
    assert lead_row(lead["id"]).erased_at is None


def test_reports_are_the_same_before_and_after_erasure(client, make_lead, ws, pipeline_data):
    # pipeline_data: seven leads moved through the pipeline at set times (conftest.py).
    with_history(client, make_lead, ws)

    def reports():
        out = {}
        for name in ("funnel", "velocity", "conversion"):
            for params in ({}, {"filter[source]": ws.ids.sources["Website"]},
                           {"filter[owner]": ws.ids.members["n1@t.test"]}):
                response = client.get(f"/api/v1/reports/{name}", query_string=params, headers=ws.headers())
                assert response.status_code == 200
                out[(name, tuple(params.values()))] = response.json
        return out

    before = reports()
    assert before[("conversion", ())]["data"] != before[("conversion", (ws.ids.members["n1@t.test"],))]["data"]
    erased = post(client, ws, "/api/v1/privacy/erasures", {"phone": lead_row(pipeline_data["L1"]).phone,
                                                           "email": "nobody@example.com", "reason": "asked"})
    assert erased.json["data"]["erased"] == [pipeline_data["L1"]]
    for name in ("L2", "L3", "L5", "L6"):
        assert erase(client, ws, pipeline_data[name]).status_code == 200
    assert reports() == before


@pytest.mark.parametrize("common", [1, 2000])
def test_an_erased_lead_is_never_found_by_search(client, make_lead, ws, monkeypatch, common):
    monkeypatch.setattr(search, "COMMON", common)   # 1: name words take the plan of a common word
    lead = make_lead(ws, **personal_details(ws, first_name="Zubeida", last_name="Qureshi"))
    contact = lead["contact"]
    queries = ["Zubeida", "qures", "zub qur", contact["phone"][-6:], contact["email"]]
    for q in queries:
        found = client.get("/api/v1/leads", query_string={"q": q}, headers=ws.headers()).json["data"]
        assert [row["id"] for row in found] == [lead["id"]], q
    assert erase(client, ws, lead["id"]).status_code == 200
    for q in queries:
        assert client.get("/api/v1/leads", query_string={"q": q}, headers=ws.headers()).json["data"] == [], q
    assert not LeadNamePart.select().where(LeadNamePart.lead == lead_row(lead["id"]).id).exists()
    assert lead_row(lead["id"]).name_key is None


def test_the_same_person_may_come_back_as_a_new_lead(client, make_lead, ws):
    lead = make_lead(ws, **personal_details(ws))
    assert erase(client, ws, lead["id"]).status_code == 200
    again = post(client, ws, "/api/v1/leads", {"phone": lead["contact"]["phone"], "email": lead["contact"]["email"]})
    assert again.status_code == 201 and again.json["duplicate"] is False
    assert again.json["data"]["id"] != lead["id"]


def test_erasure_deletes_the_recorded_responses_that_held_the_lead(client, ws):
    body = {"first_name": "Kiran", "phone": new_phone()}
    first = post(client, ws, "/api/v1/leads", body, **{"Idempotency-Key": "create-kiran"})
    assert first.status_code == 201
    lead_id = first.json["data"]["id"]
    noted = post(client, ws, f"/api/v1/leads/{lead_id}/activities", {"kind": "call", "summary": "Rang"},
                 **{"Idempotency-Key": "call-kiran"})
    assert noted.status_code == 201
    other = post(client, ws, "/api/v1/leads", {"phone": new_phone()}, **{"Idempotency-Key": "someone-else"})
    assert IdempotencyKey.select().where(IdempotencyKey.key.in_(["create-kiran", "call-kiran"])).count() == 2

    assert erase(client, ws, lead_id).status_code == 200
    assert not IdempotencyKey.select().where(IdempotencyKey.key.in_(["create-kiran", "call-kiran"])).exists()
    assert IdempotencyKey.select().where(IdempotencyKey.key == "someone-else").exists()
    # The retry is not replayed: it runs again, and the person is a new lead (the old one is erased).
    retry = post(client, ws, "/api/v1/leads", body, **{"Idempotency-Key": "create-kiran"})
    assert retry.status_code == 201 and "Idempotent-Replayed" not in retry.headers
    assert retry.json["data"]["id"] != lead_id
    assert other.json["data"]["id"] not in (lead_id, retry.json["data"]["id"])


@pytest.mark.parametrize("route, body", [
    ("notes", {"body": "Call after 6pm, ask for Asha"}),
    ("activities", {"kind": "meeting", "summary": "Met Asha at the site"}),
    ("status", {"status": "Contacted"}),
    ("notes", {"body": ""}),   # a 422 is recorded too, and belongs to the lead as much
])
def test_erasure_deletes_every_recorded_response_of_a_request_that_named_the_lead(client, make_lead, ws, route, body):
    lead = make_lead(ws, **personal_details(ws))
    body = {**body, "status": ws.ids.statuses[body["status"]]} if "status" in body else body
    path, key = f"/api/v1/leads/{lead['id']}/{route}", f"lead-{new_phone()}"
    first = post(client, ws, path, body, **{"Idempotency-Key": key})
    assert first.status_code in (200, 201, 422), first.json
    assert IdempotencyKey.get(IdempotencyKey.key == key).lead_public_id == lead["id"]

    assert erase(client, ws, lead["id"]).status_code == 200
    retry = post(client, ws, path, body, **{"Idempotency-Key": key})
    assert "Idempotent-Replayed" not in retry.headers, "the recorded response went with the lead's data"
    assert retry.status_code == (422 if first.status_code == 422 else 409), retry.json


def test_erasure_clears_the_bodies_that_note_edits_and_deletions_kept_in_the_audit(client, make_lead, ws):
    lead = make_lead(ws, **personal_details(ws))
    notes = f"/api/v1/leads/{lead['id']}/notes"
    edited, deleted = (post(client, ws, notes, {"body": body}).json["data"]["id"]
                       for body in ("Asha's sister is Meera", "Asha's PAN is ABCDE1234F"))
    assert client.patch(f"/api/v1/notes/{edited}", json={"body": "Asha's sister is Meera Rao"},
                        headers=ws.headers()).status_code == 200
    assert client.delete(f"/api/v1/notes/{deleted}", headers=ws.headers()).status_code == 204
    subject = client.get("/api/v1/privacy/subject", query_string={"phone": lead["contact"]["phone"]},
                         headers=ws.headers()).json["data"]["leads"][0]
    assert [note["body"] for note in subject["notes"]] == ["Asha's sister is Meera Rao"]
    assert {entry["action"] for entry in subject["audit"]} >= {"note_edited", "note_deleted"}

    assert erase(client, ws, lead["id"]).status_code == 200
    audit = client.get(f"/api/v1/leads/{lead['id']}/audit", headers=ws.headers()).json["data"]
    changes = {entry["action"]: entry["changes"] for entry in audit}
    assert changes["note_edited"]["body"] == {"old": "[erased]", "new": "[erased]"}
    assert changes["note_deleted"]["body"] == {"old": "[erased]", "new": None}
    assert "Meera" not in json.dumps(audit) and "ABCDE" not in json.dumps(audit)


def test_erasure_is_one_transaction(client, make_lead, ws, monkeypatch):
    from leadsvc import privacy

    lead = with_history(client, make_lead, ws)

    def failing(*args):
        raise RuntimeError("the disk is full")

    monkeypatch.setattr(privacy.idempotency, "forget", failing)
    client.application.config["PROPAGATE_EXCEPTIONS"] = False
    try:
        assert erase(client, ws, lead["id"]).status_code == 500
    finally:
        client.application.config["PROPAGATE_EXCEPTIONS"] = None
    row = lead_row(lead["id"])
    assert row.erased_at is None and row.phone == lead["contact"]["phone"]
    assert Note.select().where((Note.lead == row.id) & Note.body.is_null(False)).exists()
    assert LeadNamePart.select().where(LeadNamePart.lead == row.id).exists()


def test_a_duplicate_submission_racing_an_erasure_leaves_nothing_of_the_person(app, client, make_lead, ws, monkeypatch):
    # An erasure that commits between a create's duplicate lookup and its duplicate_submission
    # activity must not leave the person's phone and name on the erased lead (the activity) nor in
    # its lead.duplicate_submitted event. PostgreSQL only: SQLite's single writer keeps them apart.
    from leadsvc import pipeline

    hook = post(client, ws, "/api/v1/webhooks", {"url": "http://127.0.0.1:9/hook", "events": ["*"]})
    assert hook.status_code == 201, hook.json
    lead = make_lead(ws, **personal_details(ws))
    phone = lead["contact"]["phone"]
    looked_up, go_on = threading.Event(), threading.Event()
    record_activity = pipeline.record_activity

    def paused(row, actor, kind, *args, **kwargs):
        if kind == "duplicate_submission":   # the duplicate was found: let the erasure try now
            looked_up.set()
            go_on.wait(10)
        return record_activity(row, actor, kind, *args, **kwargs)

    monkeypatch.setattr(pipeline, "record_activity", paused)
    answers = {}
    creating = threading.Thread(target=lambda: answers.update(create=post(
        app.test_client(), ws, "/api/v1/leads", {"phone": phone, "first_name": "Asha Again"})))
    erasing = threading.Thread(target=lambda: answers.update(erase=erase(app.test_client(), ws, lead["id"])))
    creating.start()
    assert looked_up.wait(10)
    erasing.start()
    erasing.join(1)   # it finishes now unless the duplicate's lock (or SQLite's writer) holds it back
    go_on.set()
    creating.join(10)
    erasing.join(10)

    assert answers["erase"].status_code == 200
    assert answers["create"].status_code == 200 and answers["create"].json["duplicate"] is True
    row = lead_row(lead["id"])
    kept = [activity.data for activity in Activity.select().where(Activity.lead == row.id)]
    kept += [json.loads(event.body) for event in Event.select().where(Event.lead == row.id)]
    assert "Asha Again" not in json.dumps(kept) and phone not in json.dumps(kept)


# --- erasure of a person ---------------------------------------------------------------------

def test_erasing_a_person_erases_every_lead_with_the_phone_or_the_email(client, make_lead, ws, other_ws):
    by_phone = make_lead(ws, **personal_details(ws))
    by_email = make_lead(ws, **personal_details(ws))
    bystander = make_lead(ws, **personal_details(ws))
    elsewhere = make_lead(other_ws, **personal_details(other_ws, phone=by_phone["contact"]["phone"],
                                                       source=other_ws.ids.sources["Website"]))
    response = post(client, ws, "/api/v1/privacy/erasures",
                    {"phone": by_phone["contact"]["phone"].replace("+91", "0"),
                     "email": by_email["contact"]["email"].upper(), "reason": "DPDP erasure request"})
    assert response.status_code == 200, response.json
    assert sorted(response.json["data"]["erased"]) == sorted([by_phone["id"], by_email["id"]])
    assert lead_row(by_phone["id"]).erased_at and lead_row(by_email["id"]).erased_at
    assert lead_row(bystander["id"]).erased_at is None
    assert lead_row(elsewhere["id"]).erased_at is None, "another workspace's lead is not touched"


def test_erasing_a_person_while_one_of_their_leads_is_erased_erases_the_others(app, client, make_lead, ws, monkeypatch):
    # A lead of the person erased on its own meanwhile is no reason to refuse (409) and roll back
    # the person's erasure. PostgreSQL only: SQLite's single writer keeps them apart.
    from leadsvc import privacy

    by_phone, by_email = make_lead(ws, **personal_details(ws)), make_lead(ws, **personal_details(ws))
    one_erased, go_on = threading.Event(), threading.Event()
    erase_one = privacy._erase

    def paused(lead, *args, **kwargs):
        erase_one(lead, *args, **kwargs)
        one_erased.set()
        go_on.wait(10)

    monkeypatch.setattr(privacy, "_erase", paused)
    answers = {}
    person = threading.Thread(target=lambda: answers.update(person=post(
        app.test_client(), ws, "/api/v1/privacy/erasures",
        {"phone": by_phone["contact"]["phone"], "email": by_email["contact"]["email"], "reason": "DPDP request"})))
    person.start()
    assert one_erased.wait(10)
    monkeypatch.setattr(privacy, "_erase", erase_one)
    alone = threading.Thread(target=lambda: answers.update(alone=erase(app.test_client(), ws, by_email["id"])))
    alone.start()
    alone.join(1)   # it finishes now unless the person's erasure (or SQLite's writer) holds it back
    go_on.set()
    person.join(10)
    alone.join(10)

    assert answers["person"].status_code == 200, answers["person"].json
    assert sorted(answers["person"].json["data"]["erased"]) == sorted([by_phone["id"], by_email["id"]])
    assert answers["alone"].status_code == 409
    assert lead_row(by_phone["id"]).erased_at and lead_row(by_email["id"]).erased_at


def test_erasing_a_person_who_is_not_held_erases_nothing(client, ws):
    response = post(client, ws, "/api/v1/privacy/erasures", {"email": "nobody@example.com", "reason": "asked"})
    assert response.status_code == 200 and response.json == {"data": {"erased": []}}


@pytest.mark.parametrize("body, field", [
    ({"reason": "asked"}, "phone"),
    ({"phone": "12345", "reason": "asked"}, "phone"),
    ({"email": "a@example.com"}, "reason"),
])
def test_erasing_a_person_needs_a_contact_and_a_reason(client, ws, body, field):
    response = post(client, ws, "/api/v1/privacy/erasures", body)
    assert response.status_code == 422 and field in response.json["errors"]


# --- subject access --------------------------------------------------------------------------

def test_subject_access_shows_everything_held_about_the_person(client, make_lead, ws):
    lead = with_history(client, make_lead, ws)
    response = client.get("/api/v1/privacy/subject", query_string={"email": lead["contact"]["email"].upper()},
                          headers=ws.headers())
    assert response.status_code == 200, response.json
    [held] = response.json["data"]["leads"]
    assert held["id"] == lead["id"] and held["contact"] == lead["contact"]
    assert {a["kind"] for a in held["activities"]} >= {"created", "note", "call", "status_changed",
                                                       "duplicate_submission"}
    assert [n["body"] for n in held["notes"]] == ["Asha prefers calls after 6pm"]
    assert [t["note"] for t in held["transitions"]] == [None, "Asha wants a villa"]
    assert [c["purpose"] for c in held["consents"]] == ["Site visit follow-up"]
    assert held["consents"][0]["source"].startswith("tok_")
    assert [entry["action"] for entry in held["audit"]][:1] == ["created"]

    by_phone = client.get("/api/v1/privacy/subject", query_string={"phone": lead["contact"]["phone"][3:]},
                          headers=ws.headers())
    assert [row["id"] for row in by_phone.json["data"]["leads"]] == [lead["id"]]


def test_subject_access_after_erasure_finds_nothing(client, make_lead, ws):
    lead = make_lead(ws, **personal_details(ws))
    assert erase(client, ws, lead["id"]).status_code == 200
    response = client.get("/api/v1/privacy/subject", query_string={"phone": lead["contact"]["phone"]},
                          headers=ws.headers())
    assert response.status_code == 200 and response.json == {"data": {"leads": []}}


@pytest.mark.parametrize("query", [{}, {"phone": "not a phone"}, {"email": "nope"}, {"name": "Asha"}])
def test_subject_access_needs_a_phone_or_an_email(client, ws, query):
    response = client.get("/api/v1/privacy/subject", query_string=query, headers=ws.headers())
    assert response.status_code == 422


# --- who may: privacy:manage, admins only, never across workspaces ---------------------------

def test_only_admins_can_hold_privacy_manage(ws):
    for email in (ROLE_EMAILS["manager"], ROLE_EMAILS["agent"]):
        with pytest.raises(ValueError, match="cannot hold privacy:manage"):
            issue_token(ws.member(email), ["leads:read", "privacy:manage"])
    token, _ = issue_token(ws.member(ADMIN), ["privacy:manage"])
    assert token.abilities == ["privacy:manage"]


def test_no_one_but_an_admin_with_privacy_manage_erases_or_reads_a_subject(client, ws, other_ws, make_lead):
    lead = make_lead(ws, **personal_details(ws))
    moved = client.patch(f"/api/v1/leads/{lead['id']}", json={"owner": ws.ids.members["n1@t.test"]},
                         headers=ws.headers())
    assert moved.status_code == 200   # in the North agent's and manager's own scope
    phone = lead["contact"]["phone"]
    callers = {
        "manager with *": ws.headers(ROLE_EMAILS["manager"]),
        "agent with *": ws.headers(ROLE_EMAILS["agent"]),
        "admin without privacy:manage": ws.headers(ADMIN, ("leads:read", "leads:update", "audit:read")),
    }
    for name, headers in callers.items():
        answers = [
            client.post(f"/api/v1/leads/{lead['id']}/erase", json={"reason": "x"}, headers=headers),
            client.post("/api/v1/privacy/erasures", json={"phone": phone, "reason": "x"}, headers=headers),
            client.get("/api/v1/privacy/subject", query_string={"phone": phone}, headers=headers),
        ]
        assert [a.status_code for a in answers] == [403, 403, 403], name
        assert all(phone not in a.get_data(as_text=True) for a in answers)

    foreign = other_ws.headers()
    assert client.post(f"/api/v1/leads/{lead['id']}/erase", json={"reason": "x"}, headers=foreign).status_code == 404
    assert client.post("/api/v1/privacy/erasures", json={"phone": phone, "reason": "x"},
                       headers=foreign).json == {"data": {"erased": []}}
    assert client.get("/api/v1/privacy/subject", query_string={"phone": phone}, headers=foreign).json == \
        {"data": {"leads": []}}
    assert lead_row(lead["id"]).erased_at is None

    admin = ws.headers(ADMIN, ("privacy:manage",))
    assert client.get("/api/v1/privacy/subject", query_string={"phone": phone}, headers=admin).status_code == 200
    assert client.post(f"/api/v1/leads/{lead['id']}/erase", json={"reason": "x"}, headers=admin).status_code == 200


# --- consent ---------------------------------------------------------------------------------

def test_an_api_create_records_the_consent_it_sends(client, make_lead, ws):
    lead = make_lead(ws, **personal_details(ws, consent={"purpose": "Marketing calls", "notice_version": "v3"}))
    consent = lead["consent"]
    assert consent["id"].startswith("cons_") and consent["purpose"] == "Marketing calls"
    assert consent["notice_version"] == "v3" and consent["given_at"] and consent["withdrawn_at"] is None
    assert consent["source"] == issue_source(ws) and consent["ip"] is None
    assert lead["do_not_contact"] is False and lead["erased_at"] is None
    audit = client.get(f"/api/v1/leads/{lead['id']}/audit", headers=ws.headers()).json["data"]
    assert audit[0]["changes"]["consent"] == {"old": None, "new": consent["id"]}


def issue_source(ws) -> str:
    """The public id of the token ws.headers() uses."""
    from leadsvc.auth import hash_token
    from leadsvc.models import Token

    return Token.get(Token.secret_hash == hash_token(ws.token())).public_id


def test_a_lead_without_consent_shows_none(client, make_lead, ws):
    lead = make_lead(ws, **personal_details(ws))
    assert lead["consent"] is None and lead["do_not_contact"] is False
    assert not Consent.select().where(Consent.lead == lead_row(lead["id"]).id).exists()


def test_a_create_without_consent_never_queries_the_consent_table(client, make_lead, ws):
    statements = []

    def hook(event):
        statements.append(event.sql)

    db = database.obj
    db.query_hooks.append(hook)
    try:
        make_lead(ws, **personal_details(ws))
    finally:
        db.query_hooks.remove(hook)
    assert statements and not [sql for sql in statements if '"consent"' in sql]


def test_a_duplicate_that_consents_records_it_on_the_lead_it_matched(client, make_lead, ws):
    lead = make_lead(ws, **personal_details(ws))
    response = post(client, ws, "/api/v1/leads", {"phone": lead["contact"]["phone"],
                                                  "consent": {"purpose": "Newsletter"}})
    assert response.status_code == 200 and response.json["duplicate"] is True
    assert response.json["data"]["consent"]["purpose"] == "Newsletter"
    assert response.json["data"]["consent"]["notice_version"] is None


@pytest.mark.parametrize("consent", [{}, {"purpose": ""}, {"purpose": "x", "ip": "1.2.3.4"}, "yes", True])
def test_a_malformed_consent_is_422(client, ws, consent):
    response = post(client, ws, "/api/v1/leads", {"phone": new_phone(), "consent": consent})
    assert response.status_code == 422 and any(key.startswith("consent") for key in response.json["errors"])


@pytest.mark.parametrize("consent", ["yes", True, [], 5])
def test_a_consent_that_is_not_an_object_is_named_in_errors(client, ws, consent):
    # Named as the field, not "consent._schema" (marshmallow's name for a nested schema's own errors).
    response = post(client, ws, "/api/v1/leads", {"phone": new_phone(), "consent": consent})
    assert response.status_code == 422 and list(response.json["errors"]) == ["consent"], response.json


def test_withdrawal_marks_the_latest_consent_and_sets_do_not_contact(client, make_lead, ws):
    lead = make_lead(ws, **personal_details(ws, consent={"purpose": "Calls", "notice_version": "v1"}))
    path = f"/api/v1/leads/{lead['id']}"
    response = post(client, ws, f"{path}/consent/withdraw")
    assert response.status_code == 200, response.json
    withdrawn = response.json["data"]
    assert withdrawn["do_not_contact"] is True
    assert withdrawn["consent"]["id"] == lead["consent"]["id"] and withdrawn["consent"]["withdrawn_at"]
    assert Consent.get(Consent.public_id == lead["consent"]["id"]).withdrawn_at is not None
    # Again: nothing more to record.
    again = post(client, ws, f"{path}/consent/withdraw")
    assert again.status_code == 200 and again.json["data"]["consent"] == withdrawn["consent"]
    actions = [e["action"] for e in client.get(f"{path}/audit", headers=ws.headers()).json["data"]]
    assert actions.count("consent_withdrawn") == 1


def test_withdrawal_without_a_consent_records_a_new_one(client, make_lead, ws):
    lead = make_lead(ws, **personal_details(ws))
    response = post(client, ws, f"/api/v1/leads/{lead['id']}/consent/withdraw")
    assert response.status_code == 200
    consent = response.json["data"]["consent"]
    assert consent["given_at"] is None and consent["withdrawn_at"] and consent["purpose"] is None


def test_withdrawal_needs_leads_update(client, make_lead, ws):
    lead = make_lead(ws, **personal_details(ws))
    response = post(client, ws, f"/api/v1/leads/{lead['id']}/consent/withdraw")
    assert response.status_code == 200
    reader = ws.headers(ADMIN, ("leads:read",))
    assert client.post(f"/api/v1/leads/{lead['id']}/consent/withdraw", headers=reader).status_code == 403


@pytest.mark.parametrize("kind, status", [("call", 409), ("email", 409), ("whatsapp", 409), ("sms", 409),
                                          ("meeting", 201)])
def test_contact_activities_on_a_do_not_contact_lead_are_409(client, make_lead, ws, kind, status):
    lead = make_lead(ws, **personal_details(ws))
    assert post(client, ws, f"/api/v1/leads/{lead['id']}/consent/withdraw").status_code == 200
    response = post(client, ws, f"/api/v1/leads/{lead['id']}/activities", {"kind": kind, "summary": "Tried"})
    assert response.status_code == status, response.json
    if status == 409:
        assert response.json["code"] == "conflict" and "do-not-contact" in response.json["detail"]


def test_do_not_contact_can_be_patched(client, make_lead, ws):
    lead = make_lead(ws, **personal_details(ws))
    path = f"/api/v1/leads/{lead['id']}"
    on = client.patch(path, json={"do_not_contact": True}, headers=ws.headers())
    assert on.status_code == 200 and on.json["data"]["do_not_contact"] is True
    assert post(client, ws, f"{path}/activities", {"kind": "call", "summary": "x"}).status_code == 409
    off = client.patch(path, json={"do_not_contact": False}, headers=ws.headers())
    assert off.status_code == 200 and off.json["data"]["do_not_contact"] is False
    assert post(client, ws, f"{path}/activities", {"kind": "call", "summary": "x"}).status_code == 201
    audit = client.get(f"{path}/audit", headers=ws.headers()).json["data"]
    assert {"do_not_contact": {"old": False, "new": True}} in [e["changes"] for e in audit]
    assert client.patch(path, json={"do_not_contact": "yes"}, headers=ws.headers()).status_code == 422


@pytest.mark.parametrize("value", [1, 0, "true", "false", "yes"])
def test_do_not_contact_takes_json_true_or_false_only(client, make_lead, ws, value):
    # 0 == False, so truthy={True}, falsy={False} alone would take 1 and 0.
    lead = make_lead(ws, **personal_details(ws))
    response = client.patch(f"/api/v1/leads/{lead['id']}", json={"do_not_contact": value}, headers=ws.headers())
    assert response.status_code == 422 and "do_not_contact" in response.json["errors"]
    assert lead_row(lead["id"]).do_not_contact is False


# --- forms: notice, checkbox, consent records --------------------------------------------------

NOTICE = "We use your phone and e-mail to call you about homes. Write to dpo@acme.test to withdraw."


@pytest.fixture
def consent_ws(make_workspace):
    def change(data):
        data["forms"] = [
            {"name": "Site visit", "source": "Website", "allowed_origins": [FORM_ORIGIN], "notice": NOTICE,
             "notice_version": "2026-11", "consent_required": True},
            {"name": "Newsletter", "allowed_origins": [FORM_ORIGIN], "notice": NOTICE, "notice_version": "2026-10"},
            {"name": "Plain", "allowed_origins": [FORM_ORIGIN]},
        ]
    return make_workspace(change)


def submit(client, ws, form, body, *, encoded=False):
    path = f"/api/v1/forms/{ws.ids.forms[form]}/submissions"
    if encoded:
        return client.post(path, data=body, headers={"Origin": FORM_ORIGIN})
    return client.post(path, json=body, headers={"Origin": FORM_ORIGIN})


def form_lead(phone: str) -> Lead:
    return Lead.get(Lead.phone == phone)


def test_the_form_page_shows_the_notice_and_a_consent_checkbox(client, consent_ws):
    page = client.get(f"/forms/{consent_ws.ids.forms['Site visit']}").get_data(as_text=True)
    assert NOTICE in page and 'name="consent"' in page and 'type="checkbox"' in page and "2026-11" in page
    plain = client.get(f"/forms/{consent_ws.ids.forms['Plain']}").get_data(as_text=True)
    assert 'name="consent"' not in plain


def test_a_form_that_requires_consent_refuses_a_submission_without_it(client, consent_ws):
    phone = new_phone()
    for body in ({"phone": phone}, {"phone": phone, "consent": False}):
        response = submit(client, consent_ws, "Site visit", body)
        assert response.status_code == 422 and "consent" in response.json["errors"]
    page = submit(client, consent_ws, "Site visit", {"phone": phone}, encoded=True)
    assert page.status_code == 422 and "Please agree to the privacy notice" in page.get_data(as_text=True)
    assert not Lead.select().where(Lead.phone == phone).exists()


def test_a_consenting_submission_records_the_consent(client, consent_ws):
    phone = new_phone()
    assert submit(client, consent_ws, "Site visit", {"phone": phone, "consent": True}).status_code == 201
    consent = form_lead(phone).consent
    assert consent["purpose"] == "Site visit" and consent["notice_version"] == "2026-11"
    assert consent["source"] == consent_ws.ids.forms["Site visit"] and consent["ip"] == "127.0.0.1"
    record = Consent.get(Consent.public_id == consent["id"])
    assert record.lead_id == form_lead(phone).id and record.given_at is not None

    checkbox = new_phone()
    page = submit(client, consent_ws, "Site visit", {"phone": checkbox, "consent": "yes"}, encoded=True)
    assert page.status_code == 200
    assert form_lead(checkbox).consent["purpose"] == "Site visit"


def test_a_form_that_does_not_require_consent_takes_submissions_either_way(client, consent_ws):
    without, with_ = new_phone(), new_phone()
    assert submit(client, consent_ws, "Newsletter", {"phone": without}).status_code == 201
    assert submit(client, consent_ws, "Newsletter", {"phone": with_, "consent": True}).status_code == 201
    assert form_lead(without).consent is None
    assert form_lead(with_).consent["notice_version"] == "2026-10"
    assert submit(client, consent_ws, "Plain", {"phone": new_phone()}).status_code == 201


@pytest.mark.parametrize("value", [1, "yes"])
def test_a_json_submission_consents_with_true_only(client, consent_ws, value):
    # 1 == True, so truthy={True} alone would record a consent for 1.
    phone = new_phone()
    response = submit(client, consent_ws, "Newsletter", {"phone": phone, "consent": value})
    assert response.status_code == 422 and "consent" in response.json["errors"]
    assert not Lead.select().where(Lead.phone == phone).exists()


def test_forms_list_their_notice(client, consent_ws):
    forms = {f["name"]: f for f in client.get("/api/v1/forms", headers=consent_ws.headers()).json["data"]}
    assert forms["Site visit"]["notice"] == NOTICE and forms["Site visit"]["consent_required"] is True
    assert forms["Plain"]["notice"] is None and forms["Plain"]["consent_required"] is False


# --- setup: personal custom fields and form notices --------------------------------------------

def test_text_custom_fields_are_personal_unless_set_false(client, make_lead, make_workspace):
    def change(data):
        data["custom_fields"] += [{"name": "pan_number", "type": "text"},
                                  {"name": "campaign", "type": "text", "personal": False},
                                  {"name": "birth_date", "type": "date", "personal": True}]
    ws = make_workspace(change)
    fields = {f["name"]: f["personal"] for f in client.get("/api/v1/custom-fields", headers=ws.headers()).json["data"]}
    assert fields == {"product_interest": False, "budget_confirmed": False, "family_size": False,
                      "site_visit_on": False, "notes_from_call": True, "pan_number": True, "campaign": False,
                      "birth_date": True}
    lead = make_lead(ws, **personal_details(ws, custom_fields={"pan_number": "ABCDE1234F", "campaign": "Diwali",
                                               "birth_date": "1990-04-01", "product_interest": "2bhk"}))
    erased = erase(client, ws, lead["id"]).json["data"]
    assert erased["custom_fields"] == {"campaign": "Diwali", "product_interest": "2bhk"}


@pytest.mark.parametrize("form, problem", [
    ({"consent_required": True}, "forms[0].notice"),
    ({"notice": NOTICE}, "forms[0].notice_version"),
    ({"notice_version": "v1"}, "forms[0].notice_version"),
])
def test_setup_checks_form_notices(form, problem):
    from conftest import standard_setup
    from leadsvc.provision import SetupError, parse_setup

    data = standard_setup("Notices")
    data["forms"] = [{"name": "F", **form}]
    with pytest.raises(SetupError) as caught:
        parse_setup(data)
    assert any(line.startswith(problem) for line in caught.value.problems), caught.value.problems


# --- the command line ------------------------------------------------------------------------

def test_cli_erase_and_subject_answer_a_request_in_two_commands(client, make_lead, ws, run_cli):
    lead = make_lead(ws, **personal_details(ws))
    phone = lead["contact"]["phone"]
    access = run_cli("subject", "--workspace", ws.public_id, "--phone", phone[3:])
    assert access.exit_code == 0, access.output
    assert [row["id"] for row in json.loads(access.stdout)["leads"]] == [lead["id"]]

    erased = run_cli("erase", "--workspace", ws.public_id, "--phone", phone, "--reason", "Request 7", "--json")
    assert erased.exit_code == 0, erased.output
    assert json.loads(erased.stdout) == {"erased": [lead["id"]]}
    entry = AuditEntry.get((AuditEntry.lead == lead_row(lead["id"]).id) & (AuditEntry.action == "erased"))
    assert entry.changes["reason"]["new"] == "Request 7" and entry.actor_token_id is None

    again = run_cli("erase", "--workspace", ws.public_id, "--phone", phone, "--reason", "Request 7")
    assert again.exit_code == 0 and "nothing was erased" in again.stdout


@pytest.mark.parametrize("args, message", [
    (("--phone", "12345", "--reason", "x"), "--phone"),
    (("--reason", "x"), "--phone"),
    (("--email", "a@example.com", "--reason", " "), "--reason"),
])
def test_cli_erase_refuses_bad_input(ws, run_cli, args, message):
    result = run_cli("erase", "--workspace", ws.public_id, *args)
    assert result.exit_code == 1 and message in result.output
