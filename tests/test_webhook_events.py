"""Events from every change path: what is recorded when, signed as a receiver checks it, and
nothing for a change that rolls back or a webhook that did not exist yet."""

from __future__ import annotations

import pytest
from standardwebhooks import WebhookVerificationError

from conftest import lead_body, new_phone, register_webhook
from leadsvc.delivery import Deliverer
from leadsvc.models import Delivery, Event, Workspace
from served import wait_until

# --- events from every change path ---------------------------------------------------------------

def test_every_change_path_sends_its_event_signed(client, ws, receiver, deliverer):
    hook = register_webhook(client, ws, receiver.url)
    headers = ws.headers()
    lead = client.post("/api/v1/leads", json=lead_body(ws, email="asha@example.com"), headers=headers).json["data"]
    client.post("/api/v1/leads", json={"email": "asha@example.com"}, headers=headers)
    client.patch(f"/api/v1/leads/{lead['id']}", json={"first_name": "Usha", "owner": ws.ids.members["n2@t.test"]},
                 headers=headers)
    client.post(f"/api/v1/leads/{lead['id']}/status", json={"status": ws.ids.statuses["Contacted"]}, headers=headers)
    client.post(f"/api/v1/leads/{lead['id']}/notes", json={"body": "Wants a villa"}, headers=headers)
    client.post(f"/api/v1/leads/{lead['id']}/activities", json={"kind": "call", "summary": "Called"}, headers=headers)
    assert deliverer.deliver_due() == 7

    # Sent by several threads: delivery is not ordered (receivers order by timestamp).
    received = {request.event["type"]: request for request in receiver.received}
    assert sorted(received) == sorted(["lead.created", "lead.duplicate_submitted", "lead.updated", "lead.assigned",
                                       "lead.status_changed", "lead.note_added", "lead.activity_logged"])
    for event_type, request in received.items():
        body = request.verified(hook["secret"])   # raises unless signed with the webhook's secret
        assert body["type"] == event_type and body["data"]["lead"]["id"] == lead["id"]
        assert request.headers["webhook-id"].startswith("evt_")
        assert request.headers["content-type"] == "application/json"
        assert request.headers["user-agent"] == "leadsvc/test"
    data = {event_type: request.event["data"] for event_type, request in received.items()}
    assert data["lead.created"]["lead"] == lead, "the lead as the admin read it"
    assert data["lead.created"]["routing"]["owner"]["id"] == lead["owner"]["id"]
    assert data["lead.duplicate_submitted"]["matched_on"] == ["email"]
    assert data["lead.updated"]["changes"] == {"first_name": {"old": "Asha", "new": "Usha"},
                                               "owner": {"old": lead["owner"]["id"], "new": ws.ids.members["n2@t.test"]}}
    assert data["lead.assigned"]["from"]["id"] == lead["owner"]["id"]
    assert data["lead.assigned"]["to"]["id"] == ws.ids.members["n2@t.test"]
    assert data["lead.assigned"]["reason"]["strategy"] == "manual"
    moved = data["lead.status_changed"]
    assert moved["from"]["name"] == "New" and moved["to"]["name"] == "Contacted"
    assert moved["transition"]["to"]["id"] == ws.ids.statuses["Contacted"]
    assert data["lead.note_added"]["note"]["body"] == "Wants a villa"
    assert data["lead.activity_logged"]["activity"]["kind"] == "call"
    with pytest.raises(WebhookVerificationError):
        receiver.received[0].verified("whsec_" + "A" * 43 + "=")


def test_web_forms_and_csv_import_send_lead_created(client, make_workspace, receiver, deliverer, run_cli, tmp_path):
    def with_form(data):
        data["forms"] = [{"name": "Enquiry", "source": "Website", "allowed_origins": ["https://acme.test"]}]
    tenant = make_workspace(with_form)
    register_webhook(client, tenant, receiver.url, ["lead.created"])
    form = tenant.ids.forms["Enquiry"]
    submitted = client.post(f"/api/v1/forms/{form}/submissions", json={"first_name": "Form", "phone": new_phone()},
                            headers={"Origin": "https://acme.test"})
    assert submitted.status_code == 201, submitted.json
    csv_file = tmp_path / "leads.csv"
    csv_file.write_text(f"first_name,phone\nImported,{new_phone()}\n")
    assert run_cli("import", str(csv_file), "--workspace", tenant.public_id).exit_code == 0
    deliverer.deliver_due()
    names = sorted(event["data"]["lead"]["contact"]["first_name"] for event in receiver.of_type("lead.created"))
    assert names == ["Form", "Imported"]


def test_batch_items_and_upserts_send_their_events_signed(client, ws, receiver, deliverer):
    hook = register_webhook(client, ws, receiver.url)
    headers = ws.headers()
    known = client.post("/api/v1/leads", json=lead_body(ws, first_name="Known"), headers=headers).json["data"]
    deliverer.deliver_due()
    receiver.received.clear()
    batch = client.post("/api/v1/leads/batch", json={"leads": [
        lead_body(ws, first_name="One"), lead_body(ws, first_name="Two"), {"first_name": "No contact"}]}, headers=headers)
    assert [item["status"] for item in batch.json["data"]] == [201, 201, 422]
    upsert = client.post("/api/v1/leads", json={"phone": known["contact"]["phone"], "first_name": "Renamed",
                                                "on_duplicate": "update"}, headers=headers)
    assert upsert.status_code == 200, upsert.json
    assert deliverer.deliver_due() == 4, "two creates; the upsert's duplicate submission and its update"

    for request in receiver.received:
        request.verified(hook["secret"])   # raises unless signed with the webhook's secret
    created = sorted(event["data"]["lead"]["contact"]["first_name"] for event in receiver.of_type("lead.created"))
    assert created == ["One", "Two"], "the item that failed sent nothing"
    assert [event["data"]["lead"]["id"] for event in receiver.of_type("lead.duplicate_submitted")] == [known["id"]]
    [updated] = receiver.of_type("lead.updated")
    assert updated["data"]["changes"] == {"first_name": {"old": "Known", "new": "Renamed"}}


def test_editing_and_deleting_a_note_send_their_events(client, ws, receiver, deliverer):
    register_webhook(client, ws, receiver.url, ["lead.note_edited", "lead.note_deleted"])
    lead = client.post("/api/v1/leads", json=lead_body(ws), headers=ws.headers()).json["data"]
    note = client.post(f"/api/v1/leads/{lead['id']}/notes", json={"body": "Wants a villa"},
                       headers=ws.headers()).json["data"]
    client.patch(f"/api/v1/notes/{note['id']}", json={"body": "Wants a plot"}, headers=ws.headers())
    client.delete(f"/api/v1/notes/{note['id']}", headers=ws.headers())
    assert deliverer.deliver_due() == 2
    [edited], [deleted] = receiver.of_type("lead.note_edited"), receiver.of_type("lead.note_deleted")
    assert edited["data"]["note"]["body"] == "Wants a plot" and edited["data"]["lead"]["id"] == lead["id"]
    assert deleted["data"]["note"] == {"id": note["id"]} and deleted["data"]["lead"]["id"] == lead["id"]


def test_with_no_webhook_subscribed_a_change_writes_no_event(client, ws, receiver):
    register_webhook(client, ws, receiver.url, ["lead.note_added"])
    lead = client.post("/api/v1/leads", json=lead_body(ws), headers=ws.headers()).json["data"]
    workspace = Workspace.get(Workspace.public_id == ws.public_id)
    assert Event.select().where(Event.workspace == workspace.id).count() == 0
    client.post(f"/api/v1/leads/{lead['id']}/notes", json={"body": "n"}, headers=ws.headers())
    assert [e.type for e in Event.select().where(Event.workspace == workspace.id)] == ["lead.note_added"]


def test_a_change_that_rolls_back_sends_nothing(client, ws, receiver, deliverer, monkeypatch, app):
    from leadsvc import events, pipeline

    register_webhook(client, ws, receiver.url)
    original = events.record

    def record_then_fail(*args, **kwargs):
        original(*args, **kwargs)
        raise RuntimeError("the change fails after its event was written")

    monkeypatch.setattr(pipeline.events, "record", record_then_fail)
    app.config["PROPAGATE_EXCEPTIONS"] = False
    try:
        response = client.post("/api/v1/leads", json=lead_body(ws), headers=ws.headers())
    finally:
        app.config["PROPAGATE_EXCEPTIONS"] = None
    assert response.status_code == 500
    monkeypatch.undo()
    workspace = Workspace.get(Workspace.public_id == ws.public_id)
    assert Event.select().where(Event.workspace == workspace.id).count() == 0
    assert deliverer.deliver_due() == 0 and receiver.received == []
    assert Delivery.select().count() == Delivery.select().where(Delivery.next_attempt_at.is_null()).count()


def test_a_webhook_receives_only_events_after_it_was_created(client, ws, receiver, deliverer):
    client.post("/api/v1/leads", json=lead_body(ws), headers=ws.headers())
    register_webhook(client, ws, receiver.url)
    client.post("/api/v1/leads", json=lead_body(ws, first_name="After"), headers=ws.headers())
    deliverer.deliver_due()
    assert [e["data"]["lead"]["contact"]["first_name"] for e in receiver.events()] == ["After"]


def test_the_delivery_thread_sends_right_after_the_commit(app, client, ws, receiver):
    hook = register_webhook(client, ws, receiver.url)
    running = Deliverer(app.config["LEADSVC"], version="test").start()
    try:
        lead = client.post("/api/v1/leads", json=lead_body(ws), headers=ws.headers()).json["data"]
        wait_until(lambda: receiver.received, 30, "the event delivered by the background thread")
        assert receiver.received[0].verified(hook["secret"])["data"]["lead"]["id"] == lead["id"]
    finally:
        running.stop()
