"""What webhooks send and keep around privacy: an erasure and a consent withdrawal."""

from __future__ import annotations

from conftest import deliveries_of, lead_body, register_webhook
from leadsvc.models import Event, Workspace
from receiver import Receiver


def test_an_erasure_sends_lead_erased_and_cuts_earlier_events_down_to_the_lead_id(client, ws, receiver, deliverer):
    register_webhook(client, ws, receiver.url)
    body = lead_body(ws, email="erase.me@example.com")
    lead = client.post("/api/v1/leads", json=body, headers=ws.headers()).json["data"]
    client.post(f"/api/v1/leads/{lead['id']}/notes", json={"body": "Asha prefers calls after 6pm"}, headers=ws.headers())
    erased = client.post(f"/api/v1/leads/{lead['id']}/erase", json={"reason": "Asked to be forgotten"},
                         headers=ws.headers())
    assert erased.status_code == 200, erased.json

    stored = [event.body for event in Event.select().join(Workspace).where(Workspace.public_id == ws.public_id)]
    assert len(stored) == 3 and not any(value in text for text in stored
                                        for value in (body["phone"], "erase.me@example.com", "Asha", "6pm"))
    assert deliverer.deliver_due() == 3, "the deliveries still due send the cut bodies"
    assert sorted(request.event["type"] for request in receiver.received) == [
        "lead.created", "lead.erased", "lead.note_added"]
    assert all(request.event["data"] == {"lead": {"id": lead["id"]}} for request in receiver.received)


def echoing(request):
    """A receiver that answers with what it was sent, as some do."""
    return 200, {"Content-Type": "application/json"}, request.body


def test_an_erasure_clears_the_answers_kept_in_the_deliveries_log(client, ws, deliverer):
    with Receiver(echoing) as echo:
        hook = register_webhook(client, ws, echo.url)
        body = lead_body(ws, email="echoed@example.com")
        lead = client.post("/api/v1/leads", json=body, headers=ws.headers()).json["data"]
        client.post(f"/api/v1/leads/{lead['id']}/notes", json={"body": "Asha prefers calls after 6pm"},
                    headers=ws.headers())
        assert deliverer.deliver_due() == 2
        log = f"/api/v1/webhooks/{hook['id']}/deliveries"
        answers = [row["last_response"] for row in client.get(log, headers=ws.headers()).json["data"]]
        assert all(body["phone"] in answer for answer in answers), "the receiver echoed the lead"

        erased = client.post(f"/api/v1/leads/{lead['id']}/erase", json={"reason": "Asked to be forgotten"},
                             headers=ws.headers())
        assert erased.status_code == 200, erased.json
        listed = client.get(log, headers=ws.headers()).json["data"]
        assert len(listed) == 3 and [row["last_response"] for row in listed] == [None, None, None]
        assert [row.last_response for row in deliveries_of(hook["id"])] == [None, None, None]


def test_an_answer_to_a_body_erased_while_it_was_sent_is_not_kept(client, ws, deliverer):
    erasing = {}

    def erase_then_echo(request):
        # The erasure commits after the attempt sent the uncut body and before its answer is recorded.
        lead_id = request.event["data"]["lead"]["id"]
        erasing["answer"] = client.application.test_client().post(
            f"/api/v1/leads/{lead_id}/erase", json={"reason": "Asked to be forgotten"}, headers=ws.headers())
        return echoing(request)

    with Receiver(erase_then_echo) as echo:
        hook = register_webhook(client, ws, echo.url, ["lead.created"])
        body = lead_body(ws)
        client.post("/api/v1/leads", json=body, headers=ws.headers())
        assert deliverer.deliver_due() == 1
        assert erasing["answer"].status_code == 200, erasing["answer"].json
        assert body["phone"] in echo.received[0].body.decode()
        [row] = deliveries_of(hook["id"])
        assert row.state == "succeeded" and row.last_status == 200 and row.last_response is None


def test_a_consent_withdrawal_sends_lead_updated(client, ws, receiver, deliverer):
    register_webhook(client, ws, receiver.url, ["lead.updated"])
    lead = client.post("/api/v1/leads", json=lead_body(ws), headers=ws.headers()).json["data"]
    withdrawn = client.post(f"/api/v1/leads/{lead['id']}/consent/withdraw", headers=ws.headers())
    assert withdrawn.status_code == 200, withdrawn.json
    assert deliverer.deliver_due() == 1
    event = receiver.of_type("lead.updated")[0]
    assert event["data"]["changes"]["do_not_contact"] == {"old": False, "new": True}
    assert event["data"]["lead"]["do_not_contact"] is True
