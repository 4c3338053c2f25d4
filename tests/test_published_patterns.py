"""The published document's string rules, read as JSON Schema reads them, are the service's rules.

JSON Schema's `pattern` is an ECMA-262 regular expression, and ECMA-262's `\\s` is not Python's:
Python also calls U+001C-U+001F and U+0085 whitespace and does not call U+FEFF so. Each test sends
values built around the characters where the two differ (and some more) and checks that the
service takes exactly those the published schema allows.
"""

from __future__ import annotations

import json
import re
import unicodedata
import uuid
from pathlib import Path
from urllib.parse import quote

import pytest

PUBLISHED = json.loads((Path(__file__).resolve().parent.parent / "schemas" / "openapi.json").read_text("utf-8"))

# ECMA-262 WhiteSpace (TAB, VT, FF, ZWNBSP and every Zs) and LineTerminator (LF, CR, LS, PS).
ECMA_SPACE = "\t\v\f\ufeff\n\r\u2028\u2029" + "".join(
    chr(code) for code in range(0x10000) if unicodedata.category(chr(code)) == "Zs")
PYTHON_SPACE = "".join(chr(code) for code in range(0x10000) if chr(code).isspace())
# Where the two kinds of whitespace differ, the rest of both, control characters, and plain text.
CHARACTERS = sorted(set(ECMA_SPACE + PYTHON_SPACE + "\x01\x1b\x7f\x9f\u200b\u00adx"))


def ecma_pattern(pattern: str) -> re.Pattern:
    """The pattern as an ECMA-262 engine reads it: \\s and \\S spelled out as ECMA-262 defines them
    (the rest of what the document uses reads the same in Python)."""
    space = "".join(f"\\u{ord(ch):04x}" for ch in ECMA_SPACE)
    out, in_class, i = [], False, 0
    while i < len(pattern):
        if pattern[i] == "\\":
            escape = pattern[i:i + 2]
            if escape == "\\s":
                out.append(space if in_class else f"[{space}]")
            elif escape == "\\S":
                assert not in_class, "\\S inside a class is not handled here"
                out.append(f"[^{space}]")
            else:
                out.append(escape)
            i += 2
            continue
        if pattern[i] == "[":
            in_class = True
        elif pattern[i] == "]":
            in_class = False
        out.append(pattern[i])
        i += 1
    return re.compile("".join(out))


def allowed(schema: dict, value: str) -> bool:
    """Whether a string schema of the published document takes the value."""
    if not schema.get("minLength", 0) <= len(value) <= schema.get("maxLength", len(value)):
        return False
    return "pattern" not in schema or ecma_pattern(schema["pattern"]).search(value) is not None


def body_property(operation_id: str, name: str) -> dict:
    operation = next(op for path in PUBLISHED["paths"].values() for op in path.values()
                     if isinstance(op, dict) and op.get("operationId") == operation_id)
    schema = operation["requestBody"]["content"]["application/json"]["schema"]
    if "$ref" in schema:
        schema = PUBLISHED["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema["properties"][name]


def query_parameter(operation_id: str, name: str) -> dict:
    operation = next(op for path in PUBLISHED["paths"].values() for op in path.values()
                     if isinstance(op, dict) and op.get("operationId") == operation_id)
    return next(p["schema"] for p in operation["parameters"] if p["name"] == name)


def mismatches(check, schema: dict, values: list[str]) -> list[str]:
    """The values the service and the published schema judge differently."""
    return [f"{value!r}: published {'allows' if allowed(schema, value) else 'refuses'}, service "
            f"{'takes' if check(value) else 'refuses'}"
            for value in values if check(value) != allowed(schema, value)]


# --- required texts: a note, a summary, a reason, a purpose ----------------------------------

def texts_around(ch: str) -> list[str]:
    return [ch, f" {ch} ", f"{ch}x{ch}"]


def email_only() -> dict:
    """The fields of a lead with a first name and a fresh e-mail, nothing else."""
    return {"last_name": None, "phone": None, "source": None, "email": f"asha.{uuid.uuid4().hex[:12]}@example.com"}


def answered(response, success: int) -> bool:
    assert response.status_code in (success, 422), response.get_data(as_text=True)[:300]
    return response.status_code == success


@pytest.mark.parametrize("operation_id, field", [
    ("addLeadNote", "body"), ("logLeadActivity", "summary"), ("eraseLead", "reason")])
def test_a_required_text_is_taken_exactly_when_the_published_schema_allows_it(client, make_lead, ws, operation_id,
                                                                             field):
    lead = make_lead(ws, **email_only())["id"]

    def takes(value: str) -> bool:
        nonlocal lead
        if operation_id == "addLeadNote":
            return answered(client.post(f"/api/v1/leads/{lead}/notes", json={"body": value}, headers=ws.headers()), 201)
        if operation_id == "logLeadActivity":
            return answered(client.post(f"/api/v1/leads/{lead}/activities", json={"kind": "meeting", "summary": value},
                                        headers=ws.headers()), 201)
        if answered(client.post(f"/api/v1/leads/{lead}/erase", json={"reason": value}, headers=ws.headers()), 200):
            lead = make_lead(ws, **email_only())["id"]   # an erased lead cannot be erased again
            return True
        return False

    values = [text for ch in CHARACTERS for text in texts_around(ch)]
    assert mismatches(takes, body_property(operation_id, field), values) == []


def test_a_consent_purpose_is_taken_exactly_when_the_published_schema_allows_it(client, ws):
    schema = PUBLISHED["components"]["schemas"]["ConsentGiven"]["properties"]["purpose"]

    def takes(value: str) -> bool:
        body = {"email": f"c.{uuid.uuid4().hex[:12]}@example.com", "consent": {"purpose": value}}
        return answered(client.post("/api/v1/leads", json=body, headers=ws.headers()), 201)

    assert mismatches(takes, schema, [text for ch in CHARACTERS for text in texts_around(ch)]) == []


def test_a_note_of_only_a_control_character_says_nothing_and_is_422(client, make_lead, ws):
    lead = make_lead(ws, **email_only())["id"]
    for body in ("\x1e", " \x1c\x1d\x1f ", "\x85", "\u2028", "\ufeff"):
        response = client.post(f"/api/v1/leads/{lead}/notes", json={"body": body}, headers=ws.headers())
        assert response.status_code == 422 and "body" in response.json["errors"], repr(body)


def test_text_is_trimmed_of_whitespace_and_keeps_what_is_not(client, make_lead, ws):
    lead = make_lead(ws, **email_only())["id"]
    response = client.post(f"/api/v1/leads/{lead}/notes", json={"body": "\ufeff\u3000 call back\x1e \n"},
                           headers=ws.headers())
    assert response.status_code == 201 and response.json["data"]["body"] == "call back\x1e"


# --- lists in the query: include, filters --------------------------------------------------------

def query_values(ch: str, item: str) -> list[str]:
    return [f"{item}{ch}", f"{ch}{item}", f"{item},{ch}{item}"]


@pytest.mark.parametrize("operation_id, name", [
    ("getLead", "include"), ("listLeads", "filter[score_band]"), ("listLeads", "filter[status]"),
    ("listLeads", "filter[created_at]"), ("exportLeads", "filter[source]"), ("listWebhookDeliveries", "filter[state]")])
def test_a_query_list_is_taken_exactly_when_the_published_schema_allows_it(client, make_lead, ws, operation_id, name):
    lead = make_lead(ws, **email_only())["id"]
    hook = client.post("/api/v1/webhooks", json={"url": "http://127.0.0.1:9/hook", "events": ["*"]},
                       headers=ws.headers()).json["data"]["id"]
    path, item = {
        "include": (f"/api/v1/leads/{lead}", "activities"),
        "filter[score_band]": ("/api/v1/leads", "hot"),
        "filter[status]": ("/api/v1/leads", ws.ids.statuses["New"]),
        "filter[created_at]": ("/api/v1/leads", "today"),
        "filter[source]": ("/api/v1/leads/export.csv", ws.ids.sources["Website"]),
        "filter[state]": (f"/api/v1/webhooks/{hook}/deliveries", "failed"),
    }[name]

    def takes(value: str) -> bool:
        return answered(client.get(f"{path}?{quote(name)}={quote(value)}", headers=ws.headers()), 200)

    values = [value for ch in CHARACTERS for value in query_values(ch, item)]
    assert mismatches(takes, query_parameter(operation_id, name), values) == []


@pytest.mark.parametrize("include", ["activities\x1f", "\x1cnotes", "activities,\x85notes", "notes\x00", "activities\x01"])
def test_an_include_holding_control_characters_is_422_naming_the_value(client, make_lead, ws, include):
    lead = make_lead(ws, **email_only())["id"]
    response = client.get(f"/api/v1/leads/{lead}?include={quote(include)}", headers=ws.headers())
    assert response.status_code == 422 and response.content_type == "application/problem+json"
    bad = next(part for part in include.split(",") if part not in ("activities", "notes"))
    assert repr(bad) in response.json["errors"]["include"][0], response.json


def test_an_include_with_whitespace_around_its_items_is_taken(client, make_lead, ws):
    lead = make_lead(ws, **email_only())["id"]
    client.post(f"/api/v1/leads/{lead}/notes", json={"body": "called"}, headers=ws.headers())
    spaced = quote(" activities ,\u3000notes\t")
    response = client.get(f"/api/v1/leads/{lead}?include={spaced}", headers=ws.headers())
    assert response.status_code == 200 and [n["body"] for n in response.json["data"]["notes"]] == ["called"]
    assert "activities" in response.json["data"]
