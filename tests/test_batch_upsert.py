"""Batch creates (POST /api/v1/leads/batch) and upserts (on_duplicate) on single creates, batch items
and CSV imports: each through the single create's path."""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import lead_body, new_phone
from leadsvc.models import Activity, AuditEntry, Lead
from served import call

BATCH = "/api/v1/leads/batch"


def batch(client, ws, items, headers=None, **kwargs):
    return client.post(BATCH, json={"leads": items}, headers=headers or ws.headers(), **kwargs)


def audit_of(lead_id: str) -> list[AuditEntry]:
    lead = Lead.get(Lead.public_id == lead_id)
    return list(AuditEntry.select().where(AuditEntry.lead == lead.id).order_by(AuditEntry.at, AuditEntry.id))


def kinds_of(lead_id: str) -> Counter:
    lead = Lead.get(Lead.public_id == lead_id)
    return Counter(a.kind for a in Activity.select().where(Activity.lead == lead.id))


# --- batch -----------------------------------------------------------------------------------

def test_a_batch_answers_each_item_in_order_as_a_single_create_would(client, make_lead, ws):
    existing = make_lead(ws)
    items = [lead_body(ws, first_name="New"), {"phone": existing["contact"]["phone"]},
             lead_body(ws, phone="12345"), "not an object", lead_body(ws, custom_fields={"product_interest": "castle"})]
    response = batch(client, ws, items)
    assert response.status_code == 200, response.json
    results = response.json["data"]
    assert [r["index"] for r in results] == [0, 1, 2, 3, 4]
    assert [r["status"] for r in results] == [201, 200, 422, 422, 422]
    assert response.json["meta"] == {"created": 1, "duplicates": 1, "failed": 3}

    created, duplicate, bad_phone, not_object, bad_field = results
    assert created["duplicate"] is False and created["errors"] is None
    assert created["lead"]["contact"]["first_name"] == "New"
    lead = Lead.get(Lead.public_id == created["lead"]["id"])
    assert lead.owner_id is not None and lead.score > 0, "routed and scored like a single create"
    assert [entry.action for entry in audit_of(lead.public_id)] == ["created"]
    assert kinds_of(lead.public_id) == {"created": 1, "assigned": 1}

    assert duplicate["duplicate"] is True and duplicate["lead"]["id"] == existing["id"]
    assert duplicate["matched_on"] == ["phone"] and "updated_fields" not in duplicate
    assert kinds_of(existing["id"])["duplicate_submission"] == 1

    assert bad_phone["lead"] is None and "phone" in bad_phone["errors"]
    assert "body" in not_object["errors"]
    assert "custom_fields.product_interest" in bad_field["errors"]


def test_items_of_one_batch_with_the_same_contact_make_one_lead(client, ws):
    phone = new_phone()
    response = batch(client, ws, [lead_body(ws, phone=phone), lead_body(ws, phone=phone, first_name="Again")])
    first, second = response.json["data"]
    assert (first["status"], second["status"]) == (201, 200)
    assert second["lead"]["id"] == first["lead"]["id"]
    assert Lead.select().where(Lead.phone == phone).count() == 1


@pytest.mark.parametrize("item", [None, 7, [], "text"])
def test_an_item_that_is_not_an_object_fails_alone(client, ws, item):
    # Only the envelope fails the whole batch: null is an item that is no object, like 7.
    after = lead_body(ws)
    response = batch(client, ws, [item, after])
    assert response.status_code == 200, response.json
    failed, created = response.json["data"]
    assert failed["status"] == 422 and failed["lead"] is None and "body" in failed["errors"]
    assert created["status"] == 201 and created["lead"]["contact"]["phone"] == after["phone"]
    assert response.json["meta"] == {"created": 1, "duplicates": 0, "failed": 1}


@pytest.mark.parametrize("text", ["Asha\u0000", "\ud800"])
def test_an_item_holding_text_no_database_stores_fails_alone(client, ws, text):
    # Only the envelope fails the whole batch: text no database stores is one item's failure.
    after = lead_body(ws)
    response = batch(client, ws, [lead_body(ws, first_name=text), after, text])
    assert response.status_code == 200, response.json
    bad_name, created, bad_item = response.json["data"]
    assert bad_name["status"] == 422 and list(bad_name["errors"]) == ["first_name"]
    assert bad_item["status"] == 422 and list(bad_item["errors"]) == ["body"]
    assert created["status"] == 201 and created["lead"]["contact"]["phone"] == after["phone"]


def test_the_envelope_still_refuses_text_no_database_stores(client, ws):
    response = client.post(BATCH, json={"leads": [lead_body(ws)], "\u0000": 1}, headers=ws.headers())
    assert response.status_code == 422 and response.json["code"] == "validation_failed"


@pytest.mark.parametrize("count", [0, 101])
def test_an_empty_batch_or_one_over_100_items_is_422_and_creates_nothing(client, ws, count):
    before = Lead.select().count()
    response = batch(client, ws, [lead_body(ws) for _ in range(count)])
    assert response.status_code == 422 and "leads" in response.json["errors"]
    assert Lead.select().count() == before


@pytest.mark.parametrize("body", [{}, {"leads": {"phone": "+919876543210"}}, {"leads": [], "extra": 1}])
def test_a_batch_body_of_the_wrong_shape_is_422(client, ws, body):
    response = client.post(BATCH, json=body, headers=ws.headers())
    assert response.status_code == 422 and response.json["code"] == "validation_failed"


def test_a_batch_of_100_creates_100_leads(client, ws):
    response = batch(client, ws, [lead_body(ws) for _ in range(100)])
    assert response.status_code == 200
    assert response.json["meta"] == {"created": 100, "duplicates": 0, "failed": 0}
    assert len({r["lead"]["id"] for r in response.json["data"]}) == 100


def test_an_item_that_fails_leaves_the_others_as_they_are(client, make_lead, ws):
    # The agent n1 cannot see s1's lead: its duplicate is a 409, as a single create's would be.
    theirs = make_lead(ws, email="south@example.com")
    moved = client.patch(f"/api/v1/leads/{theirs['id']}", json={"owner": ws.ids.members["s1@t.test"]},
                         headers=ws.headers())
    assert moved.status_code == 200
    response = batch(client, ws, [lead_body(ws), {"email": "south@example.com"}, lead_body(ws)],
                     headers=ws.headers("n1@t.test"))
    statuses = [r["status"] for r in response.json["data"]]
    assert statuses == [201, 409, 201]
    conflict = response.json["data"][1]
    assert conflict["lead"] is None and conflict["errors"]["body"]
    assert theirs["id"] not in response.get_data(as_text=True)
    assert response.json["meta"] == {"created": 2, "duplicates": 0, "failed": 1}


def test_a_create_only_token_sees_only_the_id_of_a_duplicate_in_a_batch(client, make_lead, ws):
    existing = make_lead(ws)
    response = batch(client, ws, [{"phone": existing["contact"]["phone"]}, lead_body(ws)],
                     headers=ws.headers(abilities=("leads:create",)))
    duplicate, created = response.json["data"]
    assert duplicate["lead"] == {"id": existing["id"]}
    assert created["status"] == 201 and created["lead"]["contact"]["phone"], "a 201 shows the new lead"


def test_an_idempotency_key_covers_the_whole_batch(client, ws):
    items = [lead_body(ws) for _ in range(3)]
    headers = {**ws.headers(), "Idempotency-Key": "batch-key-1"}
    first = batch(client, ws, items, headers=headers)
    again = batch(client, ws, items, headers=headers)
    assert first.status_code == again.status_code == 200
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json == first.json
    assert Lead.select().where(Lead.phone.in_([i["phone"] for i in items])).count() == 3
    other = batch(client, ws, [lead_body(ws)], headers=headers)
    assert other.status_code == 422 and "Idempotency-Key" in other.json["errors"]


def test_with_an_idempotency_key_a_failed_item_still_leaves_the_others(client, ws):
    headers = {**ws.headers(), "Idempotency-Key": "batch-key-2"}
    items = [lead_body(ws), lead_body(ws, source="src_0000000000000000"), lead_body(ws)]
    response = batch(client, ws, items, headers=headers)
    assert [r["status"] for r in response.json["data"]] == [201, 422, 201]
    assert Lead.select().where(Lead.phone.in_([items[0]["phone"], items[2]["phone"]])).count() == 2
    assert not Lead.select().where(Lead.phone == items[1]["phone"]).exists()



def test_a_keyed_batch_commits_item_by_item_so_other_writes_go_on_meanwhile(app, ws, other_ws, monkeypatch):
    """A keyed batch held halfway has committed the items before the hold, and neither a create in
    another workspace nor a retry of the batch waits for it: the key holds no transaction across
    the items. The batch then answers as usual, and a retry replays that answer."""
    from leadsvc import pipeline

    items = [lead_body(ws) for _ in range(100)]
    hold_at, halfway, go = items[50]["phone"], threading.Event(), threading.Event()
    create_lead = pipeline.create_lead

    def held_halfway(data, actor, refs):
        if data.get("phone") == hold_at:
            halfway.set()
            go.wait(60)
        return create_lead(data, actor, refs)

    monkeypatch.setattr(pipeline, "create_lead", held_halfway)
    headers = {**ws.headers(), "Idempotency-Key": "held-batch"}
    answers = []
    batch_thread = threading.Thread(target=lambda: answers.append(batch(app.test_client(), ws, items, headers=headers)))
    batch_thread.start()
    try:
        assert halfway.wait(60), "the batch never reached its 51st item"
        client = app.test_client()
        other = client.post("/api/v1/leads", json=lead_body(other_ws), headers=other_ws.headers())
        retry = batch(client, ws, items, headers=headers)
        committed = Lead.select().where(Lead.phone.in_([item["phone"] for item in items])).count()
    finally:
        go.set()
        batch_thread.join(120)
    assert other.status_code == 201, other.json
    assert retry.status_code == 409 and retry.json["code"] == "conflict" and retry.headers["Retry-After"] == "1"
    assert committed == 50, "the items before the hold are committed"
    [first] = answers
    assert first.status_code == 200 and first.json["meta"]["created"] == 100
    again = batch(app.test_client(), ws, items, headers=headers)
    assert again.status_code == 200 and again.headers["Idempotent-Replayed"] == "true"
    assert again.json == first.json


@pytest.mark.parametrize("lapsed", [False, True], ids=["open", "lapsed"])
def test_a_keyed_batch_whose_process_died_is_409_until_its_reservation_lapses_then_runs_afresh(client, ws, lapsed):
    """A batch commits its key's reservation on its own; a process that dies mid-batch never
    finishes it. A retry is 409 while the reservation is open, and runs as new once it lapsed."""
    from datetime import timedelta

    from leadsvc.auth import hash_token
    from leadsvc.idempotency import RESERVED_FOR
    from leadsvc.models import IdempotencyKey, Token, utcnow

    key, items = f"died-{lapsed}", [lead_body(ws) for _ in range(2)]
    scope = "tok:" + Token.get(Token.secret_hash == hash_token(ws.token())).public_id
    reserved = utcnow() - (RESERVED_FOR + timedelta(seconds=1) if lapsed else timedelta(seconds=1))
    IdempotencyKey.create(scope=scope, key=key, request_hash="x" * 64, status=0, headers={}, body=b"",
                          created_at=reserved, expires_at=reserved + RESERVED_FOR)
    retry = batch(client, ws, items, headers={**ws.headers(), "Idempotency-Key": key})
    if lapsed:
        assert retry.status_code == 200 and "Idempotent-Replayed" not in retry.headers
        assert retry.json["meta"]["created"] == 2
    else:
        assert retry.status_code == 409 and retry.json["code"] == "conflict"
        assert not Lead.select().where(Lead.phone.in_([item["phone"] for item in items])).exists()


# --- upsert ----------------------------------------------------------------------------------

def test_on_duplicate_update_replaces_the_fields_sent_and_audits_them(client, make_lead, ws):
    lead = make_lead(ws, first_name="Asha", email="asha@example.com",
                     custom_fields={"product_interest": "2bhk", "family_size": 3})
    response = client.post("/api/v1/leads", headers=ws.headers(), json={
        "phone": lead["contact"]["phone"], "first_name": "Asha Devi", "estimated_value": 5_000_000,
        "custom_fields": {"product_interest": "villa"}, "on_duplicate": "update"})
    assert response.status_code == 200, response.json
    body = response.json
    assert body["duplicate"] is True and body["matched_on"] == ["phone"] and body["data"]["id"] == lead["id"]
    assert body["updated_fields"] == ["custom_fields.product_interest", "estimated_value", "first_name"]
    data = body["data"]
    assert data["contact"]["first_name"] == "Asha Devi" and data["contact"]["email"] == "asha@example.com"
    assert data["custom_fields"] == {"product_interest": "villa", "family_size": 3}, "merged key by key"
    assert data["score"] > lead["score"], "rescored"
    update = audit_of(lead["id"])[-1]
    assert update.action == "updated"
    assert update.changes["first_name"] == {"old": "Asha", "new": "Asha Devi"}
    assert update.changes["custom_fields.product_interest"] == {"old": "2bhk", "new": "villa"}
    assert kinds_of(lead["id"])["duplicate_submission"] == 1


def test_on_duplicate_fill_empty_fills_only_the_empty_fields(client, make_lead, ws):
    lead = make_lead(ws, first_name="Asha", last_name="", custom_fields={"product_interest": "2bhk"})
    response = client.post("/api/v1/leads", headers=ws.headers(), json={
        "phone": lead["contact"]["phone"], "first_name": "Other", "last_name": "Rao", "email": "fill@example.com",
        "custom_fields": {"product_interest": "villa", "family_size": 4}, "on_duplicate": "fill_empty"})
    assert response.status_code == 200, response.json
    assert response.json["updated_fields"] == ["custom_fields.family_size", "email", "last_name"]
    contact = response.json["data"]["contact"]
    assert (contact["first_name"], contact["last_name"], contact["email"]) == ("Asha", "Rao", "fill@example.com")
    assert response.json["data"]["custom_fields"] == {"product_interest": "2bhk", "family_size": 4}


def test_an_upsert_that_changes_nothing_answers_no_fields_and_writes_no_audit_entry(client, make_lead, ws):
    lead = make_lead(ws, first_name="Asha")
    response = client.post("/api/v1/leads", headers=ws.headers(),
                           json={"phone": lead["contact"]["phone"], "first_name": "Asha", "on_duplicate": "update"})
    assert response.status_code == 200 and response.json["updated_fields"] == []
    assert [entry.action for entry in audit_of(lead["id"])] == ["created"]


def test_ignore_answers_as_a_plain_duplicate(client, make_lead, ws):
    lead = make_lead(ws, first_name="Asha")
    response = client.post("/api/v1/leads", headers=ws.headers(),
                           json={"phone": lead["contact"]["phone"], "first_name": "Bea", "on_duplicate": "ignore"})
    assert response.status_code == 200 and "updated_fields" not in response.json
    assert response.json["data"]["contact"]["first_name"] == "Asha"


def test_an_upsert_without_leads_update_is_403_when_a_duplicate_is_found_and_changes_nothing(client, make_lead, ws):
    lead = make_lead(ws, first_name="Asha")
    headers = ws.headers(abilities=("leads:create", "leads:read"))
    body = {"phone": lead["contact"]["phone"], "first_name": "Bea", "on_duplicate": "update"}
    response = client.post("/api/v1/leads", headers=headers, json=body)
    assert response.status_code == 403 and response.json["code"] == "forbidden"
    assert "leads:update" in response.json["detail"]
    assert Lead.get(Lead.public_id == lead["id"]).first_name == "Asha"
    assert "duplicate_submission" not in kinds_of(lead["id"])
    fresh = client.post("/api/v1/leads", headers=headers, json={**body, "phone": new_phone()})
    assert fresh.status_code == 201, "without a duplicate there is nothing to update"
    in_batch = batch(client, ws, [body, {**body, "on_duplicate": "fill_empty"}], headers=headers).json["data"]
    assert [item["status"] for item in in_batch] == [403, 403] and in_batch[0]["errors"]["body"]


def test_an_upsert_of_a_lead_outside_the_scope_is_409_and_changes_nothing(client, make_lead, ws):
    lead = make_lead(ws, first_name="Asha")
    client.patch(f"/api/v1/leads/{lead['id']}", json={"owner": ws.ids.members["s1@t.test"]}, headers=ws.headers())
    response = client.post("/api/v1/leads", headers=ws.headers("n1@t.test"),
                           json={"phone": lead["contact"]["phone"], "first_name": "Bea", "on_duplicate": "update"})
    assert response.status_code == 409
    assert Lead.get(Lead.public_id == lead["id"]).first_name == "Asha"


def test_an_upsert_to_an_e_mail_another_lead_has_is_409(client, make_lead, ws):
    make_lead(ws, email="taken@example.com")
    lead = make_lead(ws)
    response = client.post("/api/v1/leads", headers=ws.headers(), json={
        "phone": lead["contact"]["phone"], "email": "taken@example.com", "on_duplicate": "update"})
    assert response.status_code == 409
    assert Lead.get(Lead.public_id == lead["id"]).email is None


def test_a_create_only_upserter_sees_the_id_and_the_fields_it_changed(client, make_lead, ws):
    lead = make_lead(ws, first_name="Asha")
    response = client.post("/api/v1/leads", headers=ws.headers(abilities=("leads:create", "leads:update")),
                           json={"phone": lead["contact"]["phone"], "first_name": "Bea", "on_duplicate": "update"})
    assert response.status_code == 200
    assert response.json["data"] == {"id": lead["id"]} and response.json["updated_fields"] == ["first_name"]


def test_batch_items_upsert_each_as_they_say(client, make_lead, ws):
    one, two = make_lead(ws, first_name="One"), make_lead(ws, first_name="Two", last_name="")
    response = batch(client, ws, [
        {"phone": one["contact"]["phone"], "first_name": "Uno", "on_duplicate": "update"},
        {"phone": two["contact"]["phone"], "first_name": "Dos", "last_name": "Tres", "on_duplicate": "fill_empty"},
        {"phone": one["contact"]["phone"], "first_name": "Ignored"},
    ])
    results = response.json["data"]
    assert [(r["status"], r.get("updated_fields")) for r in results] == [
        (200, ["first_name"]), (200, ["last_name"]), (200, None)]
    assert results[0]["lead"]["contact"]["first_name"] == "Uno"
    assert results[1]["lead"]["contact"]["first_name"] == "Two"
    assert results[2]["lead"]["contact"]["first_name"] == "Uno"


def test_a_web_form_cannot_upsert(client, ws):
    from leadsvc.schemas import FormSubmissionSchema

    assert "on_duplicate" not in FormSubmissionSchema().fields


@pytest.mark.parametrize("value", ["replace", "", None, 1])
def test_an_unknown_on_duplicate_is_422(client, ws, value):
    response = client.post("/api/v1/leads", headers=ws.headers(), json=lead_body(ws, on_duplicate=value) | (
        {"on_duplicate": None} if value is None else {}))
    assert response.status_code == 422 and "on_duplicate" in response.json["errors"]


# --- concurrency -----------------------------------------------------------------------------

THREADS = 12


def race(base_url, bodies, headers):
    start = threading.Barrier(len(bodies))

    def post(body):
        start.wait()
        reply = call(base_url, "POST", "/api/v1/leads", json_body=body, headers=headers)
        return reply.status, reply.json()

    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(post, bodies))


def test_concurrent_upserts_of_one_new_contact_make_one_lead_and_apply_each_update_once(live_server, ws):
    phone = new_phone()
    notes = [f"call {i}" for i in range(THREADS)]
    bodies = [{"phone": phone, "custom_fields": {"notes_from_call": note}, "on_duplicate": "update"} for note in notes]
    results = race(live_server, bodies, ws.headers())
    assert Counter(status for status, _ in results) == {201: 1, 200: THREADS - 1}, results
    assert len({payload["data"]["id"] for _, payload in results}) == 1
    lead_id = results[0][1]["data"]["id"]
    assert Lead.select().where(Lead.phone == phone).count() == 1
    assert all(payload["updated_fields"] == ["custom_fields.notes_from_call"]
               for status, payload in results if status == 200)

    # Every update applied once, one after the other: each audit entry's old value is the one
    # before it wrote, the first is the creating value, and the last is what the lead holds.
    entries = audit_of(lead_id)
    created, updates = entries[0], entries[1:]
    assert created.action == "created" and [e.action for e in updates] == ["updated"] * (THREADS - 1)
    chain = [created.changes["custom_fields"]["new"]["notes_from_call"]]
    for entry in updates:
        change = entry.changes["custom_fields.notes_from_call"]
        assert change["old"] == chain[-1]
        chain.append(change["new"])
    assert sorted(chain) == sorted(notes), "each value written exactly once"
    assert Lead.get(Lead.public_id == lead_id).custom_fields["notes_from_call"] == chain[-1]
    assert kinds_of(lead_id)["duplicate_submission"] == THREADS - 1


def test_concurrent_fill_empty_upserts_fill_a_field_once(live_server, client, make_lead, ws):
    lead = make_lead(ws)
    bodies = [{"phone": lead["contact"]["phone"], "email": f"fill{i}@example.com", "on_duplicate": "fill_empty"}
              for i in range(THREADS)]
    results = race(live_server, bodies, ws.headers())
    assert all(status == 200 for status, _ in results), results
    filled = [payload for _, payload in results if payload["updated_fields"]]
    assert len(filled) == 1 and filled[0]["updated_fields"] == ["email"]
    email = filled[0]["data"]["contact"]["email"]
    assert Lead.get(Lead.public_id == lead["id"]).email == email
    assert [e.action for e in audit_of(lead["id"])] == ["created", "updated"]


# --- CSV import ------------------------------------------------------------------------------

@pytest.mark.parametrize("mode, first_name, email, updated", [
    ("ignore", "Asha", None, None),
    ("update", "Imported", "imp@example.com", ["email", "first_name"]),
    ("fill_empty", "Asha", "imp@example.com", ["email"]),
])
def test_the_csv_import_treats_duplicates_as_on_duplicate_says(client, make_lead, ws, run_cli, tmp_path, mode,
                                                                first_name, email, updated):
    import json

    lead = make_lead(ws, first_name="Asha")
    path = tmp_path / "leads.csv"
    path.write_text(f"first_name,phone,email\nImported,{lead['contact']['phone']},imp@example.com\n"
                    f"New,{new_phone()},\n")
    result = run_cli("import", str(path), "--workspace", ws.public_id, "--on-duplicate", mode, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["created"], report["duplicates"]) == (1, 1)
    assert report["duplicate_rows"][0].get("updated_fields") == updated
    stored = Lead.get(Lead.public_id == lead["id"])
    assert (stored.first_name, stored.email) == (first_name, email)
    if updated:
        assert audit_of(lead["id"])[-1].request_id.startswith("import-")


def test_the_csv_import_refuses_an_unknown_on_duplicate(run_cli, ws, tmp_path):
    path = tmp_path / "leads.csv"
    path.write_text(f"phone\n{new_phone()}\n")
    result = run_cli("import", str(path), "--workspace", ws.public_id, "--on-duplicate", "merge")
    assert result.exit_code == 2 and "merge" in result.output
