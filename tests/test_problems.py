"""Errors: every problem code the app produces is an RFC 9457 document with the contract's members.

401 and 403 are covered in test_auth.py.
"""

import json

import peewee
import pytest
from flask import abort, request

from leadsvc import reference
from leadsvc.db import database, make_database
from leadsvc.problems import CODES

MEMBERS = {"type", "title", "status", "detail", "code", "request_id"}
LEADS = "/api/v1/leads"


def assert_problem(response, status, code):
    """The response is a problem document of this status and code, with every member the contract names."""
    assert response.status_code == status, response.get_data(as_text=True)
    assert response.content_type == "application/problem+json"
    body = response.json
    assert MEMBERS <= set(body), body
    assert body["status"] == status and body["code"] == code
    assert body["title"] == CODES[code][1] and body["detail"]
    assert body["type"].endswith(f"/docs/api/problems/{code}")
    assert body["request_id"] == response.headers["X-Request-ID"]
    assert ("errors" in body) == (code == "validation_failed")
    return body


# --- routing ---------------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["/nope", "/api/v1/nope", "/api/v2/leads", "/docs/api/problems/no_such_code"])
def test_unknown_route_is_404_not_found(client, ws, path):
    assert_problem(client.get(path, headers=ws.headers()), 404, "not_found")


@pytest.mark.parametrize("lead_id", ["ld_aaaaaaaaaaaaaaaaaaaa%00", "ld_aaaaaaaaaaaaaaaaaaaa%0A", "ld_" + "a" * 5000,
                                     "ld_%C3%A9t%C3%A9aaaaaaaaaaaaaaaaaa", "st_aaaaaaaaaaaaaaaaaaaa"],
                         ids=["NUL", "newline", "5000 characters", "non-ASCII", "another kind"])
@pytest.mark.parametrize("method", ["get", "patch"])
def test_a_malformed_lead_id_is_404_never_500(client, ws, lead_id, method):
    response = getattr(client, method)(f"{LEADS}/{lead_id}", json={}, headers=ws.headers())
    assert_problem(response, 404, "not_found")
    assert len(response.json["detail"]) < 100


@pytest.mark.parametrize("method, path, allowed", [
    ("delete", "/api/v1/statuses", {"GET"}),
    ("put", LEADS, {"GET", "POST"}),
    ("delete", LEADS + "/ld_0000000000000000xxxx", {"GET", "PATCH"}),
    ("post", "/healthz", {"GET"}),
])
def test_wrong_method_is_405_with_allow(client, ws, method, path, allowed):
    response = getattr(client, method)(path, headers=ws.headers())
    assert_problem(response, 405, "method_not_allowed")
    assert allowed <= {m.strip() for m in response.headers["Allow"].split(",")}


MADE_UP_METHODS = ["PROPFIND", "FOO", "X" * 200_000]


@pytest.mark.parametrize("method", MADE_UP_METHODS, ids=["webdav", "made-up", "200k"])
@pytest.mark.parametrize("path", ["/nope", "/healthz", LEADS, LEADS + "/ld_0000000000000000xxxx"])
def test_a_method_http_does_not_define_is_501_on_every_route(client, ws, method, path):
    assert_problem(client.open(path, method=method, headers=ws.headers()), 501, "not_implemented")


@pytest.mark.parametrize("method, path", [("TRACE", "/healthz"), ("CONNECT", LEADS), ("PUT", "/healthz"),
                                          ("QUERY", LEADS)])
def test_a_method_http_defines_that_a_route_does_not_take_is_405(client, ws, method, path):
    response = client.open(path, method=method, headers=ws.headers())
    assert_problem(response, 405, "method_not_allowed")
    assert method not in response.headers["Allow"]


# --- bodies ----------------------------------------------------------------------------------

def test_body_over_max_body_bytes_is_413(client, ws):
    big = json.dumps({"first_name": "x" * 70_000, "phone": "9876543210"})
    assert_problem(client.post(LEADS, data=big, content_type="application/json", headers=ws.headers()),
                   413, "payload_too_large")


def test_max_body_bytes_setting_sets_the_limit(make_app, ws):
    client = make_app(api={"max_body_bytes": 1024}).test_client()
    body = json.dumps({"first_name": "x" * 2000, "phone": "9876543210"})
    assert_problem(client.post(LEADS, data=body, content_type="application/json", headers=ws.headers()),
                   413, "payload_too_large")


@pytest.mark.parametrize("content_type, body", [
    ("text/plain", '{"phone": "9876543210"}'),
    ("application/x-www-form-urlencoded", "phone=9876543210"),
    ("application/xml", "<lead/>"),
])
def test_non_json_body_to_a_json_endpoint_is_415(client, ws, content_type, body):
    response = client.post(LEADS, data=body, content_type=content_type, headers=ws.headers())
    assert_problem(response, 415, "unsupported_media_type")
    assert "application/json" in response.json["detail"]


@pytest.mark.parametrize("body", ['{"phone": ', "{'phone': 1}", "nope", '{"a": 1}}', b'{"first_name": "\xff\xfe"}'])
def test_malformed_json_is_422_with_errors_body(client, ws, body):
    response = client.post(LEADS, data=body, content_type="application/json", headers=ws.headers())
    errors = assert_problem(response, 422, "validation_failed")["errors"]
    assert errors == {"body": ["The request body is not valid JSON."]}


@pytest.mark.parametrize("body, what", [("[]", "an array"), ('[{"phone": "9876543210"}]', "an array"),
                                        ('"lead"', "a string"), ("42", "a number"), ("null", "null"),
                                        ("true", "a boolean"), ("", "empty")])
def test_json_that_is_not_an_object_is_422_with_errors_body(client, ws, body, what):
    response = client.post(LEADS, data=body, content_type="application/json", headers=ws.headers())
    errors = assert_problem(response, 422, "validation_failed")["errors"]
    assert list(errors) == ["body"] and what in errors["body"][0]


@pytest.mark.parametrize("body, message", [
    ("[" * 20_000 + "]" * 20_000, "nested too deeply"),
    ('{"a":' * 5_000 + "1" + "}" * 5_000, "nested too deeply"),
    ('{"phone": "9876543210", "first_name": "Asha\\u0000Rao"}', "NUL character"),
    ('{"phone": "9876543210", "custom_fields": {"notes_from_call": "\\u0000"}}', "NUL character"),
    ('{"phone": "9876543210", "first_name": "\\ud800"}', "lone UTF-16 surrogate"),
    ('{"phone": "9876543210", "\\udfff": 1}', "lone UTF-16 surrogate"),
    ('{"phone": "9876543210", "estimated_value": ' + "9" * 5_000 + "}", "number too long to read"),
], ids=["deep array", "deep object", "NUL", "NUL in custom field", "lone surrogate", "lone surrogate key",
        "huge number"])
def test_json_that_cannot_be_processed_or_stored_is_422_not_500(client, ws, body, message):
    response = client.post(LEADS, data=body, content_type="application/json", headers=ws.headers())
    errors = assert_problem(response, 422, "validation_failed")["errors"]
    assert len(errors) == 1 and message in next(iter(errors.values()))[0]


def test_a_surrogate_pair_is_ordinary_text(client, ws):
    body = '{"phone": "9876500009", "first_name": "Asha \\ud83d\\ude00"}'
    response = client.post(LEADS, data=body, content_type="application/json", headers=ws.headers())
    assert response.status_code == 201 and response.json["data"]["contact"]["first_name"] == "Asha \U0001F600"


def test_unknown_body_field_is_422_naming_it(client, ws):
    response = client.post(LEADS, json={"phone": "9876543210", "frist_name": "Asha"}, headers=ws.headers())
    errors = assert_problem(response, 422, "validation_failed")["errors"]
    assert errors == {"frist_name": ["Unknown field."]}


@pytest.mark.parametrize("path", [LEADS + "?sortt=score", LEADS + "/ld_0000000000000000xxxx?includ=notes"])
def test_unknown_query_parameter_is_422_naming_it(client, ws, path):
    errors = assert_problem(client.get(path, headers=ws.headers()), 422, "validation_failed")["errors"]
    assert errors == {path.rsplit("?", 1)[1].split("=")[0]: ["Unknown field."]}


@pytest.mark.parametrize("path", [LEADS + "?filter[status]=a&filter[status]=b", LEADS + "?sort=score&sort=-score",
                                  "/api/v1/statuses?x=1&x=2"])
def test_a_repeated_query_parameter_is_422_naming_it(client, ws, path):
    name = path.rsplit("?", 1)[1].split("=")[0]
    errors = assert_problem(client.get(path, headers=ws.headers()), 422, "validation_failed")["errors"]
    assert errors == {name: [f"Give {name} once; separate several values with commas."]}


def test_bad_query_value_is_422_naming_the_parameter(client, ws):
    response = client.get(LEADS + "?page[size]=0", headers=ws.headers())
    assert list(assert_problem(response, 422, "validation_failed")["errors"]) == ["page[size]"]


# --- failures --------------------------------------------------------------------------------

LEAKS = ("Traceback", "File \"", "SELECT", "secret_column", "RuntimeError", "OperationalError",
         "ProgrammingError", "peewee", "psycopg", "sqlite", ".py")


def test_unexpected_error_is_500_without_internals(make_app):
    app = make_app()
    app.config["PROPAGATE_EXCEPTIONS"] = False

    @app.get("/boom")
    def boom():
        raise RuntimeError("secret internals of leadsvc.py")

    @app.get("/bad-sql")
    def bad_sql():
        database.execute_sql("SELECT secret_column FROM lead")

    client = app.test_client()
    for path in ("/boom", "/bad-sql"):
        response = client.get(path)
        body = assert_problem(response, 500, "internal_error")
        text = response.get_data(as_text=True)
        assert not [leak for leak in LEAKS if leak in text], text
        assert body["detail"] == "The service failed to handle this request."


def test_a_werkzeug_bad_request_is_422_with_errors_body(make_app):
    app = make_app()

    @app.post("/raw")
    def raw():
        return {"got": request.get_json()}   # a view that parses JSON without the API's parser

    response = app.test_client().post("/raw", data="{bad", content_type="application/json")
    errors = assert_problem(response, 422, "validation_failed")["errors"]
    assert list(errors) == ["body"]


def test_any_other_4xx_is_bad_request_with_its_status(make_app):
    app = make_app()

    @app.get("/gone")
    def gone():
        abort(410)

    body = assert_problem(app.test_client().get("/gone"), 410, "bad_request")
    assert body["type"].endswith("/docs/api/problems/bad_request")


def test_database_locked_is_503_with_retry_after(client, ws, monkeypatch):
    def locked():
        raise peewee.OperationalError("database is locked")

    monkeypatch.setattr(reference, "request_refs", locked)
    response = client.get("/api/v1/statuses", headers=ws.headers())
    assert_problem(response, 503, "service_unavailable")
    assert int(response.headers["Retry-After"]) > 0
    assert "locked" not in response.get_data(as_text=True)


@pytest.fixture
def unreachable_app(make_app, backend, database_url, tmp_path):
    """An app whose database cannot be reached (a closed port, a folder that does not exist)."""
    url = (f"sqlite:///{tmp_path}/missing/folder/x.sqlite3" if backend == "sqlite"
           else "postgresql://postgres@127.0.0.1:1/leadsvc")
    yield make_app(database={"url": url, "pool_timeout": 1})
    database.initialize(make_database(database_url))


def test_unreachable_database_is_503_while_the_process_stays_alive(unreachable_app):
    client = unreachable_app.test_client()
    assert client.get("/healthz").status_code == 200
    assert_problem(client.get("/readyz"), 503, "service_unavailable")
    token = {"Authorization": "Bearer lsk_" + "A" * 40}
    response = client.get("/api/v1/statuses", headers=token)
    assert_problem(response, 503, "service_unavailable")
    assert "Retry-After" in response.headers
    text = response.get_data(as_text=True)
    assert "127.0.0.1" not in text and "refused" not in text.lower()


# --- request ids -----------------------------------------------------------------------------

REQUESTS = [("get", "/healthz"), ("get", "/api/v1/statuses"), ("get", "/nope"), ("delete", LEADS),
            ("post", LEADS), ("get", "/docs"), ("get", "/docs/api/problems/not_found"),
            ("get", "/api/v1/openapi.json")]


@pytest.mark.parametrize("method, path", REQUESTS)
def test_every_response_echoes_a_sane_request_id(client, ws, method, path):
    response = getattr(client, method)(path, headers={**ws.headers(), "X-Request-ID": "req-42.a:b/c"})
    assert response.headers["X-Request-ID"] == "req-42.a:b/c"
    if response.content_type == "application/problem+json":
        assert response.json["request_id"] == "req-42.a:b/c"


@pytest.mark.parametrize("method, path", REQUESTS)
def test_every_response_has_a_generated_request_id_when_none_is_sent(client, method, path):
    response = getattr(client, method)(path)
    assert len(response.headers["X-Request-ID"]) >= 16


@pytest.mark.parametrize("sent", ["has spaces", "x" * 500, "-leading-dash", "semi;colon", "ünïcode", "<script>"])
def test_an_insane_request_id_is_replaced_by_a_generated_one(client, sent):
    response = client.get("/nope", headers={"X-Request-ID": sent})
    generated = response.headers["X-Request-ID"]
    assert generated != sent and generated.isalnum() and len(generated) >= 16
    assert response.json["request_id"] == generated


# --- problem types ---------------------------------------------------------------------------

@pytest.mark.parametrize("code", CODES)
def test_every_code_has_a_page_at_its_type(client, code):
    response = client.get(f"/docs/api/problems/{code}")
    assert response.status_code == 200 and response.content_type.startswith("text/html")
    page = response.get_data(as_text=True)
    assert f"<code>{code}</code>" in page and str(CODES[code][0]) in page


def test_problem_type_is_a_page_of_the_service_itself(client):
    problem_type = client.get("/nope").json["type"]
    assert problem_type == "/docs/api/problems/not_found"
    assert client.get(problem_type).status_code == 200


@pytest.mark.parametrize("headers", [{"Host": "evil.test"}, {"X-Forwarded-Host": "evil.test"},
                                     {"X-Forwarded-Prefix": "/evil"}, {"Forwarded": "host=evil.test"}])
def test_problem_type_is_never_built_from_request_headers(client, headers):
    assert client.get("/nope", headers=headers).json["type"] == "/docs/api/problems/not_found"


def test_docs_url_setting_changes_the_type_base(make_app):
    client = make_app(api={"docs_url": "https://docs.example.com/leadsvc/"}).test_client()
    body = client.get("/nope", headers={"Host": "evil.test"}).json
    assert body["type"] == "https://docs.example.com/leadsvc/api/problems/not_found"


def test_the_problem_index_lists_every_code(client):
    page = client.get("/docs/api/problems/").get_data(as_text=True)
    assert all(f"/docs/api/problems/{code}" in page for code in CODES)
