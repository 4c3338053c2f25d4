"""Connectors (DESIGN section 19): declared in setup, keyed from the server's secret key, and what
admins see of them: health, intakes, retries and new keys."""

from __future__ import annotations

import json
import re
import uuid

import pytest

from conftest import WEBHOOK_SECRET_KEY, intake_fixture, standard_setup, with_connectors
from leadsvc import connectors, events
from leadsvc.models import Connector, Intake
from leadsvc.provision import SetupError, apply_setup, parse_setup


def connector_setup(name=None):
    data = standard_setup(name or f"Conn {uuid.uuid4().hex[:10]}")
    with_connectors(data)
    return data


def push(client, tenant, **changes):
    indiamart = tenant.ids.connectors["IndiaMART"]
    body = intake_fixture("indiamart_push")
    body["RESPONSE"].update({"UNIQUE_QUERY_ID": uuid.uuid4().hex, **changes})
    return client.post(f"{indiamart['url']}/{indiamart['key']}", json=body)


# --- setup and keys --------------------------------------------------------------------------

def test_setup_shows_each_key_once_and_a_rerun_keeps_ids_and_keys(app):
    data = connector_setup()
    first = apply_setup(parse_setup(data), WEBHOOK_SECRET_KEY)
    again = apply_setup(parse_setup(data), WEBHOOK_SECRET_KEY)
    assert set(first.connectors) == {"Google Ads - Villas", "Meta lead ads", "IndiaMART", "JustDial", "Website hook"}
    for name, made in first.connectors.items():
        assert made["id"].startswith("conn_") and made["url"] == f"/api/v1/intake/{made['id']}" and made["key"]
        assert again.connectors[name] == {**made, "key": None}   # never re-keyed, never shown again
        row = Connector.get(Connector.public_id == made["id"])
        assert connectors.key_of(row, WEBHOOK_SECRET_KEY) == made["key"]
    assert first.as_json()["connectors"] == first.connectors


def test_keys_are_whsec_for_generic_url_safe_otherwise_and_never_a_webhook_secret(app):
    keys = apply_setup(parse_setup(connector_setup()), WEBHOOK_SECRET_KEY).connectors
    assert keys["Website hook"]["key"].startswith("whsec_")
    for name in ("Google Ads - Villas", "Meta lead ads", "IndiaMART", "JustDial"):
        assert re.fullmatch(r"[A-Za-z0-9_-]{43}", keys[name]["key"]), name
    salt = events.new_salt()
    assert connectors.key_for("generic", salt, WEBHOOK_SECRET_KEY) != events.secret(salt, WEBHOOK_SECRET_KEY)


def test_setup_stores_the_names_of_environment_variables_never_their_values(app, monkeypatch):
    monkeypatch.setenv("ACME_META_APP_SECRET", "the-real-app-secret")
    ids = apply_setup(parse_setup(connector_setup()), WEBHOOK_SECRET_KEY).connectors
    row = Connector.get(Connector.public_id == ids["Meta lead ads"]["id"])
    assert row.settings["app_secret_env"] == "ACME_META_APP_SECRET"
    assert "the-real-app-secret" not in json.dumps(row.settings)


def test_setup_without_the_secret_key_is_a_clear_error_and_changes_nothing(app):
    data = connector_setup()
    with pytest.raises(SetupError, match="webhooks.secret_key"):
        apply_setup(parse_setup(data), "")
    from leadsvc.models import Workspace
    assert Workspace.get_or_none(Workspace.name == data["workspace"]["name"]) is None


@pytest.mark.parametrize("change, key", [
    ({"kind": "myspace"}, "connectors[0].kind"),
    ({"source": "Billboard"}, "connectors[0].source"),
    ({"custom_fields": {"VILLA_TYPE": "no_such_field"}}, "connectors[0].custom_fields.VILLA_TYPE"),
    ({"app_secret_env": "X"}, "connectors[0].app_secret_env"),          # not a meta connector
    ({"map": {"phone": "/p"}}, "connectors[0].map"),                     # only generic maps
    ({"crm_key_env": "bad name"}, "connectors[0].crm_key_env"),
    ({"notice_version": ""}, "connectors[0].notice_version"),
    ({"colour": "red"}, "connectors[0].colour"),
])
def test_each_bad_connector_setting_is_refused_naming_its_key(app, change, key):
    data = connector_setup()
    data["connectors"][0].update(change)
    with pytest.raises(SetupError) as refused:
        parse_setup(data)
    assert any(problem.startswith(key) for problem in refused.value.problems), refused.value.problems


@pytest.mark.parametrize("change, key", [
    ({"map": {"phone": "contact/phone"}}, "connectors[4].map"),           # not a JSON pointer
    ({"map": {"nickname": "/n", "phone": "/p"}}, "connectors[4].map"),    # not a lead field
    ({"map": {"first_name": "/n"}}, "connectors[4].map"),                 # no contact
    ({"map": {"phone": "/p", "custom_fields.nope": "/x"}}, "connectors[4].map.custom_fields.nope"),
    ({"external_id": "ref"}, "connectors[4].external_id"),
])
def test_a_generic_map_is_checked_field_by_field(app, change, key):
    data = connector_setup()
    data["connectors"][4].update(change)
    with pytest.raises(SetupError) as refused:
        parse_setup(data)
    assert any(problem.startswith(key) for problem in refused.value.problems), refused.value.problems


def test_a_meta_connector_needs_its_secrets_environment_variables(app):
    data = connector_setup()
    del data["connectors"][1]["app_secret_env"]
    with pytest.raises(SetupError, match=r"connectors\[1\]\.app_secret_env: Required for meta connectors"):
        parse_setup(data)


def test_a_connectors_kind_cannot_change(app):
    data = connector_setup()
    apply_setup(parse_setup(data), WEBHOOK_SECRET_KEY)
    data["connectors"][3]["kind"] = "indiamart"
    with pytest.raises(SetupError, match=r"connectors\[3\]\.kind: connector 'JustDial' is justdial"):
        parse_setup(data)


# --- what admins see -------------------------------------------------------------------------

def test_a_connector_shows_its_health_counted_by_outcome(client, make_workspace):
    ws = make_workspace(with_connectors)
    push(client, ws)
    push(client, ws)
    push(client, ws, SENDER_MOBILE="+91-11-23456789")   # a landline: rejected
    indiamart = ws.ids.connectors["IndiaMART"]["id"]
    response = client.get(f"/api/v1/connectors/{indiamart}", headers=ws.headers())
    assert response.status_code == 200
    data = response.json["data"]
    assert data["kind"] == "indiamart" and data["source"]["id"] == ws.ids.sources["Referral"]
    assert data["counts"]["24h"] == {"created": 1, "duplicate": 1, "rejected": 1, "test": 0, "pending": 0}
    assert data["counts"]["30d"] == data["counts"]["24h"]
    assert data["last_received_at"] and "rejected" in data["last_error"] and "key" not in data
    listed = client.get("/api/v1/connectors", headers=ws.headers()).json["data"]
    assert [c["name"] for c in listed] == sorted(ws.ids.connectors)
    assert next(c for c in listed if c["id"] == indiamart)["counts"] == data["counts"]


def test_intakes_list_newest_first_by_cursor_and_filter_by_outcome(client, make_workspace):
    ws = make_workspace(with_connectors)
    sent = [push(client, ws, SENDER_MOBILE=f"+91-98{n:03d}-00000" if n != 2 else "+91-11-23456789")
            for n in range(5)]
    assert all(r.status_code == 200 for r in sent)
    ids = [r.json["data"]["intakes"][0] for r in sent]
    url = f"/api/v1/connectors/{ws.ids.connectors['IndiaMART']['id']}/intakes"
    first = client.get(f"{url}?page[size]=3", headers=ws.headers()).json
    second = client.get(first["links"]["next"], headers=ws.headers()).json
    assert [row["id"] for row in first["data"] + second["data"]] == ids[::-1]
    assert second["meta"]["has_more"] is False
    assert first["data"][0]["lead"]["id"].startswith("ld_") and first["data"][0]["payload"]["RESPONSE"]
    rejected = client.get(f"{url}?filter[outcome]=rejected", headers=ws.headers()).json["data"]
    assert [row["id"] for row in rejected] == [ids[2]] and rejected[0]["errors"]["phone"]
    assert client.get(f"{url}?filter[outcome]=lost", headers=ws.headers()).status_code == 422


def test_retrying_an_intake_that_is_not_rejected_is_409(client, make_workspace):
    ws = make_workspace(with_connectors)
    intake_id = push(client, ws).json["data"]["intakes"][0]
    response = client.post(f"/api/v1/connectors/{ws.ids.connectors['IndiaMART']['id']}/intakes/{intake_id}/retry",
                           headers=ws.headers())
    assert response.status_code == 409 and response.json["code"] == "conflict"


def test_a_rotated_key_works_at_once_and_the_old_one_stops(client, make_workspace):
    ws = make_workspace(with_connectors)
    indiamart = ws.ids.connectors["IndiaMART"]
    response = client.post(f"/api/v1/connectors/{indiamart['id']}/rotate-key", headers=ws.headers())
    assert response.status_code == 200
    new_key = response.json["data"]["key"]
    assert new_key != indiamart["key"] and response.json["data"]["id"] == indiamart["id"]
    body = intake_fixture("indiamart_push")
    assert client.post(f"{indiamart['url']}/{indiamart['key']}", json=body).status_code == 403
    assert client.post(f"{indiamart['url']}/{new_key}", json=body).status_code == 200
    assert "key" not in client.get(f"/api/v1/connectors/{indiamart['id']}", headers=ws.headers()).json["data"]


def test_another_workspaces_connector_is_404_to_an_admin(client, make_workspace):
    ws, other = make_workspace(with_connectors), make_workspace(with_connectors)
    theirs = other.ids.connectors["IndiaMART"]["id"]
    for method, path in (("GET", ""), ("GET", "/intakes"), ("POST", "/rotate-key")):
        response = client.open(f"/api/v1/connectors/{theirs}{path}", method=method, headers=ws.headers())
        assert response.status_code == 404, path
    assert Intake.select().join(Connector).where(Connector.public_id == theirs).count() == 0


def test_cli_rotate_key_prints_the_new_key_once(run_cli, make_workspace, client):
    ws = make_workspace(with_connectors)
    justdial = ws.ids.connectors["JustDial"]
    result = run_cli("connectors", "rotate-key", justdial["id"], "--json")
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert body["id"] == justdial["id"] and body["url"] == justdial["url"] and body["key"] != justdial["key"]
    fields = intake_fixture("justdial")
    assert client.post(f"{justdial['url']}/{body['key']}", data=fields).status_code == 200
    assert client.post(f"{justdial['url']}/{justdial['key']}", data=fields).status_code == 403
    unknown = run_cli("connectors", "rotate-key", "conn_nope")
    assert unknown.exit_code != 0 and "No connector conn_nope" in unknown.output
