"""The webhook routes and commands: registration, where a webhook may point, who may manage one,
changes that race a request, secret rotation, the test event, and `leadsvc webhooks`."""

from __future__ import annotations

import json
import threading
from datetime import timedelta

import pytest
from standardwebhooks import WebhookVerificationError

from conftest import ADDRESS, WEBHOOK_SECRET_KEY, deliveries_of, lead_body, register_webhook
from leadsvc.auth import check_grant
from leadsvc.outbound import Refused, check_destination
from leadsvc.models import Delivery, Event, Webhook, Workspace, utcnow

# --- registration ------------------------------------------------------------------------------

def test_a_webhook_secret_is_shown_once_and_never_stored(client, ws, receiver):
    hook = register_webhook(client, ws, receiver.url, ["lead.created"], description="CRM sync")
    assert hook["secret"].startswith("whsec_") and hook["active"] is True and hook["disabled_reason"] is None
    assert hook["events"] == ["lead.created"] and hook["description"] == "CRM sync"
    read = client.get(f"/api/v1/webhooks/{hook['id']}", headers=ws.headers()).json["data"]
    listed = client.get("/api/v1/webhooks", headers=ws.headers()).json["data"]
    assert "secret" not in read and [h["id"] for h in listed] == [hook["id"]] and "secret" not in listed[0]
    row = Webhook.get(Webhook.public_id == hook["id"])
    stored = json.dumps([getattr(row, field.name) for field in Webhook._meta.sorted_fields], default=str)
    assert hook["secret"].removeprefix("whsec_") not in stored


def test_a_replayed_registration_does_not_show_the_secret_again(client, ws, receiver):
    headers = {**ws.headers(), "Idempotency-Key": "register-once"}
    body = {"url": receiver.url, "events": ["*"]}
    first = client.post("/api/v1/webhooks", json=body, headers=headers)
    again = client.post("/api/v1/webhooks", json=body, headers=headers)
    assert first.json["data"]["secret"].startswith("whsec_")
    assert again.headers["Idempotent-Replayed"] == "true" and again.json["data"]["secret"] is None
    assert again.json["data"]["id"] == first.json["data"]["id"]


@pytest.mark.parametrize("body, field", [
    ({"url": "https://example.com/h"}, "events"),
    ({"events": ["*"]}, "url"),
    ({"url": "https://example.com/h", "events": ["lead.created", "*"]}, "events"),
    ({"url": "https://example.com/h", "events": ["lead.exploded"]}, "events.0"),
    ({"url": "https://example.com/h", "events": []}, "events"),
    ({"url": "ftp://example.com/h", "events": ["*"]}, "url"),
    ({"url": "https://user:pw@example.com/h", "events": ["*"]}, "url"),
    ({"url": "https://93.184.215.14:0/h", "events": ["*"]}, "url"),       # no port 0 (nor 443 instead)
    ({"url": "https://93.184.215.14:65536/h", "events": ["*"]}, "url"),
    ({"url": "https://example.com/h", "events": ["*"], "secret": "mine"}, "secret"),
])
def test_registration_rejects_bad_input_with_422(client, ws, body, field):
    response = client.post("/api/v1/webhooks", json=body, headers=ws.headers())
    assert response.status_code == 422 and field in response.json["errors"], response.json
    assert Webhook.select().join(Workspace).where(Workspace.public_id == ws.public_id).count() == 0


@pytest.mark.parametrize("url", [
    "http://example.com/hook",              # not https
    "https://127.0.0.1/hook", "https://localhost/hook", "https://[::1]/hook",
    "https://10.1.2.3/hook", "https://192.168.0.10/hook", "https://172.16.5.4/hook",
    "https://169.254.169.254/latest/meta-data", "https://[fe80::1]/hook", "https://224.0.0.1/hook",
    "https://[::ffff:127.0.0.1]/hook", "https://0.0.0.0/hook",
    # IPv6 addresses that carry a private IPv4 address, which a NAT64 translator or a tunnel
    # delivers to: NAT64 (loopback, the cloud metadata address), 6to4, IPv4-compatible.
    "https://[64:ff9b::7f00:1]/hook", "https://[64:ff9b::a9fe:a9fe]/hook", "https://[64:ff9b::10.0.0.1]/hook",
    "https://[2002:7f00:1::]/hook", "https://[2002:c0a8:1::1]/hook", "https://[::127.0.0.1]/hook",
    # Ranges ipaddress calls global that lead into a local network: local-use NAT64, SIIT's
    # IPv4-translated addresses and site-local, each at its start and at an address inside it.
    "https://[64:ff9b:1::]/hook", "https://[64:ff9b:1:ffff::7f00:1]/hook",
    "https://[::ffff:0:0:0]/hook", "https://[::ffff:0:5db8:d70e]/hook",
    "https://[fec0::]/hook", "https://[fec0:1234::1]/hook",
])
def test_only_https_to_public_addresses_unless_configured(make_app, ws, url):
    strict = make_app(webhooks={"secret_key": WEBHOOK_SECRET_KEY, "allow_http": False, "allow_private_networks": False})
    response = strict.test_client().post("/api/v1/webhooks", json={"url": url, "events": ["*"]}, headers=ws.headers())
    assert response.status_code == 422 and "url" in response.json["errors"], response.json


@pytest.mark.parametrize("url", ["https://localhost/hook", "https://no-such-host.invalid/hook"])
def test_a_refused_webhook_url_names_no_address(make_app, ws, url):
    strict = make_app(webhooks={"secret_key": WEBHOOK_SECRET_KEY, "allow_http": False, "allow_private_networks": False})
    response = strict.test_client().post("/api/v1/webhooks", json={"url": url, "events": ["*"]}, headers=ws.headers())
    assert response.status_code == 422
    [message] = response.json["errors"]["url"]
    assert ("not allowed" in message or "does not resolve" in message) and not ADDRESS.search(message), message
    assert not ADDRESS.search(response.json["detail"])


def test_the_destination_check_allows_what_is_configured():
    check_destination("https://93.184.215.14/hook", {"allow_http": False, "allow_private_networks": False})
    # A public IPv4 address through NAT64 or 6to4 is as public as the address itself.
    check_destination("https://[64:ff9b::5db8:d70e]/hook", {"allow_http": False, "allow_private_networks": False})
    check_destination("https://[2002:5db8:d70e::1]/hook", {"allow_http": False, "allow_private_networks": False})
    check_destination("http://127.0.0.1:9/hook", {"allow_http": True, "allow_private_networks": True})
    with pytest.raises(Refused, match="does not resolve"):
        check_destination("https://no-such-host.invalid/hook", {"allow_http": False, "allow_private_networks": False})


def test_without_a_secret_key_webhooks_are_refused(make_app, ws, receiver):
    keyless = make_app(webhooks={"secret_key": ""})
    response = keyless.test_client().post("/api/v1/webhooks", json={"url": receiver.url, "events": ["*"]},
                                          headers=ws.headers())
    assert response.status_code == 409 and "webhooks.secret_key" in response.json["detail"]


def test_only_admins_hold_webhooks_manage(client, ws):
    for email in ("nmgr@t.test", "n1@t.test"):
        response = client.get("/api/v1/webhooks", headers=ws.headers(email))
        assert response.status_code == 403, email
    with pytest.raises(ValueError, match="Managers cannot hold webhooks:manage"):
        check_grant("manager", ["webhooks:manage"])
    assert client.get("/api/v1/webhooks", headers=ws.headers("admin@t.test", ("webhooks:manage",))).status_code == 200


def test_a_webhook_of_another_workspace_is_404(client, ws, other_ws, receiver):
    hook = register_webhook(client, ws, receiver.url)
    for method, path in (("GET", ""), ("PATCH", ""), ("DELETE", ""), ("POST", "/test"), ("POST", "/rotate-secret"),
                         ("GET", "/deliveries")):
        response = client.open(f"/api/v1/webhooks/{hook['id']}{path}", method=method,
                               json={} if method == "PATCH" else None, headers=other_ws.headers())
        assert response.status_code == 404, (method, path)


def test_a_query_parameter_the_webhook_routes_do_not_take_is_422(client, ws, receiver):
    hook = register_webhook(client, ws, receiver.url)
    for path in ("/api/v1/webhooks", f"/api/v1/webhooks/{hook['id']}"):
        response = client.get(f"{path}?active=false", headers=ws.headers())
        assert response.status_code == 422 and "active" in response.json["errors"], path


@pytest.mark.parametrize("value", ["yes", "false", 1, 0, "on"])
def test_active_takes_json_true_or_false_only(client, ws, receiver, value):
    # marshmallow's Boolean alone takes "yes", "false", 1, 0, "on" and the like.
    hook = register_webhook(client, ws, receiver.url)
    response = client.patch(f"/api/v1/webhooks/{hook['id']}", json={"active": value}, headers=ws.headers())
    assert response.status_code == 422 and "active" in response.json["errors"]
    assert Webhook.get(Webhook.public_id == hook["id"]).active is True


def test_a_workspace_holds_at_most_50_webhooks_even_when_registered_at_once(app, client, ws, monkeypatch):
    # Two registrations at once must not both count 49 and both go in (PostgreSQL; SQLite's
    # single writer keeps them apart).
    from leadsvc import webhooks

    for _ in range(webhooks.MAX_WEBHOOKS - 1):
        register_webhook(client, ws, "http://127.0.0.1:9/hook")
    counted, go_on = threading.Event(), threading.Event()
    create = webhooks.Webhook.create

    def paused(**fields):   # the first registration has counted 49 and waits to insert
        if not counted.is_set():
            counted.set()
            go_on.wait(10)
        return create(**fields)

    monkeypatch.setattr(webhooks.Webhook, "create", paused)
    answers = []

    def registering():
        answers.append(app.test_client().post("/api/v1/webhooks", json={"url": "http://127.0.0.1:9/hook",
                                                                        "events": ["*"]}, headers=ws.headers()))
    first, second = threading.Thread(target=registering), threading.Thread(target=registering)
    first.start()
    assert counted.wait(10)
    second.start()
    second.join(1)   # it finishes now unless the first registration holds it back
    go_on.set()
    first.join(10)
    second.join(10)
    assert sorted(answer.status_code for answer in answers) == [201, 409]
    workspace = Workspace.get(Workspace.public_id == ws.public_id)
    assert Webhook.select().where(Webhook.workspace == workspace.id).count() == webhooks.MAX_WEBHOOKS


def meanwhile(monkeypatch, name, change):
    """Run change(row) right after the view looked the webhook (or delivery) up with `name`, as a
    request that commits between that lookup and this one's write would."""
    from leadsvc import webhooks

    original = getattr(webhooks, name)

    def then_changed(*args):
        found = original(*args)
        change(found[0] if isinstance(found, tuple) else found)
        return found
    monkeypatch.setattr(webhooks, name, then_changed)


@pytest.mark.parametrize("method, path", [("post", "/test"), ("post", "/rotate-secret"), ("patch", ""),
                                          ("post", "/deliveries/{delivery}/replay")])
def test_a_webhook_deleted_while_a_request_runs_is_404_and_nothing_is_written(client, ws, monkeypatch, method, path):
    # Not a 500 (POST /test's delivery refers to the webhook) nor a 200 about a webhook that is gone.
    from leadsvc.webhooks import delete_webhook

    hook = register_webhook(client, ws, "http://127.0.0.1:9/hook")
    delivery = client.post(f"/api/v1/webhooks/{hook['id']}/test", headers=ws.headers()).json["data"]["id"]
    events_before = Event.select().count()
    lookup = "delivery_or_404" if "replay" in path else "webhook_or_404"
    meanwhile(monkeypatch, lookup, lambda row: delete_webhook(Webhook.get_by_id(row.webhook_id if "replay" in path
                                                                                   else row.id)))
    url = f"/api/v1/webhooks/{hook['id']}{path.format(delivery=delivery)}"
    response = getattr(client, method)(url, json={"description": "x"} if method == "patch" else None,
                                       headers=ws.headers())
    assert response.status_code == 404 and response.json["code"] == "not_found", response.json
    assert not Webhook.select().where(Webhook.public_id == hook["id"]).exists()
    assert Event.select().count() == events_before


def test_a_webhook_deleted_after_a_create_read_its_reference_data_gets_no_delivery(client, ws, monkeypatch):
    # The create's reference data still lists the webhook: its delivery would break the foreign
    # key, which the create took for a duplicate race and answered 500.
    from leadsvc import pipeline
    from leadsvc.webhooks import delete_webhook

    gone = register_webhook(client, ws, "http://127.0.0.1:9/gone", ["lead.created"])
    kept = register_webhook(client, ws, "http://127.0.0.1:9/kept", ["lead.created"])
    assert client.post("/api/v1/leads", json=lead_body(ws), headers=ws.headers()).status_code == 201
    rescore = pipeline.rescore

    def deleted_meanwhile(lead, refs):
        delete_webhook(Webhook.get(Webhook.public_id == gone["id"]))
        return rescore(lead, refs)
    monkeypatch.setattr(pipeline, "rescore", deleted_meanwhile)
    response = client.post("/api/v1/leads", json=lead_body(ws), headers=ws.headers())
    assert response.status_code == 201, response.json
    event = Event.select().order_by(Event.id.desc()).first()
    assert [row.webhook_id for row in Delivery.select().where(Delivery.event == event.id)] == [
        Webhook.get(Webhook.public_id == kept["id"]).id]
    monkeypatch.setattr(pipeline, "rescore", rescore)
    assert client.post("/api/v1/leads", json=lead_body(ws), headers=ws.headers()).status_code == 201
    assert len(deliveries_of(kept["id"])) == 3


def test_a_change_committed_while_a_webhook_request_runs_is_kept(client, ws, monkeypatch):
    # A PATCH that saved the row as the view read it would undo a rotation in between (its secret
    # would never sign) and make a webhook the deliverer just disabled active again; a rotation
    # must keep the secret it replaces, the concurrent one's, signing for the 24 hours of overlap.
    from leadsvc import delivery
    from leadsvc.db import transaction
    from leadsvc.webhooks import rotate_secret

    hook = register_webhook(client, ws, "http://127.0.0.1:9/hook")

    def rotated_and_disabled(row):
        rotate_secret(Webhook.get_by_id(row.id), {"webhooks": {"secret_key": WEBHOOK_SECRET_KEY}})
        with transaction():
            delivery.disable(Webhook.get_by_id(row.id), "The endpoint answered 410 Gone.")
    meanwhile(monkeypatch, "webhook_or_404", rotated_and_disabled)
    patched = client.patch(f"/api/v1/webhooks/{hook['id']}", json={"description": "CRM"}, headers=ws.headers())
    assert patched.status_code == 200 and patched.json["data"]["description"] == "CRM"
    assert patched.json["data"]["active"] is False and "410" in patched.json["data"]["disabled_reason"]
    row = Webhook.get(Webhook.public_id == hook["id"])
    assert row.active is False and row.previous_salt is not None, "the rotation is kept"

    monkeypatch.undo()
    concurrent = {}

    def rotated(row):
        rotate_secret(Webhook.get_by_id(row.id), {"webhooks": {"secret_key": WEBHOOK_SECRET_KEY}})
        concurrent["salt"] = Webhook.get_by_id(row.id).secret_salt
    meanwhile(monkeypatch, "webhook_or_404", rotated)
    assert client.post(f"/api/v1/webhooks/{hook['id']}/rotate-secret", headers=ws.headers()).status_code == 200
    assert Webhook.get(Webhook.public_id == hook["id"]).previous_salt == concurrent["salt"], \
        "the concurrent rotation's secret signs for the next 24 hours"


def test_patch_and_delete(client, ws, receiver, deliverer):
    hook = register_webhook(client, ws, receiver.url, ["lead.created"])
    changed = client.patch(f"/api/v1/webhooks/{hook['id']}", json={"events": ["lead.updated"], "description": "x"},
                           headers=ws.headers())
    assert changed.status_code == 200 and changed.json["data"]["events"] == ["lead.updated"]
    client.post("/api/v1/leads", json=lead_body(ws), headers=ws.headers())
    assert deliveries_of(hook["id"]) == [], "no longer subscribed to lead.created"
    assert client.delete(f"/api/v1/webhooks/{hook['id']}", headers=ws.headers()).status_code == 204
    assert client.get(f"/api/v1/webhooks/{hook['id']}", headers=ws.headers()).status_code == 404


# --- signatures and rotation ----------------------------------------------------------------------

def test_after_a_rotation_both_secrets_sign_for_24_hours(client, ws, receiver, deliverer):
    hook = register_webhook(client, ws, receiver.url, ["webhook.test"])
    rotated = client.post(f"/api/v1/webhooks/{hook['id']}/rotate-secret", headers=ws.headers())
    assert rotated.status_code == 200
    new = rotated.json["data"]["secret"]
    assert new.startswith("whsec_") and new != hook["secret"]
    row = Webhook.get(Webhook.public_id == hook["id"])
    assert abs(row.previous_expires_at - (utcnow() + timedelta(hours=24))) < timedelta(minutes=1)
    client.post(f"/api/v1/webhooks/{hook['id']}/test", headers=ws.headers())
    deliverer.deliver_due()
    both = receiver.received[-1]
    assert len(both.headers["webhook-signature"].split(" ")) == 2
    both.verified(hook["secret"])
    both.verified(new)

    # 24 hours later the previous secret no longer signs.
    Webhook.update(previous_expires_at=utcnow() - timedelta(seconds=1)).where(Webhook.id == row.id).execute()
    client.post(f"/api/v1/webhooks/{hook['id']}/test", headers=ws.headers())
    deliverer.deliver_due()
    later = receiver.received[-1]
    assert len(later.headers["webhook-signature"].split(" ")) == 1
    later.verified(new)
    with pytest.raises(WebhookVerificationError):
        later.verified(hook["secret"])


def test_the_test_endpoint_sends_webhook_test_whatever_the_subscription(client, ws, receiver, deliverer):
    hook = register_webhook(client, ws, receiver.url, ["lead.created"])
    response = client.post(f"/api/v1/webhooks/{hook['id']}/test", headers=ws.headers())
    assert response.status_code == 202 and response.json["data"]["event"]["type"] == "webhook.test"
    assert response.json["data"]["state"] == "pending"
    deliverer.deliver_due()
    assert receiver.received[0].verified(hook["secret"])["data"]["webhook"]["id"] == hook["id"]


# --- the command line ---------------------------------------------------------------------------

def test_the_webhooks_commands(run_cli, client, ws, receiver, deliverer):
    created = run_cli("webhooks", "create", "--workspace", ws.public_id, "--url", receiver.url,
                      "--events", "webhook.test,lead.created", "--json")
    assert created.exit_code == 0, created.output
    hook = json.loads(created.output)
    assert hook["secret"].startswith("whsec_") and hook["events"] == ["webhook.test", "lead.created"]
    listed = json.loads(run_cli("webhooks", "list", "--workspace", ws.public_id, "--json").output)
    assert [h["id"] for h in listed["webhooks"]] == [hook["id"]] and "secret" not in listed["webhooks"][0]
    client.post("/api/v1/leads", json=lead_body(ws), headers=ws.headers())
    deliverer.deliver_due()
    log = json.loads(run_cli("webhooks", "deliveries", hook["id"], "--json").output)["deliveries"]
    assert [d["state"] for d in log] == ["succeeded"]
    replayed = run_cli("webhooks", "replay", hook["id"], log[0]["id"])
    assert replayed.exit_code == 0 and deliverer.deliver_due() == 1 and len(receiver.received) == 2
    receiver.received[1].verified(hook["secret"])
    bad = run_cli("webhooks", "create", "--workspace", ws.public_id, "--url", "ftp://x", "--events", "*")
    assert bad.exit_code == 1 and "url" in bad.output
    assert run_cli("webhooks", "delete", hook["id"]).exit_code == 0
    assert "No webhooks." in run_cli("webhooks", "list", "--workspace", ws.public_id).output
