"""Acceptance 4: schemathesis against the OpenAPI document, in-process, on both backends.

Bounded and reproducible: a fixed number of fuzzed examples per operation, derandomized, no
example database; plus schemathesis' deterministic coverage and examples phases. Every request
carries a real admin token (`ignored_auth` then checks that the same request without it, or with a
made-up one, is refused). Well-formed ids in generated requests are mostly swapped for ids that
exist in the workspace, so that the success paths are fuzzed too, not only "unknown id" answers.
schemathesis.toml (the same as for the run from outside, tests/test_openapi_live.py) names what
the service may refuse that the document cannot say, and takes the token and ids from the
environment.
"""

from __future__ import annotations

import re
import uuid
import zlib
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from conftest import intake_fixture, with_connectors
from leadsvc.auth import issue_token


schema = schemathesis.pytest.from_fixture("api_schema")
PUBLIC_ID = re.compile(r"^(ld|src|st|mem|team|cf)_[0-9A-Za-z]{16,40}$")


def with_form(data):
    data["forms"] = [{"name": "Enquiry", "source": "Website"}]
    with_connectors(data)


@pytest.fixture
def ws(make_workspace):
    """The fuzzed workspace: the standard one, with a web form."""
    return make_workspace(with_form)


@pytest.fixture
def api_schema(app, ws, real_ids, monkeypatch):
    for name, value in {"CONTRACT_TOKEN": ws.token(), "CONTRACT_LEAD": real_ids["ld"][0],
                        "CONTRACT_FORM": ws.ids.forms["Enquiry"], "CONTRACT_STATUS": ws.ids.statuses["Contacted"],
                        "CONTRACT_WEBHOOK": real_ids["webhook"][0], "CONTRACT_SPARE_WEBHOOK": real_ids["webhook"][1],
                        "CONTRACT_DELIVERY": real_ids["delivery"][0], "CONTRACT_NOTE": real_ids["note"][0],
                        "CONTRACT_SPARE_NOTE": real_ids["note"][1], "CONTRACT_TASK": real_ids["task"][0],
                        "CONTRACT_CONNECTOR": real_ids["connector"][0], "CONTRACT_INTAKE": real_ids["intake"][0],
                        "CONTRACT_MEMBER": real_ids["agent"][0], "CONTRACT_REVOCABLE_TOKEN": real_ids["token"][0],
                        "CONTRACT_MERGE": real_ids["merge"][0], "CONTRACT_JOB": real_ids["job"][0],
                        "CONTRACT_DEACTIVATED_MEMBER": real_ids["agent"][1]}.items():
        monkeypatch.setenv(name, value)
    return schemathesis.openapi.from_wsgi("/api/v1/openapi.json", app)


@pytest.fixture
def real_ids(client, ws) -> dict[str, list[str]]:
    """Ids that exist in the fuzzed workspace, by prefix."""
    leads = [client.post("/api/v1/leads", json={"first_name": "Fuzz", "email": f"fuzz{n}.{uuid.uuid4().hex}@x.test"},
                         headers=ws.headers()).json["data"]["id"] for n in range(3)]
    hook, spare = (client.post("/api/v1/webhooks", json={"url": "http://127.0.0.1:9/fuzz", "events": ["*"]},
                               headers=ws.headers()).json["data"]["id"] for _ in range(2))
    delivery = client.post(f"/api/v1/webhooks/{hook}/test", headers=ws.headers()).json["data"]["id"]
    notes = [client.post(f"/api/v1/leads/{leads[0]}/notes", json={"body": "Fuzz"}, headers=ws.headers()).json["data"]["id"]
             for _ in range(2)]
    task = client.post(f"/api/v1/leads/{leads[0]}/tasks", json={"kind": "call", "title": "Fuzz",
                                                                 "due_at": "2030-01-01T10:00:00Z"},
                       headers=ws.headers()).json["data"]["id"]
    # A merge of two leads of their own (the fuzzed ones stay leads), for the undo.
    pair = [client.post("/api/v1/leads", json={"first_name": "Fuzz", "email": f"merge{n}.{uuid.uuid4().hex}@x.test"},
                        headers=ws.headers()).json["data"]["id"] for n in range(2)]
    merge = client.post(f"/api/v1/leads/{pair[0]}/merge", json={"duplicates": [pair[1]]},
                        headers=ws.headers()).json["merge"]["id"]
    job = client.post("/api/v1/leads/bulk", json={"action": "add_task", "ids": [leads[0]], "params": {
        "kind": "call", "title": "Fuzz", "due_at": "2030-01-01T10:00:00Z"}}, headers=ws.headers()).json["data"]["id"]
    indiamart = ws.ids.connectors["IndiaMART"]
    landline = intake_fixture("indiamart_push")
    landline["RESPONSE"]["SENDER_MOBILE"] = "+91-11-23456789"   # a rejected intake, which a retry runs again
    intake = client.post(f"{indiamart['url']}/{indiamart['key']}", json=landline).json["data"]["intakes"][0]
    ids = ws.ids
    # Member routes take agents (the run's own admin stays an admin); the revoke another agent's token.
    agents = [ids.members[email] for email in ("n1@t.test", "n2@t.test", "s1@t.test")]
    token = issue_token(ws.member("s1@t.test"), ["leads:read"], name="fuzz")[0].public_id
    return {"agent": agents, "token": [token], "connector": [indiamart["id"]], "intake": [intake], "ld": leads, "src": list(ids.sources.values()), "st": list(ids.statuses.values()),
            "mem": list(ids.members.values()), "team": list(ids.teams.values()),
            "cf": list(ids.custom_fields.values()), "webhook": [hook, spare], "delivery": [delivery],
            "note": notes, "task": [task], "merge": [merge], "job": [job]}


def pick(value: str, choices: list[str]) -> str:
    """Three times in four one of the choices, chosen by the value (so the run stays reproducible)."""
    n = zlib.crc32(value.encode())
    return choices[n % len(choices)] if n % 4 and choices else value


def grounded(value: Any, real_ids: dict[str, list[str]]) -> Any:
    """The value with most well-formed public ids in it replaced by real ones."""
    if isinstance(value, str) and (match := PUBLIC_ID.match(value)):
        return pick(value, real_ids[match.group(1)])
    if isinstance(value, dict):
        return {key: grounded(item, real_ids) for key, item in value.items()}
    if isinstance(value, list):
        return [grounded(item, real_ids) for item in value]
    return value


@schema.parametrize()
@settings(max_examples=25, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
def test_api_conforms_to_its_openapi_document(case, ws, real_ids):
    path_id = (case.path_parameters or {}).get("public_id")
    if isinstance(path_id, str) and PUBLIC_ID.match(path_id):   # a malformed id stays: it must be refused
        case.path_parameters["public_id"] = pick(path_id, real_ids["agent" if path_id.startswith("mem_") else "ld"])
    if isinstance(case.body, (dict, list)):
        case.body = grounded(case.body, real_ids)
    case.call_and_validate(headers=ws.headers())   # tests/contract_hooks.py makes Idempotency-Keys fresh
