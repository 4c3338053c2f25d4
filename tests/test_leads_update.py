"""GET one lead and PATCH it: includes, ETags, field-level audit, owner changes, collisions."""

import pytest

from conftest import new_phone
from leadsvc.models import Activity, AuditEntry, Lead, Note


def patch(client, ws, lead_id, body, email="admin@t.test", **headers):
    return client.patch(f"/api/v1/leads/{lead_id}", json=body, headers={**ws.headers(email), **headers})


def audit_rows(lead_id):
    return list(AuditEntry.select().where((AuditEntry.lead == Lead.get(Lead.public_id == lead_id).id)
                                          & (AuditEntry.action == "updated")).order_by(AuditEntry.id))


# --- read --------------------------------------------------------------------------------------

def test_read_returns_the_lead_with_an_etag(client, make_lead, ws):
    lead = make_lead(ws)
    response = client.get(f"/api/v1/leads/{lead['id']}", headers=ws.headers())
    assert response.status_code == 200 and response.json["data"] == lead
    assert response.headers["ETag"].startswith('"')
    again = client.get(f"/api/v1/leads/{lead['id']}", headers={**ws.headers(), "If-None-Match": response.headers["ETag"]})
    assert again.status_code == 304


def test_include_adds_activities_and_notes_newest_first(client, make_lead, ws):
    lead = make_lead(ws)
    row = Lead.get(Lead.public_id == lead["id"])
    Note.create(workspace=row.workspace_id, lead=row, body="first call went well")
    response = client.get(f"/api/v1/leads/{lead['id']}?include=activities,notes", headers=ws.headers())
    data = response.json["data"]
    assert [a["kind"] for a in data["activities"]] == ["assigned", "created"]
    assert data["activities"][0]["actor"]["type"] == "token"
    assert data["activities"][0]["actor"]["member"]["id"] == ws.ids.members["admin@t.test"]
    assert [n["body"] for n in data["notes"]] == ["first call went well"]
    only = client.get(f"/api/v1/leads/{lead['id']}?include=notes", headers=ws.headers()).json["data"]
    assert "notes" in only and "activities" not in only


def test_unknown_include_is_422(client, make_lead, ws):
    lead = make_lead(ws)
    response = client.get(f"/api/v1/leads/{lead['id']}?include=activities,emails", headers=ws.headers())
    assert response.status_code == 422 and "include" in response.json["errors"]


def test_a_lead_outside_the_scope_is_404_like_a_missing_one(client, make_lead, ws, other_ws):
    lead = make_lead(ws)
    owner = lead["owner"]["id"]
    stranger = next(e for e, m in ws.ids.members.items() if m != owner and e in ("n1@t.test", "n2@t.test", "s1@t.test"))
    for headers in (ws.headers(stranger), other_ws.headers()):
        response = client.get(f"/api/v1/leads/{lead['id']}", headers=headers)
        assert response.status_code == 404 and response.json["code"] == "not_found"
    missing = client.get("/api/v1/leads/ld_AAAAAAAAAAAAAAAAAAAA", headers=ws.headers())
    assert missing.status_code == 404
    assert set(missing.json) == set(response.json) and missing.json["detail"].startswith("No lead")


# --- update ------------------------------------------------------------------------------------

def test_only_the_fields_sent_change_and_one_audit_entry_records_them(client, make_lead, ws):
    lead = make_lead(ws, email="old@example.com")
    response = patch(client, ws, lead["id"], {"last_name": "Iyer", "email": "New@Example.com"},
                     **{"X-Request-ID": "req-patch-1"})
    assert response.status_code == 200
    data = response.json["data"]
    assert data["contact"]["last_name"] == "Iyer" and data["contact"]["email"] == "new@example.com"
    assert data["contact"]["first_name"] == "Asha" and data["contact"]["phone"] == lead["contact"]["phone"]
    [entry] = audit_rows(lead["id"])
    assert entry.changes == {"last_name": {"old": "Rao", "new": "Iyer"},
                             "email": {"old": "old@example.com", "new": "new@example.com"}}
    assert entry.request_id == "req-patch-1" and entry.actor_member_id == ws.member("admin@t.test").id
    assert data["updated_at"] > lead["updated_at"]


def test_a_patch_that_changes_nothing_writes_no_audit(client, make_lead, ws):
    lead = make_lead(ws)
    response = patch(client, ws, lead["id"], {"first_name": "Asha", "phone": lead["contact"]["phone"]})
    assert response.status_code == 200 and response.json["data"] == lead
    assert audit_rows(lead["id"]) == []


def test_custom_fields_merge_key_by_key_and_null_removes(client, make_lead, ws):
    lead = make_lead(ws, custom_fields={"product_interest": "villa", "family_size": 4})
    response = patch(client, ws, lead["id"], {"custom_fields": {"family_size": None, "budget_confirmed": True}})
    assert response.json["data"]["custom_fields"] == {"product_interest": "villa", "budget_confirmed": True}
    [entry] = audit_rows(lead["id"])
    assert entry.changes == {"custom_fields.family_size": {"old": 4, "new": None},
                             "custom_fields.budget_confirmed": {"old": None, "new": True}}
    bad = patch(client, ws, lead["id"], {"custom_fields": {"product_interest": "castle"}})
    assert bad.status_code == 422 and "custom_fields.product_interest" in bad.json["errors"]


def test_the_score_is_recomputed_on_update(client, make_lead, ws):
    lead = make_lead(ws)
    response = patch(client, ws, lead["id"], {"custom_fields": {"product_interest": "villa"}})
    assert response.json["data"]["score"] == lead["score"] + 15


def test_status_in_a_patch_is_422_pointing_at_the_status_route(client, make_lead, ws):
    lead = make_lead(ws)
    response = patch(client, ws, lead["id"], {"status": ws.ids.statuses["Contacted"]})
    assert response.status_code == 422 and "/status" in response.json["errors"]["status"][0]


def test_phone_or_email_of_another_lead_is_409(client, make_lead, ws):
    first = make_lead(ws, email="first@example.com")
    second = make_lead(ws)
    assert patch(client, ws, second["id"], {"phone": first["contact"]["phone"]}).status_code == 409
    response = patch(client, ws, second["id"], {"email": "FIRST@example.com"})
    assert response.status_code == 409 and response.json["code"] == "conflict"
    assert audit_rows(second["id"]) == []


def test_removing_both_phone_and_email_is_422(client, make_lead, ws):
    lead = make_lead(ws)
    response = patch(client, ws, lead["id"], {"phone": None})
    assert response.status_code == 422
    assert patch(client, ws, lead["id"], {"email": "x@example.com"}).status_code == 200
    assert patch(client, ws, lead["id"], {"phone": None}).json["data"]["contact"]["phone"] is None


def test_changing_the_owner_needs_leads_assign(client, make_lead, ws):
    lead = make_lead(ws)
    target = ws.ids.members["s1@t.test"]
    denied = patch(client, ws, lead["id"], {"owner": target},
                   **ws.headers("admin@t.test", ("leads:update",)))
    assert denied.status_code == 403 and "leads:assign" in denied.json["detail"]
    response = patch(client, ws, lead["id"], {"owner": target})
    assert response.status_code == 200
    assert response.json["data"]["owner"]["id"] == target
    assert response.json["data"]["team"]["name"] == "South"
    row = Lead.get(Lead.public_id == lead["id"])
    assigned = Activity.select().where((Activity.lead == row.id) & (Activity.kind == "assigned")).order_by(Activity.id)
    assert list(assigned)[-1].data == {"rule": None, "strategy": "manual", "member": target}
    [entry] = audit_rows(lead["id"])
    assert entry.changes["owner"] == {"old": lead["owner"]["id"], "new": target}
    if lead["team"]["name"] != "South":
        assert entry.changes["team"] == {"old": lead["team"]["id"], "new": ws.ids.teams["South"]}


def test_a_manager_can_assign_only_within_its_team(client, make_lead, ws):
    lead = make_lead(ws)
    north_lead = lead if lead["team"]["name"] == "North" else make_lead(ws)
    north = ws.ids.members
    ok = patch(client, ws, north_lead["id"], {"owner": north["n2@t.test"]}, email="nmgr@t.test")
    assert ok.status_code == 200
    response = patch(client, ws, north_lead["id"], {"owner": north["s1@t.test"]}, email="nmgr@t.test")
    assert response.status_code == 422 and "owner" in response.json["errors"]


def test_agents_cannot_reassign(client, make_lead, ws):
    lead = make_lead(ws)
    owner = next(e for e, m in ws.ids.members.items() if m == lead["owner"]["id"])
    response = patch(client, ws, lead["id"], {"owner": ws.ids.members["admin@t.test"]}, email=owner)
    assert response.status_code == 403


def test_if_match_guards_against_lost_updates(client, make_lead, ws):
    lead = make_lead(ws)
    tag = client.get(f"/api/v1/leads/{lead['id']}", headers=ws.headers()).headers["ETag"]
    first = patch(client, ws, lead["id"], {"first_name": "Ash"}, **{"If-Match": tag})
    assert first.status_code == 200 and first.headers["ETag"] != tag
    stale = patch(client, ws, lead["id"], {"first_name": "Asha"}, **{"If-Match": tag})
    assert stale.status_code == 412 and stale.json["code"] == "precondition_failed"
    assert Lead.get(Lead.public_id == lead["id"]).first_name == "Ash"
    assert patch(client, ws, lead["id"], {"first_name": "Asha"}, **{"If-Match": "*"}).status_code == 200


@pytest.mark.parametrize("field,value", [("first_name", "x" * 101), ("phone", "12345"), ("email", "nope"),
                                         ("source", "Website"), ("estimated_value", -5), ("owner", "bob")])
def test_invalid_patch_values_are_422_and_change_nothing(client, make_lead, ws, field, value):
    lead = make_lead(ws)
    response = patch(client, ws, lead["id"], {field: value, "last_name": "Changed"})
    assert response.status_code == 422 and field in response.json["errors"]
    assert client.get(f"/api/v1/leads/{lead['id']}", headers=ws.headers()).json["data"] == lead


def test_update_of_a_lead_outside_the_scope_is_404(client, make_lead, ws, other_ws):
    lead = make_lead(ws)
    assert patch(client, other_ws, lead["id"], {"first_name": "Hacked"}).status_code == 404
    phone = new_phone()
    assert patch(client, ws, lead["id"], {"phone": phone}).json["data"]["contact"]["phone"] == phone
