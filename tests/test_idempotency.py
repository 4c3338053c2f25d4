"""Idempotency-Key: same key and body replay, another body is 422, keys belong to their caller."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

import pytest

from conftest import email_lead_body
from leadsvc import idempotency
from leadsvc.auth import hash_token
from leadsvc.models import Activity, IdempotencyKey, Lead, Token, Transition, utcnow
from served import InProcessServer, held_in_another_thread, race


def post(client, ws, body, key, path="/api/v1/leads", **headers):
    return client.post(path, json=body, headers={**ws.headers(), "Idempotency-Key": key, **headers})


def test_same_key_and_body_replays_the_first_response(client, ws):
    body, key = email_lead_body(), uuid.uuid4().hex
    first = post(client, ws, body, key)
    again = post(client, ws, body, key)
    assert first.status_code == again.status_code == 201
    assert again.json == first.json
    assert again.headers["Location"] == first.headers["Location"]
    assert again.headers["ETag"] == first.headers["ETag"]
    assert again.headers["Idempotent-Replayed"] == "true" and "Idempotent-Replayed" not in first.headers
    assert Lead.select().where(Lead.email == body["email"]).count() == 1
    lead = Lead.get(Lead.email == body["email"])
    assert Activity.select().where((Activity.lead == lead.id) & (Activity.kind == "duplicate_submission")).count() == 0


def test_a_replay_gets_its_own_request_id(client, ws):
    body, key = email_lead_body(), uuid.uuid4().hex
    first = post(client, ws, body, key, **{"X-Request-ID": "first-try"})
    again = post(client, ws, body, key, **{"X-Request-ID": "second-try"})
    assert again.headers["X-Request-ID"] == "second-try"
    assert first.json == again.json


def test_json_formatting_and_key_order_do_not_change_the_request(client, ws):
    body, key = email_lead_body(last_name="Rao"), uuid.uuid4().hex
    assert post(client, ws, body, key).status_code == 201
    reordered = "{\n  " + ", ".join(f'"{k}": "{v}"' for k, v in reversed(list(body.items()))) + "\n}"
    again = client.post("/api/v1/leads", data=reordered, content_type="application/json",
                        headers={**ws.headers(), "Idempotency-Key": key})
    assert again.status_code == 201 and again.headers["Idempotent-Replayed"] == "true"


def test_same_key_with_another_body_is_422(client, ws):
    key = uuid.uuid4().hex
    assert post(client, ws, email_lead_body(), key).status_code == 201
    other = post(client, ws, email_lead_body(), key)
    assert other.status_code == 422
    assert other.json["code"] == "validation_failed"
    assert "Idempotency-Key" in other.json["errors"]


def test_same_key_on_another_path_is_422(client, ws):
    key = uuid.uuid4().hex
    created = post(client, ws, email_lead_body(), key)
    statuses = {s["name"]: s["id"] for s in client.get("/api/v1/statuses", headers=ws.headers()).json["data"]}
    move = post(client, ws, {"status": statuses["Contacted"]}, key, path=created.headers["Location"] + "/status")
    assert move.status_code == 422 and "Idempotency-Key" in move.json["errors"]


@pytest.mark.parametrize("key", ["", " ", "a b", "x" * 256, "ключ", "tab\there"],
                         ids=["empty", "space", "inner-space", "too-long", "cyrillic", "tab"])
def test_a_malformed_key_is_422(client, ws, key):
    response = post(client, ws, email_lead_body(), key)
    assert response.status_code == 422
    assert "Idempotency-Key" in response.json["errors"]


def test_a_key_of_255_printable_characters_is_accepted(client, ws):
    assert post(client, ws, email_lead_body(), "k" * 254 + "~").status_code == 201


def test_keys_belong_to_the_token_that_sent_them(client, ws):
    body, key = email_lead_body(), uuid.uuid4().hex
    first = client.post("/api/v1/leads", json=body, headers={**ws.headers(), "Idempotency-Key": key})
    other_token = {**ws.headers("nmgr@t.test"), "Idempotency-Key": key}
    second = client.post("/api/v1/leads", json=body, headers=other_token)
    assert first.status_code == 201
    assert "Idempotent-Replayed" not in second.headers
    assert second.status_code == 200 and second.json["duplicate"] is True   # ran again: a duplicate


def test_a_validation_failure_is_recorded_and_replayed(client, ws):
    body, key = {"first_name": "No contact"}, uuid.uuid4().hex
    first = post(client, ws, body, key)
    again = post(client, ws, body, key)
    assert first.status_code == again.status_code == 422
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.content_type == "application/problem+json"


@pytest.mark.parametrize("abilities, status", [(("leads:read",), 403)])
def test_forbidden_is_not_recorded(client, ws, abilities, status):
    body, key = email_lead_body(), uuid.uuid4().hex
    denied = client.post("/api/v1/leads", json=body,
                         headers={**ws.headers(abilities=abilities), "Idempotency-Key": key})
    assert denied.status_code == status
    assert IdempotencyKey.select().where(IdempotencyKey.key == key).count() == 0


def test_an_invalid_token_keeps_no_key(client, ws):
    key = uuid.uuid4().hex
    response = client.post("/api/v1/leads", json=email_lead_body(),
                           headers={"Authorization": "Bearer lsk_" + "A" * 40, "Idempotency-Key": key})
    assert response.status_code == 401
    assert IdempotencyKey.select().where(IdempotencyKey.key == key).count() == 0


@pytest.mark.parametrize("path", ["/api/v1/nothing-here", "/api/v1/statuses"])
def test_a_post_to_no_route_keeps_no_key(client, path):
    key = uuid.uuid4().hex
    response = client.post(path, json={}, headers={"Idempotency-Key": key})
    assert response.status_code in (404, 405)
    assert IdempotencyKey.select().where(IdempotencyKey.key == key).count() == 0


def test_a_server_error_rolls_everything_back_and_is_not_recorded(make_app, ws, monkeypatch):
    app = make_app()
    app.config["PROPAGATE_EXCEPTIONS"] = False
    client = app.test_client()
    body, key = email_lead_body(), uuid.uuid4().hex
    from leadsvc import leads

    def fail_after_writing(*args, **kwargs):
        raise RuntimeError("boom after the lead was written")

    monkeypatch.setattr(leads, "lead_url", fail_after_writing)   # runs after create_lead wrote the lead
    failed = post(client, ws, body, key)
    assert failed.status_code == 500
    assert Lead.select().where(Lead.email == body["email"]).count() == 0, "the lead rolled back with the key"
    assert IdempotencyKey.select().where(IdempotencyKey.key == key).count() == 0
    monkeypatch.undo()
    retried = post(client, ws, body, key)
    assert retried.status_code == 201 and "Idempotent-Replayed" not in retried.headers


def test_keys_expire_after_24_hours(client, ws):
    body, key = email_lead_body(), uuid.uuid4().hex
    first = post(client, ws, body, key)
    IdempotencyKey.update(expires_at=utcnow() - timedelta(seconds=1)).where(IdempotencyKey.key == key).execute()
    again = post(client, ws, body, key)
    assert "Idempotent-Replayed" not in again.headers
    assert again.status_code == 200 and again.json["duplicate"] is True and again.json["data"]["id"] == first.json["data"]["id"]
    row = IdempotencyKey.get(IdempotencyKey.key == key)
    assert row.expires_at - row.created_at == timedelta(hours=24)


def test_expired_keys_are_purged(client, ws):
    key = uuid.uuid4().hex
    post(client, ws, email_lead_body(), key)
    IdempotencyKey.update(expires_at=datetime(2000, 1, 1)).where(IdempotencyKey.key == key).execute()
    post(client, ws, email_lead_body(), uuid.uuid4().hex)
    assert IdempotencyKey.select().where(IdempotencyKey.key == key).count() == 0


def test_expired_keys_are_purged_faster_than_new_keys_are_written_at_any_rate(client, ws):
    """Each round writes one key and then lets it expire (as if a day had passed): however fast
    the rounds come, the expired keys do not pile up."""
    mine = []
    for _ in range(30):
        mine.append(uuid.uuid4().hex)
        assert post(client, ws, email_lead_body(), mine[-1]).status_code == 201
        # Older than any other expired key in the table, so these are the first to go.
        IdempotencyKey.update(expires_at=datetime(2000, 1, 1)).where(IdempotencyKey.key.in_(mine)).execute()
    assert IdempotencyKey.select().where(IdempotencyKey.key.in_(mine)).count() <= 1, \
        "only the last key, expired after the last write, is left"


def test_the_key_is_documented_on_every_post(app):
    spec = app.extensions["leadsvc.api"].spec.to_dict()
    # A sender's POST to a connector is taken once per the sender's own id instead (test_intake.py).
    posts = [(path, ops["post"]) for path, ops in spec["paths"].items() if "post" in ops
             and not path.startswith("/api/v1/intake/")]
    assert posts
    for path, operation in posts:
        refs = [p.get("$ref") for p in operation["parameters"]]
        assert "#/components/parameters/IdempotencyKey" in refs, path
        assert {"409", "422"} <= set(operation["responses"]), path
    assert spec["components"]["parameters"]["IdempotencyKey"]["name"] == "Idempotency-Key"


def test_two_concurrent_requests_with_one_key_make_one_lead(app, ws):
    """Acceptance 6: through a real waitress server, N racers with one key create one lead."""
    body, key = email_lead_body(), uuid.uuid4().hex
    headers = {**ws.headers(), "Idempotency-Key": key}
    racers = 6
    with InProcessServer(app, threads=racers) as server:
        responses = race(server.url, racers, "POST", "/api/v1/leads", json_body=body, headers=headers)
    assert [r.status for r in responses] == [201] * racers
    assert len({r.json()["data"]["id"] for r in responses}) == 1
    assert sum("idempotent-replayed" not in r.headers for r in responses) == 1
    lead = Lead.get(Lead.email == body["email"])
    assert Transition.select().where(Transition.lead == lead.id).count() == 1
    kinds = [a.kind for a in Activity.select().where(Activity.lead == lead.id)]
    assert sorted(kinds) == ["assigned", "created"]


def test_concurrent_stage_moves_with_one_key_move_once(app, ws):
    created = app.test_client().post("/api/v1/leads", json=email_lead_body(), headers=ws.headers())
    lead_path = created.headers["Location"]
    statuses = {s["name"]: s["id"] for s in app.test_client().get("/api/v1/statuses", headers=ws.headers()).json["data"]}
    headers = {**ws.headers(), "Idempotency-Key": uuid.uuid4().hex}
    racers = 4
    with InProcessServer(app, threads=racers) as server:
        responses = race(server.url, racers, "POST", lead_path + "/status", json_body={"status": statuses["Contacted"]},
                         headers=headers)
    assert [r.status for r in responses] == [200] * racers
    assert len({r.json()["transition"]["id"] for r in responses}) == 1
    lead = Lead.get(Lead.public_id == created.json["data"]["id"])
    assert Transition.select().where(Transition.lead == lead.id).count() == 2   # the first, and one move


@pytest.mark.only_on("postgresql")
def test_a_key_still_in_progress_is_409_on_postgresql(app, ws, backend, monkeypatch):
    """A retry that waits longer than LOCK_WAIT_MS for the first request gets 409 with Retry-After."""
    from leadsvc.db import database

    monkeypatch.setattr(idempotency, "LOCK_WAIT_MS", 200)
    body, key = email_lead_body(), uuid.uuid4().hex
    headers = {**ws.headers(), "Idempotency-Key": key}
    scope = "tok:" + Token.get(Token.secret_hash == hash_token(ws.token())).public_id
    transaction = database.atomic()

    def insert_the_key_uncommitted():
        transaction.__enter__()
        IdempotencyKey.create(scope=scope, key=key, request_hash="x" * 64, status=0, headers={}, body=b"",
                              expires_at=utcnow() + timedelta(hours=1))

    def roll_back():
        transaction.__exit__(RuntimeError, RuntimeError(), None)
        database.close()

    with held_in_another_thread(insert_the_key_uncommitted, roll_back):   # a first request, still running
        response = app.test_client().post("/api/v1/leads", json=body, headers=headers)
    assert response.status_code == 409 and response.json["code"] == "conflict"
    assert response.headers["Retry-After"] == "1"
    assert "in progress" in response.json["detail"]


def test_a_post_without_a_valid_token_is_401_whatever_its_key(client, ws):
    for key in ("a key with spaces", "fine-key"):
        response = client.post("/api/v1/leads", json={"email": "x@example.com"}, headers={"Idempotency-Key": key})
        assert response.status_code == 401 and response.json["code"] == "unauthenticated"
