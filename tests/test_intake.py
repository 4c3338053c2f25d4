"""Intake (DESIGN section 19): what senders post to a connector, checked as each sender documents,
stored once per sender id, and sent through the create path with the connector as the actor."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from urllib.parse import urlencode

import pytest
from standardwebhooks import Webhook as Signer

from conftest import META_APP_SECRET_ENV, intake_fixture, new_phone, plan, with_connectors
from leadsvc import intake
from leadsvc.clock import Clock
from leadsvc.intake import meta
from leadsvc.models import Activity, AuditEntry, Connector, Consent, Intake, Lead, Timer, utcnow
from leadsvc.provision import apply_setup, parse_setup
from served import call

APP_SECRET = "meta-app-secret-for-tests"


@pytest.fixture
def cws(make_workspace):
    """A workspace with one connector of each kind."""
    return make_workspace(with_connectors)


def conn(tenant, name):
    return tenant.ids.connectors[name]


def google_body(tenant, **changes):
    """Google's fixture with this workspace's key, a fresh lead id, and a fresh phone and e-mail."""
    body = intake_fixture("google_ads")
    body.update(google_key=conn(tenant, "Google Ads - Villas")["key"], lead_id=uuid.uuid4().hex, **changes)
    fresh = {"PHONE_NUMBER": new_phone(), "EMAIL": f"asha.{uuid.uuid4().hex[:10]}@example.com"}
    body["user_column_data"] = [{**c, "string_value": fresh.get(c["column_id"], c["string_value"])}
                                for c in body["user_column_data"]]
    return body


def column(body, column_id):
    return next(c["string_value"] for c in body["user_column_data"] if c["column_id"] == column_id)


def leads_with(tenant, phone):
    from leadsvc.models import Workspace
    return Lead.select().join(Workspace).where((Workspace.public_id == tenant.public_id) & (Lead.phone == phone)).count()


def with_phone(body, phone):
    body["user_column_data"] = [c if c["column_id"] != "PHONE_NUMBER" else {**c, "string_value": phone}
                                for c in body["user_column_data"]]
    body["user_column_data"] = [c for c in body["user_column_data"] if c["column_id"] != "EMAIL"]
    return body


def intakes(connector_id):
    return list(Intake.select().join(Connector).where(Connector.public_id == connector_id).order_by(Intake.id))


def lead_of(row):
    return Lead.get_by_id(row.lead_id)


# --- Google Ads ------------------------------------------------------------------------------

def test_a_google_lead_is_created_with_the_connector_as_actor_and_its_source(client, cws):
    google = conn(cws, "Google Ads - Villas")
    body = google_body(cws)
    response = client.post(google["url"], json=body)
    assert response.status_code == 200
    [row] = intakes(google["id"])
    assert response.json == {"data": {"intakes": [row.public_id]}}
    assert row.outcome == "created" and row.payload["lead_id"] == row.external_id
    lead = lead_of(row)
    assert (lead.first_name, lead.last_name) == ("Asha Devi", "Rao")   # split at the last space
    assert lead.phone == column(body, "PHONE_NUMBER") and lead.email == column(body, "EMAIL")
    assert lead.custom_fields == {"product_interest": "villa"}          # the mapped column; CITY is not mapped
    assert lead.source.public_id == cws.ids.sources["Website"]
    assert lead.channel == "google_ads" and lead.connector.public_id == google["id"]
    assert lead.attribution == {"campaign_id": "50000000000", "adgroup_id": "60000000000", "ad_id": "70000000000",
                                "form_id": "40000000000", "gclid": "EAIaIQobChMI-test-gclid",
                                "external_id": row.external_id}
    assert lead.campaign == "50000000000"
    document = client.get(f"/api/v1/leads/{lead.public_id}?include=activities", headers=cws.headers()).json["data"]
    actor = {"type": "connector", "id": google["id"], "name": "Google Ads - Villas"}
    assert {a["kind"]: a["actor"] for a in document["activities"]}["created"] == actor
    audit = client.get(f"/api/v1/leads/{lead.public_id}/audit", headers=cws.headers()).json["data"]
    assert audit[0]["actor"] == actor


def test_a_google_payload_is_kept_without_the_connectors_key(client, cws):
    google = conn(cws, "Google Ads - Villas")
    body = google_body(cws)
    assert client.post(google["url"], json=body).status_code == 200
    [row] = [r for r in intakes(google["id"]) if r.external_id == body["lead_id"]]
    assert "google_key" not in row.payload and row.payload["user_column_data"] == body["user_column_data"]
    listed = client.get(f"/api/v1/connectors/{google['id']}/intakes", headers=cws.headers()).get_data(as_text=True)
    assert google["key"] not in listed


def test_a_google_test_lead_is_recorded_and_answered_but_creates_no_lead(client, cws):
    google = conn(cws, "Google Ads - Villas")
    body = google_body(cws, is_test=True)
    assert client.post(google["url"], json=body).status_code == 200
    [row] = intakes(google["id"])
    assert row.outcome == "test" and row.lead_id is None and leads_with(cws, column(body, "PHONE_NUMBER")) == 0


def test_a_retried_payload_answers_its_intake_and_creates_nothing(client, cws):
    google = conn(cws, "Google Ads - Villas")
    body = google_body(cws)
    first, again = (client.post(google["url"], json=body) for _ in range(2))
    assert first.status_code == again.status_code == 200 and first.json == again.json
    assert len(intakes(google["id"])) == 1
    assert leads_with(cws, column(body, "PHONE_NUMBER")) == 1


@pytest.mark.parametrize("wrong", ["key", "no_key", "surrogate_key", "unknown_id", "malformed_id", "other_workspace",
                                   "not_json"])
def test_a_wrong_key_or_connector_is_the_same_403_and_stores_nothing(client, cws, make_workspace, wrong):
    google = conn(cws, "Google Ads - Villas")
    other = conn(make_workspace(with_connectors), "Google Ads - Villas")
    url, body = google["url"], google_body(cws)
    if wrong == "key":
        body["google_key"] = conn(cws, "IndiaMART")["key"]
    elif wrong == "no_key":
        del body["google_key"]
    elif wrong == "surrogate_key":   # JSON may spell a lone surrogate, which UTF-8 cannot encode
        body["google_key"] = "\ud800"
    elif wrong == "unknown_id":
        url = "/api/v1/intake/conn_" + "A" * 22
    elif wrong == "malformed_id":
        url = "/api/v1/intake/" + "x" * 300
    elif wrong == "other_workspace":   # this workspace's key, the other's connector
        url = other["url"]
    response = (client.post(url, data=b"{not json", content_type="application/json") if wrong == "not_json"
                else client.post(url, json=body))
    assert response.status_code == 403 and response.json["code"] == "forbidden"
    reference = client.post("/api/v1/intake/conn_" + "B" * 22, json=body).json
    assert response.json["detail"] == reference["detail"]   # nothing tells one refusal from another
    assert intakes(google["id"]) == [] and intakes(other["id"]) == []


def test_a_contact_that_matches_a_lead_is_a_duplicate_submission_on_it(client, cws, make_lead):
    body = google_body(cws)
    existing = make_lead(cws, phone=column(body, "PHONE_NUMBER"))
    google = conn(cws, "Google Ads - Villas")
    assert client.post(google["url"], json=body).status_code == 200
    [row] = intakes(google["id"])
    assert row.outcome == "duplicate" and lead_of(row).public_id == existing["id"]
    kinds = [a.kind for a in Activity.select().where(Activity.lead == row.lead_id)]
    assert "duplicate_submission" in kinds and leads_with(cws, column(body, "PHONE_NUMBER")) == 1


def test_a_landline_is_rejected_kept_and_answered_200(client, cws):
    google = conn(cws, "Google Ads - Villas")
    response = client.post(google["url"], json=with_phone(google_body(cws), "+91 11 2345 6789"))
    assert response.status_code == 200
    [row] = intakes(google["id"])
    assert row.outcome == "rejected" and row.lead_id is None and "phone" in row.errors
    assert row.payload["user_column_data"]
    connector = Connector.get(Connector.public_id == google["id"])
    assert row.public_id in connector.last_error
    # The next payload that is used clears it.
    client.post(google["url"], json=with_phone(google_body(cws), new_phone()))
    assert Connector.get(Connector.public_id == google["id"]).last_error is None


def test_a_rejected_intake_is_created_by_a_retry_after_the_setup_is_fixed(client, cws):
    google = conn(cws, "Google Ads - Villas")
    client.post(google["url"], json=with_phone(google_body(cws), "+971501234567"))   # a UAE mobile
    [row] = intakes(google["id"])
    assert row.outcome == "rejected"
    retry = f"/api/v1/connectors/{google['id']}/intakes/{row.public_id}/retry"
    again = client.post(retry, headers=cws.headers())
    assert again.status_code == 200 and again.json["data"]["outcome"] == "rejected"
    data = parse_setup({**_setup_of(cws), "workspace": {"name": _workspace_name(cws), "phone_regions": ["IN", "AE"]}})
    apply_setup(data, "test-webhook-secret-key-0123456789abcdef")
    fixed = client.post(retry, headers=cws.headers())
    assert fixed.status_code == 200 and fixed.json["data"]["outcome"] == "created"
    assert fixed.json["data"]["errors"] is None and fixed.json["data"]["lead"]["id"].startswith("ld_")
    assert client.post(retry, headers=cws.headers()).status_code == 409   # created: nothing to retry


def _workspace_name(tenant):
    from leadsvc.models import Workspace
    return Workspace.get(Workspace.public_id == tenant.public_id).name


def _setup_of(tenant):
    """The standard setup with the connectors, as make_workspace applied it."""
    from conftest import standard_setup
    data = standard_setup(_workspace_name(tenant))
    with_connectors(data)
    return data


def test_sixteen_deliveries_of_one_payload_at_once_make_one_lead(live_server, cws):
    google = conn(cws, "Google Ads - Villas")
    body = google_body(cws)
    start = threading.Barrier(16)

    def post(_):
        start.wait()
        reply = call(live_server, "POST", google["url"], json_body=body)
        return reply.status, reply.json()

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(post, range(16)))
    assert Counter(status for status, _ in results) == {200: 16}, results
    assert len({json.dumps(payload) for _, payload in results}) == 1
    assert len(intakes(google["id"])) == 1
    assert leads_with(cws, column(body, "PHONE_NUMBER")) == 1


# --- Meta ------------------------------------------------------------------------------------

def test_meta_subscription_check_answers_the_challenge_with_the_key(client, cws):
    meta_conn = conn(cws, "Meta lead ads")
    query = {"hub.mode": "subscribe", "hub.verify_token": meta_conn["key"], "hub.challenge": "1158201444"}
    response = client.get(f"{meta_conn['url']}?{urlencode(query)}")
    assert response.status_code == 200 and response.mimetype == "text/plain"
    assert response.get_data(as_text=True) == "1158201444"
    wrong = client.get(f"{meta_conn['url']}?{urlencode({**query, 'hub.verify_token': 'nope'})}")
    assert wrong.status_code == 403
    google = client.get(f"{conn(cws, 'Google Ads - Villas')['url']}?{urlencode(query)}")
    assert google.status_code == 403   # only Meta verifies with a GET


def signed_post(client, url, payload, secret=APP_SECRET):
    body = json.dumps(payload).encode()
    signature = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return client.post(url, data=body, content_type="application/json", headers={"X-Hub-Signature-256": signature})


def test_a_signed_meta_notification_queues_one_pending_intake_per_leadgen_change(client, cws, monkeypatch):
    monkeypatch.setenv(META_APP_SECRET_ENV, APP_SECRET)
    meta_conn = conn(cws, "Meta lead ads")
    notification = intake_fixture("meta_notification")
    response = signed_post(client, meta_conn["url"], notification)
    assert response.status_code == 200
    rows = intakes(meta_conn["id"])
    assert [row.external_id for row in rows] == ["1100000000000001", "1100000000000002"]   # not the feed change
    assert all(row.outcome == "pending" and row.next_attempt_at is not None and row.lead_id is None for row in rows)
    assert rows[0].payload == notification["entry"][0]["changes"][0]
    assert response.json["data"]["intakes"] == [row.public_id for row in rows]
    assert signed_post(client, meta_conn["url"], notification).json == response.json   # sent again: the same
    assert len(intakes(meta_conn["id"])) == 2


@pytest.mark.parametrize("how", ["wrong_secret", "no_signature", "secret_not_set"])
def test_a_meta_notification_not_signed_with_the_app_secret_is_403_and_stores_nothing(client, cws, monkeypatch, how):
    if how != "secret_not_set":
        monkeypatch.setenv(META_APP_SECRET_ENV, APP_SECRET)
    else:
        monkeypatch.delenv(META_APP_SECRET_ENV, raising=False)
    meta_conn = conn(cws, "Meta lead ads")
    notification = intake_fixture("meta_notification")
    if how == "no_signature":
        response = client.post(meta_conn["url"], json=notification)
    else:
        response = signed_post(client, meta_conn["url"], notification,
                               secret="another" if how == "wrong_secret" else APP_SECRET)
    assert response.status_code == 403 and intakes(meta_conn["id"]) == []
    if how == "secret_not_set":
        assert META_APP_SECRET_ENV in Connector.get(Connector.public_id == meta_conn["id"]).last_error


def test_a_graph_api_lead_maps_like_a_google_one():
    mapped = meta.lead(intake_fixture("meta_lead"), {"custom_fields": {"product_interest": "product_interest"}})
    assert mapped.external_id == "1100000000000001"
    assert mapped.fields == {"first_name": "Meera", "last_name": "Iyer", "phone": "+919812345678",
                             "email": "meera.iyer@example.com", "custom_fields": {"product_interest": "3bhk"}}
    assert mapped.attribution == {"campaign_id": "120200000000000003", "adgroup_id": "120200000000000002",
                                  "ad_id": "120200000000000001", "form_id": "830000000000001"}


def test_a_fetched_meta_lead_settles_its_pending_intake(client, cws, monkeypatch):
    monkeypatch.setenv(META_APP_SECRET_ENV, APP_SECRET)
    meta_conn = conn(cws, "Meta lead ads")
    signed_post(client, meta_conn["url"], intake_fixture("meta_notification"))
    row = intakes(meta_conn["id"])[0]
    connector = Connector.get(Connector.public_id == meta_conn["id"])
    graph = intake_fixture("meta_lead")
    settled = intake.settle(row, connector, graph, meta.lead(graph, connector.settings), client.application.config["LEADSVC"])
    assert settled.outcome == "created" and settled.next_attempt_at is None and settled.payload == graph
    assert lead_of(settled).channel == "meta" and lead_of(settled).custom_fields == {"product_interest": "3bhk"}


# --- IndiaMART and JustDial ------------------------------------------------------------------

def test_an_indiamart_push_makes_a_lead_with_its_message_as_a_note(client, cws):
    indiamart = conn(cws, "IndiaMART")
    response = client.post(f"{indiamart['url']}/{indiamart['key']}", json=intake_fixture("indiamart_push"))
    assert response.status_code == 200
    [row] = intakes(indiamart["id"])
    lead = lead_of(row)
    assert row.external_id == "2790000001" and row.outcome == "created"
    assert (lead.first_name, lead.last_name, lead.phone) == ("Ravi Kumar", "Sharma", "+919876543210")
    assert lead.custom_fields == {"notes_from_call": "Pune"}
    document = client.get(f"/api/v1/leads/{lead.public_id}?include=notes", headers=cws.headers()).json["data"]
    assert document["notes"][0]["body"].startswith("I want to get a quote")
    assert document["notes"][0]["author"]["type"] == "connector"
    wrong = client.post(f"{indiamart['url']}/{conn(cws, 'JustDial')['key']}", json=intake_fixture("indiamart_push"))
    assert wrong.status_code == 403 and len(intakes(indiamart["id"])) == 1
    assert client.post(indiamart["url"], json=intake_fixture("indiamart_push")).status_code == 403   # key in the path


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_a_justdial_lead_on_the_do_not_call_list_is_do_not_contact(client, cws, method):
    justdial = conn(cws, "JustDial")
    fields = intake_fixture("justdial")
    url = f"{justdial['url']}/{justdial['key']}"
    response = client.get(f"{url}?{urlencode(fields)}") if method == "GET" else client.post(url, data=fields)
    assert response.status_code == 200
    [row] = intakes(justdial["id"])
    lead = lead_of(row)
    assert row.external_id == "JD0000012345" and lead.do_not_contact is True
    assert (lead.first_name, lead.last_name, lead.phone) == ("Sunil", "Patil", "+919823456789")
    consent = Consent.get(Consent.lead == lead.id)   # the connector's notice_version records a consent
    assert consent.notice_version == "jd-2026-01" and consent.purpose == "JustDial"
    assert lead.consent["source"] == justdial["id"]


def test_a_justdial_duplicate_on_the_do_not_call_list_makes_the_lead_do_not_contact(client, cws, make_lead):
    existing = make_lead(cws, phone="+919823456789")
    justdial = conn(cws, "JustDial")
    client.post(f"{justdial['url']}/{justdial['key']}", data=intake_fixture("justdial"))
    assert Lead.get(Lead.public_id == existing["id"]).do_not_contact is True


# --- generic ---------------------------------------------------------------------------------

def generic_headers(key, body, msg_id="msg_1"):
    now = utcnow()
    from datetime import UTC
    moment = now.replace(tzinfo=UTC)
    return {"webhook-id": msg_id, "webhook-timestamp": str(int(moment.timestamp())),
            "webhook-signature": Signer(key).sign(msg_id, moment, body)}


@pytest.mark.parametrize("auth", ["signed", "bearer"])
def test_a_generic_payload_maps_by_its_json_pointers(client, cws, auth):
    hook = conn(cws, "Website hook")
    body = json.dumps(intake_fixture("generic"))
    headers = generic_headers(hook["key"], body) if auth == "signed" else {"Authorization": f"Bearer {hook['key']}"}
    response = client.post(hook["url"], data=body, content_type="application/json", headers=headers)
    assert response.status_code == 200
    [row] = intakes(hook["id"])
    lead = lead_of(row)
    assert row.external_id == "web-000123" and row.outcome == "created"
    assert (lead.first_name, lead.last_name, lead.email) == ("Kiran", "Desai", "kiran.desai@example.com")
    assert float(lead.estimated_value) == 2500000 and lead.custom_fields == {"family_size": 4}
    assert lead.attribution == {"utm_campaign": "diwali-2026", "utm_source": "newsletter", "external_id": "web-000123"}
    assert lead.campaign == "diwali-2026"


@pytest.mark.parametrize("how", ["bad_signature", "other_key", "stale_timestamp"])
def test_a_generic_payload_not_signed_with_its_key_is_403(client, cws, how):
    hook = conn(cws, "Website hook")
    body = json.dumps(intake_fixture("generic"))
    headers = generic_headers(hook["key"], body)
    if how == "bad_signature":
        headers["webhook-signature"] = "v1,AAAA"
    elif how == "other_key":
        headers = generic_headers("whsec_" + "QUJD" * 8, body)
    else:
        headers["webhook-timestamp"] = str(int(headers["webhook-timestamp"]) - 3600)
    response = client.post(hook["url"], data=body, content_type="application/json", headers=headers)
    assert response.status_code == 403 and intakes(hook["id"]) == []


# --- hostile input ---------------------------------------------------------------------------

def test_a_body_over_the_limit_is_413_and_stores_nothing(client, cws):
    indiamart = conn(cws, "IndiaMART")
    push = intake_fixture("indiamart_push")
    push["RESPONSE"]["QUERY_MESSAGE"] = "x" * 70_000
    response = client.post(f"{indiamart['url']}/{indiamart['key']}", json=push)
    assert response.status_code == 413 and response.json["code"] == "payload_too_large"
    assert intakes(indiamart["id"]) == []


def test_a_payload_with_ten_thousand_columns_is_refused_and_stores_nothing(make_app, cws):
    client = make_app(api={"max_body_bytes": 2_000_000}).test_client()
    google = conn(cws, "Google Ads - Villas")
    body = google_body(cws)
    body["user_column_data"] += [{"column_id": f"Q{i}", "string_value": "x"} for i in range(10_000)]
    response = client.post(google["url"], json=body)
    assert response.status_code == 422 and "body" in response.json["errors"]
    assert intakes(google["id"]) == []


def test_text_no_database_stores_is_422_from_a_verified_sender(client, cws):
    indiamart = conn(cws, "IndiaMART")
    push = intake_fixture("indiamart_push")
    push["RESPONSE"]["SENDER_NAME"] = "Ravi\x00"
    response = client.post(f"{indiamart['url']}/{indiamart['key']}", json=push)
    assert response.status_code == 422 and intakes(indiamart["id"]) == []


def test_a_sender_hammering_one_connector_is_limited_and_the_others_are_not(make_app, cws):
    client = make_app(rate_limits={"enabled": True, "intake": "3/minute", "per_ip": "1000/minute"}).test_client()
    justdial, indiamart = conn(cws, "JustDial"), conn(cws, "IndiaMART")
    statuses = [client.get(f"{justdial['url']}/wrong-key").status_code for _ in range(5)]
    assert statuses == [403, 403, 403, 429, 429]
    limited = client.get(f"{justdial['url']}/wrong-key")
    assert limited.json["code"] == "rate_limited" and int(limited.headers["Retry-After"]) >= 1
    other = client.post(f"{indiamart['url']}/{indiamart['key']}", json=intake_fixture("indiamart_push"))
    assert other.status_code == 200


# --- what is kept, and for how long ----------------------------------------------------------

def test_payloads_of_created_and_duplicate_intakes_are_cut_after_30_days_and_rejected_ones_kept(client, cws, app):
    google = conn(cws, "Google Ads - Villas")
    client.post(google["url"], json=google_body(cws))
    client.post(google["url"], json=with_phone(google_body(cws), "+91 11 2345 6789"))
    connector = Connector.get(Connector.public_id == google["id"])
    timer = Timer.get((Timer.kind == intake.CUT) & (Timer.subject == connector.id))
    clock = Clock(app.config["LEADSVC"])
    clock.tick(timer.fire_at)   # a day on: nothing is 30 days old yet
    assert all(row.payload is not None for row in intakes(google["id"]))
    clock.tick(utcnow() + timedelta(days=31))
    created, rejected = intakes(google["id"])
    assert created.outcome == "created" and created.payload is None
    assert rejected.outcome == "rejected" and rejected.payload is not None
    assert Timer.get((Timer.kind == intake.CUT) & (Timer.subject == connector.id)).fire_at > utcnow() + timedelta(days=31)


def test_the_cut_reads_the_kept_payloads_index(cws):
    connector = Connector.get(Connector.public_id == conn(cws, "Google Ads - Villas")["id"])
    query = (Intake.select(Intake.id).where((Intake.connector == connector.id) & intake.kept_payloads()
                                            & (Intake.received_at <= utcnow())).order_by(Intake.received_at).limit(10))
    assert "intake_payload_kept" in plan(*query.sql())


def test_an_erasure_clears_the_payloads_of_its_persons_intakes(client, cws):
    google = conn(cws, "Google Ads - Villas")
    client.post(google["url"], json=google_body(cws))
    [row] = intakes(google["id"])
    erased = client.post(f"/api/v1/leads/{lead_of(row).public_id}/erase", json={"reason": "Asked"}, headers=cws.headers())
    assert erased.status_code == 200
    assert Intake.get_by_id(row.id).payload is None
    listed = client.get(f"/api/v1/connectors/{google['id']}/intakes", headers=cws.headers()).json["data"]
    assert listed[0]["payload"] is None and "asha" not in json.dumps(listed).lower()
    assert AuditEntry.select().where(AuditEntry.lead == row.lead_id).count() >= 2
