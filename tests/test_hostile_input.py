"""Limits on everything a client controls: body size, strings, custom fields, page size, include,
headers, path parameters; hostile bytes are a 4xx problem, never a 500 or a stack trace."""

from __future__ import annotations

import hmac
import uuid

import pytest

from conftest import email_lead_body
from leadsvc import auth
from leadsvc.limits import MAX_HEADER_BYTES
from served import InProcessServer, call


def assert_problem(response, status, code, field=None):
    assert response.status_code == status, response.get_data(as_text=True)[:300]
    assert response.content_type == "application/problem+json"
    assert response.json["code"] == code
    if field is not None:
        assert field in response.json["errors"], response.json
    text = response.get_data(as_text=True)
    assert "Traceback" not in text and "SELECT" not in text


# --- body size -------------------------------------------------------------------------------

def test_a_body_over_the_limit_is_413(client, ws):
    body = email_lead_body(last_name="x" * 70_000)
    assert_problem(client.post("/api/v1/leads", json=body, headers=ws.headers()), 413, "payload_too_large")


def test_a_chunked_body_over_the_limit_is_413(app, ws):
    """Without Content-Length the limit still holds while the body streams in."""
    chunk = b'{"first_name": "' + b"x" * 80_000 + b'"}'
    with InProcessServer(app) as server:
        import http.client

        connection = http.client.HTTPConnection("127.0.0.1", int(server.url.rsplit(":", 1)[1]), timeout=30)
        connection.putrequest("POST", "/api/v1/leads")
        for name, value in {**ws.headers(), "Content-Type": "application/json", "Transfer-Encoding": "chunked"}.items():
            connection.putheader(name, value)
        connection.endheaders()
        connection.send(b"%x\r\n%s\r\n0\r\n\r\n" % (len(chunk), chunk))
        response = connection.getresponse()
        assert response.status == 413
        assert response.getheader("Content-Type") == "application/problem+json"
        connection.close()


def test_the_body_limit_is_configurable(make_app, ws):
    client = make_app(api={"max_body_bytes": 1024}).test_client()
    assert_problem(client.post("/api/v1/leads", json=email_lead_body(last_name="x" * 2000), headers=ws.headers()),
                   413, "payload_too_large")


# --- strings, custom fields, pages, include ----------------------------------------------------

@pytest.mark.parametrize("field, value", [
    ("first_name", "x" * 101), ("last_name", "x" * 101), ("email", "a" * 250 + "@x.test"),
    ("phone", "9" * 40),
], ids=["first_name", "last_name", "email", "phone"])
def test_strings_over_their_limits_are_422(client, ws, field, value):
    response = client.post("/api/v1/leads", json={**email_lead_body(), field: value}, headers=ws.headers())
    assert_problem(response, 422, "validation_failed", field)


def test_names_are_trimmed_before_their_length_is_checked(client, ws):
    response = client.post("/api/v1/leads", json=email_lead_body(first_name="  " + "x" * 100 + "  "),
                           headers=ws.headers())
    assert response.status_code == 201 and response.json["data"]["contact"]["first_name"] == "x" * 100


def test_at_most_50_custom_fields(client, ws):
    fields = {f"k{n}": "v" for n in range(51)}
    response = client.post("/api/v1/leads", json=email_lead_body(custom_fields=fields), headers=ws.headers())
    assert_problem(response, 422, "validation_failed", "custom_fields")


def test_custom_field_keys_and_text_values_have_limits(client, ws):
    long_key = client.post("/api/v1/leads", json=email_lead_body(custom_fields={"k" * 65: "v"}), headers=ws.headers())
    assert long_key.status_code == 422
    long_text = client.post("/api/v1/leads", json=email_lead_body(custom_fields={"notes_from_call": "x" * 501}),
                            headers=ws.headers())
    assert_problem(long_text, 422, "validation_failed", "custom_fields.notes_from_call")


@pytest.mark.parametrize("value", [1e308, -1e308, 10 ** 30])
def test_huge_custom_field_numbers_do_not_break_storage(client, ws, value):
    response = client.post("/api/v1/leads", json=email_lead_body(custom_fields={"family_size": value}),
                           headers=ws.headers())
    assert response.status_code in (201, 422)


@pytest.mark.parametrize("value", [1e308, -1.18e308, 1e16, -0.01])
def test_estimated_values_out_of_range_are_422(client, ws, value):
    response = client.post("/api/v1/leads", json=email_lead_body(estimated_value=value), headers=ws.headers())
    assert_problem(response, 422, "validation_failed", "estimated_value")


@pytest.mark.parametrize("size", ["0", "201", "-1", "1e3", "9" * 40, "ten"])
def test_page_size_outside_1_to_200_is_422(client, ws, size):
    assert_problem(client.get(f"/api/v1/leads?page[size]={size}", headers=ws.headers()), 422, "validation_failed",
                   "page[size]")


@pytest.mark.parametrize("include", ["bogus", "activities,bogus", "x" * 5000], ids=["bogus", "mixed", "huge"])
def test_unknown_include_is_422(client, ws, include):
    lead = client.post("/api/v1/leads", json=email_lead_body(), headers=ws.headers()).json["data"]["id"]
    response = client.get(f"/api/v1/leads/{lead}?include={include}", headers=ws.headers())
    assert_problem(response, 422, "validation_failed", "include")
    assert len(response.get_data()) < 2000, "the answer does not echo a huge input back"


def test_a_cursor_of_absurd_length_is_422(client, ws):
    response = client.get("/api/v1/leads?page[after]=" + "A" * 20_000, headers=ws.headers())
    assert_problem(response, 422, "validation_failed", "page[after]")


@pytest.mark.parametrize("route", ["", "/{lead}/transitions", "/{lead}/audit"])
def test_a_cursor_of_deeply_nested_json_is_422(client, ws, route):
    import base64

    lead = client.post("/api/v1/leads", json=email_lead_body(), headers=ws.headers()).json["data"]["id"]
    cursor = base64.urlsafe_b64encode(b"[" * 1000).rstrip(b"=").decode()
    response = client.get(f"/api/v1/leads{route.format(lead=lead)}?page[after]={cursor}", headers=ws.headers())
    assert_problem(response, 422, "validation_failed", "page[after]")


@pytest.mark.parametrize("moment", ["0001-01-01T00:00:00+00:01", "9999-12-31T23:59:59-14:00"])
def test_an_occurred_at_that_leaves_the_calendar_in_utc_is_422(client, ws, moment):
    lead = client.post("/api/v1/leads", json=email_lead_body(), headers=ws.headers()).json["data"]["id"]
    response = client.post(f"/api/v1/leads/{lead}/activities", json={"kind": "call", "summary": "x", "occurred_at": moment},
                           headers=ws.headers())
    assert_problem(response, 422, "validation_failed", "occurred_at")


# --- bytes a database cannot store ---------------------------------------------------------

@pytest.mark.parametrize("value", ["nul\u0000byte", "lone \ud800 surrogate"], ids=["nul", "surrogate"])
def test_strings_the_database_cannot_store_are_422(client, ws, value):
    raw = ('{"first_name": "%s", "email": "x.%s@example.com"}' % (value.encode("unicode_escape").decode()
                                                                   .replace("\\x00", "\\u0000"), uuid.uuid4().hex))
    response = client.post("/api/v1/leads", data=raw, content_type="application/json", headers=ws.headers())
    assert_problem(response, 422, "validation_failed", "first_name")


def test_nul_in_a_custom_field_value_is_422(client, ws):
    response = client.post("/api/v1/leads", json=email_lead_body(custom_fields={"notes_from_call": "a\u0000b"}),
                           headers=ws.headers())
    assert_problem(response, 422, "validation_failed", "custom_fields.notes_from_call")


def test_deeply_nested_json_is_422(client, ws):
    raw = '{"custom_fields": ' + "[" * 30_000 + "]" * 30_000 + "}"   # under the 64 KiB limit
    response = client.post("/api/v1/leads", data=raw, content_type="application/json", headers=ws.headers())
    assert_problem(response, 422, "validation_failed", "body")


def test_a_number_with_thousands_of_digits_is_422(client, ws):
    raw = '{"email": "a@x.test", "estimated_value": ' + "9" * 5000 + "}"
    response = client.post("/api/v1/leads", data=raw, content_type="application/json", headers=ws.headers())
    assert response.status_code == 422


def test_invalid_utf8_is_422(client, ws):
    response = client.post("/api/v1/leads", data=b'{"first_name": "\xff\xfe"}', content_type="application/json",
                           headers=ws.headers())
    assert_problem(response, 422, "validation_failed", "body")


# --- path parameters ---------------------------------------------------------------------------

@pytest.mark.parametrize("public_id", ["ld_" + "a" * 5000, "x" * 20_000, "ld_%00abc", "ld_abc%ff", "%F0%9F%92%A9",
                                       "ld_'%3B DROP TABLE lead;--", "99999999999999999999999"],
                         ids=["long-id", "huge", "nul", "bad-utf8", "emoji", "sql", "number"])
@pytest.mark.parametrize("method, suffix", [("GET", ""), ("PATCH", ""), ("POST", "/status")])
def test_absurd_path_parameters_are_404(client, ws, public_id, method, suffix):
    body = {"status": "st_" + "a" * 20} if suffix else {"first_name": "X"}
    response = client.open(f"/api/v1/leads/{public_id}{suffix}", method=method, json=body, headers=ws.headers())
    assert_problem(response, 404, "not_found")
    assert len(response.get_data()) < 2000, "the answer does not echo a huge input back"


# --- headers -----------------------------------------------------------------------------------

def test_headers_over_the_limit_are_431(client, ws):
    response = client.get("/api/v1/statuses", headers={**ws.headers(), "X-Padding": "x" * MAX_HEADER_BYTES})
    assert response.status_code == 431
    assert response.content_type == "application/problem+json"
    assert response.json["status"] == 431


def test_headers_within_the_limit_are_fine(client, ws):
    response = client.get("/api/v1/statuses", headers={**ws.headers(), "X-Padding": "x" * 8000})
    assert response.status_code == 200


@pytest.mark.parametrize("header", ["Bearer lsk_" + "A" * 10_000, "Bearer " + "\u00e9" * 100], ids=["long", "latin1"])
def test_an_absurd_authorization_header_is_401(client, header):
    response = client.get("/api/v1/statuses", headers={"Authorization": header})
    assert response.status_code == 401 and response.json["code"] == "unauthenticated"


def test_a_request_id_that_is_not_sane_is_replaced(client, ws):
    response = client.get("/api/v1/statuses", headers={**ws.headers(), "X-Request-ID": "x" * 500})
    assert response.headers["X-Request-ID"] != "x" * 500


def test_a_huge_header_through_waitress_gets_a_sane_answer_and_the_server_lives(app, ws):
    with InProcessServer(app) as server:
        huge = call(server.url, "GET", "/api/v1/statuses", headers={**ws.headers(), "X-Padding": "x" * 100_000})
        assert huge.status == 431
        beyond_waitress = call(server.url, "GET", "/api/v1/statuses",
                               headers={**ws.headers(), "X-Padding": "x" * 300_000})
        assert beyond_waitress.status == 431   # waitress's own plain-text answer
        assert call(server.url, "GET", "/api/v1/statuses", headers=ws.headers()).status == 200


def test_a_huge_made_up_method_through_waitress_is_a_501_problem_and_the_server_lives(app, ws):
    with InProcessServer(app) as server:
        for path in ("/nope", "/api/v1/leads"):
            reply = call(server.url, "Q" * 200_000, path, headers=ws.headers())
            assert reply.status == 501 and reply.headers["content-type"] == "application/problem+json"
            assert reply.json()["code"] == "not_implemented"
        assert call(server.url, "GET", "/api/v1/statuses", headers=ws.headers()).status == 200


# --- tokens ------------------------------------------------------------------------------------

def test_token_digests_are_compared_in_constant_time(client, ws, monkeypatch):
    compared, compare = [], hmac.compare_digest

    def spy(a, b):
        compared.append((a, b))
        return compare(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    assert client.get("/api/v1/statuses", headers=ws.headers()).status_code == 200
    assert compared and all(len(a) == len(b) == 64 for a, b in compared)
