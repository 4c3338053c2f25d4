"""Reference data: scoped to the caller's workspace, readable with any valid token."""

import pytest

from conftest import ROLE_EMAILS

REFERENCE_PATHS = ["/api/v1/statuses", "/api/v1/sources", "/api/v1/members", "/api/v1/teams",
                   "/api/v1/custom-fields"]


def test_statuses_come_in_pipeline_order_with_their_allowed_moves(client, ws):
    body = client.get("/api/v1/statuses", headers=ws.headers()).json
    names = [s["name"] for s in body["data"]]
    assert names == ["New", "Contacted", "Qualified", "Proposal", "Won", "Lost"]
    by_name = {s["name"]: s for s in body["data"]}
    assert by_name["New"]["next"] == [by_name["Contacted"]["id"], by_name["Lost"]["id"]]
    assert by_name["Won"]["next"] == []
    assert body["links"] == {"next": None} and body["meta"] == {"has_more": False}


@pytest.mark.parametrize("role", ROLE_EMAILS)
@pytest.mark.parametrize("path", REFERENCE_PATHS)
def test_every_role_reads_reference_data_of_its_own_workspace_only(client, ws, other_ws, role, path):
    mine = client.get(path, headers=ws.headers(ROLE_EMAILS[role], ("leads:read",)))
    assert mine.status_code == 200
    theirs = client.get(path, headers=other_ws.headers()).json["data"]
    mine_ids = {item["id"] for item in mine.json["data"]}
    assert mine_ids and not mine_ids & {item["id"] for item in theirs}


def test_members_show_role_team_and_no_internal_ids(client, ws):
    members = client.get("/api/v1/members", headers=ws.headers()).json["data"]
    agent = next(m for m in members if m["email"] == "n1@t.test")
    assert agent["role"] == "agent" and agent["team"]["name"] == "North"
    assert agent["id"].startswith("mem_") and agent["team"]["id"].startswith("team_")
    admin = next(m for m in members if m["role"] == "admin")
    assert admin["team"] is None


@pytest.mark.parametrize("path", REFERENCE_PATHS)
def test_reference_data_needs_a_token(client, path):
    response = client.get(path)
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
