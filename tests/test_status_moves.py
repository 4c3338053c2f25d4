"""POST /api/v1/leads/{id}/status: allowed moves, transitions, activity and audit together."""

from datetime import timedelta

from leadsvc.models import Activity, AuditEntry, Lead, Transition


def move(client, ws, lead_id, status, note=None, email="admin@t.test", **headers):
    body = {"status": ws.ids.statuses.get(status, status)}
    if note is not None:
        body["note"] = note
    return client.post(f"/api/v1/leads/{lead_id}/status", json=body, headers={**ws.headers(email), **headers})


def test_an_allowed_move_records_transition_activity_and_audit(client, make_lead, ws):
    lead = make_lead(ws)
    row = Lead.get(Lead.public_id == lead["id"])
    Lead.update(status_changed_at=row.status_changed_at - timedelta(seconds=90)).where(Lead.id == row.id).execute()
    response = move(client, ws, lead["id"], "Contacted", note="Called, wants a visit", **{"X-Request-ID": "mv-1"})
    assert response.status_code == 200
    data, transition = response.json["data"], response.json["transition"]
    assert data["status"]["name"] == "Contacted" and data["status_changed_at"] == transition["at"]
    assert transition["from"]["id"] == ws.ids.statuses["New"] and transition["to"]["id"] == ws.ids.statuses["Contacted"]
    assert transition["note"] == "Called, wants a visit" and transition["id"].startswith("tr_")
    assert 90 <= transition["seconds_in_from"] < 120
    assert transition["actor"]["type"] == "token" and transition["actor"]["id"].startswith("tok_")
    assert transition["actor"]["member"]["id"] == ws.ids.members["admin@t.test"]
    assert Transition.select().where(Transition.lead == row.id).count() == 2
    activity = Activity.get((Activity.lead == row.id) & (Activity.kind == "status_changed"))
    assert activity.data["to"] == ws.ids.statuses["Contacted"]
    audit = AuditEntry.get((AuditEntry.lead == row.id) & (AuditEntry.action == "status_changed"))
    assert audit.changes == {"status": {"old": ws.ids.statuses["New"], "new": ws.ids.statuses["Contacted"]}}
    assert audit.request_id == "mv-1"


def test_a_move_the_status_does_not_allow_is_409_listing_the_targets(client, make_lead, ws):
    lead = make_lead(ws)
    response = move(client, ws, lead["id"], "Won")
    assert response.status_code == 409 and response.json["code"] == "conflict"
    detail = response.json["detail"]
    assert "Contacted" in detail and ws.ids.statuses["Contacted"] in detail and ws.ids.statuses["Lost"] in detail
    assert Transition.select().where(Transition.lead == Lead.get(Lead.public_id == lead["id"]).id).count() == 1


def test_moving_to_the_current_status_is_409(client, make_lead, ws):
    lead = make_lead(ws)
    response = move(client, ws, lead["id"], "New")
    assert response.status_code == 409 and "already" in response.json["detail"]


def test_unknown_or_malformed_status_is_422(client, make_lead, ws, other_ws):
    lead = make_lead(ws)
    for status in ("Contacted", "st_AAAAAAAAAAAAAAAAAAAA", other_ws.ids.statuses["Contacted"]):
        response = move(client, ws, lead["id"], status if status != "Contacted" else "Contacted!")
        assert response.status_code == 422 and "status" in response.json["errors"]
    assert client.post(f"/api/v1/leads/{lead['id']}/status", json={}, headers=ws.headers()).status_code == 422


def test_won_scores_100_lost_0_and_lost_can_reopen(client, make_lead, ws):
    lead = make_lead(ws)
    for status in ("Contacted", "Qualified", "Proposal", "Won"):
        response = move(client, ws, lead["id"], status)
        assert response.status_code == 200, response.json
    assert response.json["data"]["score"] == 100 and response.json["data"]["score_band"] == "hot"
    assert move(client, ws, lead["id"], "Lost").status_code == 409, "Won is final"
    other = make_lead(ws)
    lost = move(client, ws, other["id"], "Lost").json["data"]
    assert lost["score"] == 0 and lost["score_band"] == "cold"
    reopened = move(client, ws, other["id"], "New").json["data"]
    assert reopened["score"] == other["score"]


def test_if_match_applies_to_status_moves(client, make_lead, ws):
    lead = make_lead(ws)
    response = move(client, ws, lead["id"], "Contacted", **{"If-Match": '"stale"'})
    assert response.status_code == 412
    tag = client.get(f"/api/v1/leads/{lead['id']}", headers=ws.headers()).headers["ETag"]
    assert move(client, ws, lead["id"], "Contacted", **{"If-Match": tag}).status_code == 200


def test_status_moves_need_the_ability_and_the_scope(client, make_lead, ws, other_ws):
    lead = make_lead(ws)
    denied = client.post(f"/api/v1/leads/{lead['id']}/status", json={"status": ws.ids.statuses["Contacted"]},
                         headers=ws.headers("admin@t.test", ("leads:read", "leads:update")))
    assert denied.status_code == 403 and "leads:status" in denied.json["detail"]
    foreign = client.post(f"/api/v1/leads/{lead['id']}/status", json={"status": ws.ids.statuses["Contacted"]},
                          headers=other_ws.headers())
    assert foreign.status_code == 404


def test_a_note_longer_than_5000_characters_is_422(client, make_lead, ws):
    lead = make_lead(ws)
    response = move(client, ws, lead["id"], "Contacted", note="x" * 5001)
    assert response.status_code == 422 and "note" in response.json["errors"]
