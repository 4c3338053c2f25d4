"""Reference data: scoped to the caller's workspace, readable with any valid token."""

import pytest

from conftest import ROLE_EMAILS

REFERENCE_PATHS = ["/api/v1/statuses", "/api/v1/sources", "/api/v1/members", "/api/v1/teams",
                   "/api/v1/custom-fields", "/api/v1/forms"]


def with_forms(data):
    data["forms"] = [{"name": "Website enquiry", "source": "Website", "allowed_origins": ["https://acme.test"]},
                     {"name": "Walk-in", "allowed_origins": []}]


@pytest.fixture
def ws(make_workspace):
    return make_workspace(with_forms)


@pytest.fixture
def other_ws(make_workspace):
    return make_workspace(with_forms)


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


NO_NOTICE = {"notice": None, "notice_version": None, "consent_required": False}


def test_forms_list_each_form_with_its_source_and_the_path_of_its_page(client, ws):
    body = client.get("/api/v1/forms", headers=ws.headers("n1@t.test", ("leads:create",))).json
    assert body["links"] == {"next": None} and body["meta"] == {"has_more": False}
    assert body["data"] == [
        {"id": ws.ids.forms["Walk-in"], "name": "Walk-in", "source": None,
         "page_url": f"/forms/{ws.ids.forms['Walk-in']}", **NO_NOTICE},
        {"id": ws.ids.forms["Website enquiry"], "name": "Website enquiry",
         "source": {"id": ws.ids.sources["Website"], "name": "Website"},
         "page_url": f"/forms/{ws.ids.forms['Website enquiry']}", **NO_NOTICE},
    ]
    page = client.get(body["data"][1]["page_url"])
    assert page.status_code == 200 and "<h1>Website enquiry</h1>" in page.get_data(as_text=True)


def test_forms_list_is_in_the_openapi_document(client):
    spec = client.get("/api/v1/openapi.json").json
    operation = spec["paths"]["/api/v1/forms"]["get"]
    schema = operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
    item = spec["components"]["schemas"][spec["components"]["schemas"][schema]["properties"]["data"]["items"]["$ref"]
                                         .rsplit("/", 1)[1]]
    assert set(item["properties"]) == {"id", "name", "source", "page_url", *NO_NOTICE}


def test_the_root_redirects_to_the_docs(client):
    response = client.get("/")
    assert response.status_code == 302 and response.headers["Location"] == "/docs"
    assert client.get(response.headers["Location"]).status_code == 200


@pytest.mark.parametrize("path", REFERENCE_PATHS + ["/api/v1/lost-reasons"])
def test_a_query_parameter_a_list_does_not_take_is_422_naming_it(client, ws, path):
    # A typo, or a filter the list does not have, must not be silently ignored.
    response = client.get(f"{path}?active=true", headers=ws.headers())
    assert response.status_code == 422
    assert response.json["code"] == "validation_failed" and "active" in response.json["errors"]
    assert client.get(path, headers=ws.headers()).status_code == 200
