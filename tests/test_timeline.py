"""A lead's timeline and history: notes, logged contacts, transitions and audit, each through the scope."""

from datetime import datetime, timedelta

import pytest

from leadsvc.models import Activity, AuditEntry, Lead, Note, utcnow
from conftest import ROLE_EMAILS

NORTH_AGENT, SOUTH_AGENT = "n1@t.test", "s1@t.test"


def url(lead, tail):
    return f"/api/v1/leads/{lead}/{tail}"


def move(client, ws, lead, status):
    response = client.post(url(lead, "status"), json={"status": ws.ids.statuses[status]}, headers=ws.headers())
    assert response.status_code == 200, response.json


# --- notes -----------------------------------------------------------------------------------

# A new note's body and an edited one's follow the same rules.
INVALID_NOTES = [
    ({"body": "   "}, "body"),
    ({"body": "x" * 5001}, "body"),
    ({}, "body"),
    ({"body": "ok", "pinned": True}, "pinned"),
]

def test_note_is_trimmed_and_attributed_to_the_token(client, ws, make_lead):
    lead = make_lead(ws, owner=NORTH_AGENT)["id"]
    response = client.post(url(lead, "notes"), json={"body": "  Wants a site visit on Sunday.  "},
                           headers=ws.headers(NORTH_AGENT))
    assert response.status_code == 201
    note = response.json["data"]
    assert note["body"] == "Wants a site visit on Sunday."
    assert note["id"].startswith("note_")
    assert note["author"]["type"] == "token"
    assert note["author"]["member"]["id"] == ws.ids.members[NORTH_AGENT]


def test_note_shows_in_the_lead_timeline_and_audit(client, ws, make_lead):
    lead = make_lead(ws)["id"]
    note = client.post(url(lead, "notes"), json={"body": "Called back"}, headers=ws.headers()).json["data"]
    read = client.get(f"/api/v1/leads/{lead}?include=notes,activities", headers=ws.headers()).json["data"]
    assert read["notes"][0]["id"] == note["id"]
    assert read["activities"][0]["kind"] == "note" and read["activities"][0]["data"]["note"] == note["id"]
    audit = client.get(url(lead, "audit"), headers=ws.headers()).json["data"]
    assert audit[-1]["action"] == "note_added"
    assert audit[-1]["changes"] == {"note": {"old": None, "new": note["id"]}}


@pytest.mark.parametrize("body, field", INVALID_NOTES)
def test_invalid_note_is_422_and_writes_nothing(client, ws, make_lead, body, field):
    lead = make_lead(ws)["id"]
    before = Note.select().count()
    response = client.post(url(lead, "notes"), json=body, headers=ws.headers())
    assert response.status_code == 422
    assert field in response.json["errors"]
    assert Note.select().count() == before


def test_note_of_5000_characters_is_accepted(client, ws, make_lead):
    lead = make_lead(ws)["id"]
    response = client.post(url(lead, "notes"), json={"body": "x" * 5000}, headers=ws.headers())
    assert response.status_code == 201 and len(response.json["data"]["body"]) == 5000


def add_note(client, ws, lead, body, email="admin@t.test"):
    response = client.post(url(lead, "notes"), json={"body": body}, headers=ws.headers(email))
    assert response.status_code == 201, response.json
    return response.json["data"]


def test_notes_are_listed_newest_first_across_pages(client, ws, make_lead):
    lead = make_lead(ws)["id"]
    written = [add_note(client, ws, lead, f"note {i}")["id"] for i in range(3)]
    elsewhere = add_note(client, ws, make_lead(ws)["id"], "another lead's note")["id"]
    ids, path = [], url(lead, "notes") + "?page%5Bsize%5D=2"
    while path:
        page = client.get(path, headers=ws.headers())
        assert page.status_code == 200, page.json
        ids += [note["id"] for note in page.json["data"]]
        path = page.json["links"]["next"]
    expected = [n.public_id for n in Note.select().join(Lead).where(Lead.public_id == lead)
                .order_by(Note.created_at.desc(), Note.public_id.desc())]
    assert ids == expected and sorted(ids) == sorted(written) and elsewhere not in ids


def test_the_author_edits_a_note_and_the_audit_keeps_the_old_body(client, ws, make_lead):
    lead = make_lead(ws, owner=NORTH_AGENT)["id"]
    note = add_note(client, ws, lead, "Wants a 2BHK", NORTH_AGENT)
    response = client.patch(f"/api/v1/notes/{note['id']}", json={"body": "  Wants a 3BHK  "},
                            headers=ws.headers(NORTH_AGENT))
    assert response.status_code == 200, response.json
    assert response.json["data"]["id"] == note["id"] and response.json["data"]["body"] == "Wants a 3BHK"
    read = client.get(f"/api/v1/leads/{lead}?include=notes,activities", headers=ws.headers()).json["data"]
    assert [n["body"] for n in read["notes"]] == ["Wants a 3BHK"]
    assert [a["summary"] for a in read["activities"] if a["kind"] == "note"] == ["Wants a 3BHK"]
    entry = client.get(url(lead, "audit"), headers=ws.headers()).json["data"][-1]
    assert entry["action"] == "note_edited"
    assert entry["changes"]["body"] == {"old": "Wants a 2BHK", "new": "Wants a 3BHK"}
    assert entry["actor"]["member"]["id"] == ws.ids.members[NORTH_AGENT]


def test_an_unchanged_note_body_writes_no_audit_entry(client, ws, make_lead):
    lead = make_lead(ws)["id"]
    note = add_note(client, ws, lead, "Same words")
    before = AuditEntry.select().count()
    response = client.patch(f"/api/v1/notes/{note['id']}", json={"body": "Same words"}, headers=ws.headers())
    assert response.status_code == 200 and response.json["data"]["body"] == "Same words"
    assert AuditEntry.select().count() == before


def test_deleting_a_note_removes_it_and_its_timeline_entry_and_audits_the_old_body(client, ws, make_lead):
    lead = make_lead(ws)["id"]
    note = add_note(client, ws, lead, "Called the wrong number")
    response = client.delete(f"/api/v1/notes/{note['id']}", headers=ws.headers())
    assert response.status_code == 204 and response.get_data() == b""
    read = client.get(f"/api/v1/leads/{lead}?include=notes,activities", headers=ws.headers()).json["data"]
    assert read["notes"] == [] and "note" not in {a["kind"] for a in read["activities"]}
    assert client.get(url(lead, "notes"), headers=ws.headers()).json["data"] == []
    entry = client.get(url(lead, "audit"), headers=ws.headers()).json["data"][-1]
    assert entry["action"] == "note_deleted"
    assert entry["changes"] == {"note": {"old": note["id"], "new": None},
                                "body": {"old": "Called the wrong number", "new": None}}
    again = client.delete(f"/api/v1/notes/{note['id']}", headers=ws.headers())
    assert again.status_code == 404 and again.json["code"] == "not_found"


@pytest.mark.parametrize("method", ["patch", "delete"])
@pytest.mark.parametrize("caller, status", [("admin@t.test", None), ("nmgr@t.test", 403), ("n2@t.test", 403)])
def test_a_note_by_someone_else_is_403_unless_the_caller_is_an_admin(client, ws, make_lead, method, caller, status):
    lead = make_lead(ws, owner=NORTH_AGENT)["id"]
    note = add_note(client, ws, lead, "Mine", NORTH_AGENT)
    if caller == "n2@t.test":   # another agent, given the lead so that it is in scope
        client.patch(f"/api/v1/leads/{lead}", json={"owner": ws.ids.members[caller]}, headers=ws.headers())
    response = getattr(client, method)(f"/api/v1/notes/{note['id']}", json={"body": "Theirs"},
                                       headers=ws.headers(caller))
    expected = status or (200 if method == "patch" else 204)
    assert response.status_code == expected, response.get_data(as_text=True)
    kept = Note.get_or_none(Note.public_id == note["id"])
    if status == 403:
        assert response.json["code"] == "forbidden" and kept.body == "Mine"


@pytest.mark.parametrize("body, field", INVALID_NOTES)
def test_an_edited_note_is_held_to_the_rules_of_a_new_one(client, ws, make_lead, body, field):
    lead = make_lead(ws)["id"]
    note = add_note(client, ws, lead, "Original")
    response = client.patch(f"/api/v1/notes/{note['id']}", json=body, headers=ws.headers())
    assert response.status_code == 422 and field in response.json["errors"]
    assert Note.get(Note.public_id == note["id"]).body == "Original"


@pytest.mark.parametrize("method", ["patch", "delete"])
@pytest.mark.parametrize("note_id", ["note_" + "A" * 22, "note_x", "ld_" + "A" * 22])
def test_an_unknown_note_is_404(client, ws, method, note_id):
    response = getattr(client, method)(f"/api/v1/notes/{note_id}", json={"body": "x"}, headers=ws.headers())
    assert response.status_code == 404 and response.json["code"] == "not_found"


def test_a_note_of_an_erased_lead_cannot_change(client, ws, make_lead):
    lead = make_lead(ws)["id"]
    note = add_note(client, ws, lead, "Prefers calls")
    assert client.post(f"/api/v1/leads/{lead}/erase", json={"reason": "Asked"}, headers=ws.headers()).status_code == 200
    for method in ("patch", "delete"):
        response = getattr(client, method)(f"/api/v1/notes/{note['id']}", json={"body": "x"}, headers=ws.headers())
        assert response.status_code == 409 and response.json["code"] == "conflict"


# --- activities ------------------------------------------------------------------------------

def test_logged_call_moves_last_activity_and_score(client, ws, make_lead):
    lead = make_lead(ws)["id"]
    before = client.get(f"/api/v1/leads/{lead}", headers=ws.headers()).json["data"]
    response = client.post(url(lead, "activities"),
                           json={"kind": "call", "summary": "Discussed the 3BHK", "occurred_at": "2026-01-05T10:00:00+05:30"},
                           headers=ws.headers())
    assert response.status_code == 201
    activity, after = response.json["data"], response.json["lead"]
    assert activity["kind"] == "call" and activity["occurred_at"] == "2026-01-05T04:30:00.000000Z"
    assert after["last_activity_at"] == "2026-01-05T04:30:00.000000Z"
    assert after["score"] > before["score"]
    assert {"reason": "engagement", "points": 5} in after["score_reasons"]


def test_an_older_activity_does_not_move_last_activity_back(client, ws, make_lead):
    lead = make_lead(ws)["id"]
    client.post(url(lead, "activities"), json={"kind": "meeting", "summary": "Site visit",
                                               "occurred_at": "2026-02-01T10:00:00Z"}, headers=ws.headers())
    response = client.post(url(lead, "activities"), json={"kind": "sms", "summary": "Sent brochure",
                                                          "occurred_at": "2026-01-01T10:00:00Z"}, headers=ws.headers())
    assert response.json["lead"]["last_activity_at"] == "2026-02-01T10:00:00.000000Z"


def test_activity_without_occurred_at_happened_now(client, ws, make_lead):
    lead = make_lead(ws)["id"]
    start = utcnow()
    response = client.post(url(lead, "activities"), json={"kind": "whatsapp", "summary": "Hi"}, headers=ws.headers())
    at = datetime.strptime(response.json["data"]["occurred_at"], "%Y-%m-%dT%H:%M:%S.%fZ")
    assert start <= at <= utcnow()


def test_logging_an_activity_is_audited_with_old_and_new_values(client, ws, make_lead):
    lead = make_lead(ws)["id"]
    activity = client.post(url(lead, "activities"), json={"kind": "email", "summary": "Sent prices",
                                                          "occurred_at": "2026-01-02T00:00:00Z"},
                           headers=ws.headers()).json["data"]
    entry = client.get(url(lead, "audit"), headers=ws.headers()).json["data"][-1]
    assert entry["action"] == "activity_logged"
    assert entry["changes"]["activity"]["new"] == activity["id"]
    assert entry["changes"]["last_activity_at"] == {"old": None, "new": "2026-01-02T00:00:00.000000Z"}


@pytest.mark.parametrize("body, field", [
    ({"kind": "fax", "summary": "x"}, "kind"),
    ({"kind": "created", "summary": "x"}, "kind"),
    ({"kind": "call"}, "summary"),
    ({"kind": "call", "summary": " "}, "summary"),
    ({"kind": "call", "summary": "x" * 5001}, "summary"),
    ({"kind": "call", "summary": "x", "occurred_at": "2026-01-05T10:00:00"}, "occurred_at"),
    ({"kind": "call", "summary": "x", "occurred_at": "yesterday"}, "occurred_at"),
    ({"kind": "call", "summary": "x",
      "occurred_at": (utcnow() + timedelta(hours=1)).isoformat() + "Z"}, "occurred_at"),
])
def test_invalid_activity_is_422_and_changes_nothing(client, ws, make_lead, body, field):
    lead = make_lead(ws)["id"]
    before = (Activity.select().count(), Lead.get(Lead.public_id == lead).version)
    response = client.post(url(lead, "activities"), json=body, headers=ws.headers())
    assert response.status_code == 422
    assert field in response.json["errors"]
    assert (Activity.select().count(), Lead.get(Lead.public_id == lead).version) == before


def test_activity_a_minute_ahead_is_within_clock_skew(client, ws, make_lead):
    lead = make_lead(ws)["id"]
    soon = (utcnow() + timedelta(minutes=1)).isoformat() + "Z"
    response = client.post(url(lead, "activities"), json={"kind": "call", "summary": "x", "occurred_at": soon},
                           headers=ws.headers())
    assert response.status_code == 201


# --- transitions and audit -------------------------------------------------------------------

def test_transitions_are_listed_oldest_first_across_pages(client, ws, make_lead):
    lead = make_lead(ws)["id"]
    for status in ("Contacted", "Qualified", "Proposal"):
        move(client, ws, lead, status)
    seen, path = [], url(lead, "transitions") + "?page%5Bsize%5D=2"
    while path:
        page = client.get(path, headers=ws.headers()).json
        seen += [(t["from"]["name"] if t["from"] else None, t["to"]["name"]) for t in page["data"]]
        assert page["meta"]["has_more"] == (page["links"]["next"] is not None)
        path = page["links"]["next"]
    assert seen == [(None, "New"), ("New", "Contacted"), ("Contacted", "Qualified"), ("Qualified", "Proposal")]


def test_transition_rows_hold_actor_and_time_in_previous_status(client, ws, make_lead):
    lead = make_lead(ws)["id"]
    move(client, ws, lead, "Contacted")
    first, second = client.get(url(lead, "transitions"), headers=ws.headers()).json["data"]
    assert first["from"] is None and first["seconds_in_from"] is None
    assert second["seconds_in_from"] >= 0
    assert second["actor"]["member"]["id"] == ws.ids.members["admin@t.test"]


def test_audit_lists_creation_first(client, ws, make_lead):
    lead = make_lead(ws)["id"]
    client.post(url(lead, "notes"), json={"body": "Interested"}, headers=ws.headers())
    move(client, ws, lead, "Contacted")
    actions = [e["action"] for e in client.get(url(lead, "audit"), headers=ws.headers()).json["data"]]
    assert actions == ["created", "note_added", "status_changed"]


def test_audit_pages_walk_every_entry_once(client, ws, make_lead):
    lead = make_lead(ws)["id"]
    for i in range(4):
        client.post(url(lead, "notes"), json={"body": f"note {i}"}, headers=ws.headers())
    ids, path = [], url(lead, "audit") + "?page%5Bsize%5D=1"
    while path:
        page = client.get(path, headers=ws.headers()).json
        ids += [e["id"] for e in page["data"]]
        path = page["links"]["next"]
    expected = [e.public_id for e in AuditEntry.select().join(Lead).where(Lead.public_id == lead)
                .order_by(AuditEntry.at, AuditEntry.public_id)]
    assert ids == expected and len(ids) == 5


@pytest.mark.parametrize("tail", ["transitions", "audit", "notes"])
@pytest.mark.parametrize("query, field", [
    ("page%5Bsize%5D=0", "page[size]"),
    ("page%5Bsize%5D=201", "page[size]"),
    ("page%5Bafter%5D=not-a-cursor", "page[after]"),
    ("sort=-at", "sort"),
])
def test_bad_history_query_is_422(client, ws, make_lead, tail, query, field):
    lead = make_lead(ws)["id"]
    response = client.get(url(lead, tail) + "?" + query, headers=ws.headers())
    assert response.status_code == 422
    assert field in response.json["errors"]


@pytest.mark.parametrize("tail", ["transitions", "audit", "notes"])
def test_a_cursor_from_another_lead_is_422(client, ws, make_lead, tail):
    first, second = make_lead(ws)["id"], make_lead(ws)["id"]
    for lead in (first, second):
        move(client, ws, lead, "Contacted")
        add_note(client, ws, lead, "one")
        add_note(client, ws, lead, "two")
    next_link = client.get(url(first, tail) + "?page%5Bsize%5D=1", headers=ws.headers()).json["links"]["next"]
    cursor = next_link.split("page%5Bafter%5D=")[1]
    response = client.get(url(second, tail) + f"?page%5Bsize%5D=1&page%5Bafter%5D={cursor}", headers=ws.headers())
    assert response.status_code == 422 and "page[after]" in response.json["errors"]


# --- scope matrix ----------------------------------------------------------------------------

ENDPOINTS = {
    "note": ("post", "notes", {"body": "hello"}, "notes:write", 201),
    "notes": ("get", "notes", None, "leads:read", 200),
    "activity": ("post", "activities", {"kind": "call", "summary": "hello"}, "activities:write", 201),
    "transitions": ("get", "transitions", None, "leads:read", 200),
    "audit": ("get", "audit", None, "audit:read", 200),
}


def call(client, endpoint, lead, headers):
    method, tail, body, _, _ = ENDPOINTS[endpoint]
    return getattr(client, method)(url(lead, tail), json=body, headers=headers)


def expected_status(endpoint, role, in_scope):
    ok = ENDPOINTS[endpoint][4]
    if role == "agent" and endpoint == "audit":
        return 403   # agents never hold audit:read, whatever the lead
    return ok if in_scope else 404


@pytest.mark.parametrize("endpoint", list(ENDPOINTS))
@pytest.mark.parametrize("role", list(ROLE_EMAILS))
def test_each_role_reaches_only_leads_in_its_scope(client, ws, make_lead, endpoint, role):
    mine = make_lead(ws, owner=NORTH_AGENT)["id"]            # the North agent's, in the North team
    theirs = make_lead(ws, owner=SOUTH_AGENT)["id"]          # outside the North manager's and agent's scope
    headers = ws.headers(ROLE_EMAILS[role])
    assert call(client, endpoint, mine, headers).status_code == expected_status(endpoint, role, True)
    response = call(client, endpoint, theirs, headers)
    assert response.status_code == expected_status(endpoint, role, role == "admin")
    if response.status_code == 404:
        assert theirs not in response.get_data(as_text=True).replace(f"No lead {theirs}.", "")


@pytest.mark.parametrize("endpoint", list(ENDPOINTS))
def test_a_token_without_the_ability_is_403(client, ws, make_lead, endpoint):
    lead = make_lead(ws)["id"]
    others = tuple(a for a in ("leads:read", "notes:write", "activities:write", "audit:read")
                   if a != ENDPOINTS[endpoint][3])
    response = call(client, endpoint, lead, ws.headers("admin@t.test", others))
    assert response.status_code == 403 and ENDPOINTS[endpoint][3] in response.json["detail"]


@pytest.mark.parametrize("endpoint", list(ENDPOINTS))
def test_another_workspace_sees_no_lead_of_this_one(client, ws, other_ws, make_lead, endpoint):
    lead = make_lead(ws)["id"]
    before = (Note.select().count(), Activity.select().count())
    response = call(client, endpoint, lead, other_ws.headers())
    assert response.status_code == 404 and response.json["code"] == "not_found"
    assert (Note.select().count(), Activity.select().count()) == before


@pytest.mark.parametrize("endpoint", list(ENDPOINTS))
def test_no_token_is_401(client, ws, make_lead, endpoint):
    lead = make_lead(ws)["id"]
    assert call(client, endpoint, lead, {}).status_code == 401


def test_history_never_shows_internal_ids(client, ws, make_lead):
    lead = make_lead(ws, owner=NORTH_AGENT)["id"]
    move(client, ws, lead, "Contacted")
    client.post(url(lead, "activities"), json={"kind": "call", "summary": "x"}, headers=ws.headers())

    def numbers(value, key=None):
        if isinstance(value, dict):
            return [n for k, v in value.items() for n in numbers(v, k)]
        if isinstance(value, list):
            return [n for v in value for n in numbers(v, key)]
        return [(key, value)] if isinstance(value, int) and not isinstance(value, bool) else []

    for tail in ("transitions", "audit"):
        found = numbers(client.get(url(lead, tail), headers=ws.headers()).json["data"])
        assert {key for key, _ in found} <= {"seconds_in_from", "position", "old", "new"}
        # Scores are the only numbers audit changes hold here; ids are always prefixed strings.
        assert all(key in ("seconds_in_from", "position") or 0 <= value <= 100 for key, value in found)
