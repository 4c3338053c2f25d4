"""Acceptance: the published contract holds from outside, against a real `leadsvc serve`.

schemathesis runs as its own process (`st run`, configured by schemathesis.toml) with every check
and every phase against a served demo workspace: a token, and ids that exist for the paths, are
all it is told. The budget is bounded (examples per operation, a fixed seed): it is part of every
test run, not an open-ended fuzzing session.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import WEBHOOK_TEST_ENV, bearer
from served import ServedProcess, call, clean_env, leadsvc

ROOT = Path(__file__).resolve().parent.parent
ST = Path(sys.executable).with_name("st")
MAX_EXAMPLES = 25   # per operation and phase
SEED = 20261124
METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}


@pytest.fixture
def served_demo(tmp_path):
    """`leadsvc serve` on a fresh SQLite database holding the demo workspace: (server, admin token)."""
    # Rate limits off: the run sends hundreds of requests a minute with one token.
    environment = {"LEADSVC_DATABASE_URL": f"sqlite:///{tmp_path}/live.sqlite3", "LEADSVC_RATE_LIMITS_ENABLED": "false",
                   **WEBHOOK_TEST_ENV}
    demo = json.loads(leadsvc(clean_env(**environment), tmp_path, "--config", os.devnull, "demo", "--json"))
    with ServedProcess(environment, tmp_path / "serve.log") as server:
        yield server, demo["tokens"]["admin@demo.test"]["token"]


def contract_ids(base: str, token: str) -> dict[str, str]:
    """What schemathesis.toml takes from the environment: the token, a lead, a form, a status, a
    webhook and one of its deliveries, two notes, a task, a job, a connector's, an intake's and a
    merge's ids, an agent, a token of another agent, and a third agent (to deactivate)."""
    headers = bearer(token)
    reply = call(base, "POST", "/api/v1/leads", headers=headers,
                 json_body={"first_name": "Live", "email": "live@contract.test"})
    status, created = reply.status, reply.json()
    assert status == 201, created
    forms = call(base, "GET", "/api/v1/forms", headers=headers).json()["data"]
    statuses = call(base, "GET", "/api/v1/statuses", headers=headers).json()["data"]
    hook, spare = (call(base, "POST", "/api/v1/webhooks", headers=headers,
                        json_body={"url": "http://127.0.0.1:9/live", "events": ["*"]}).json()
                   for _ in range(2))
    delivery = call(base, "POST", f"/api/v1/webhooks/{hook['data']['id']}/test", headers=headers).json()["data"]
    note, spare_note = (call(base, "POST", f"/api/v1/leads/{created['data']['id']}/notes", headers=headers,
                             json_body={"body": "Live"}).json() for _ in range(2))
    task = call(base, "POST", f"/api/v1/leads/{created['data']['id']}/tasks", headers=headers,
                json_body={"kind": "call", "title": "Live", "due_at": "2030-01-01T10:00:00Z"}).json()
    job = call(base, "POST", "/api/v1/leads/bulk", headers=headers, json_body={
        "action": "add_task", "ids": [created["data"]["id"]],
        "params": {"kind": "call", "title": "Live", "due_at": "2030-01-01T10:00:00Z"}}).json()
    members = call(base, "GET", "/api/v1/members", headers=headers).json()["data"]
    agent, other_agent, deactivated = [m["id"] for m in members if m["role"] == "agent"][:3]
    revocable = call(base, "POST", f"/api/v1/members/{other_agent}/tokens", headers=headers,
                     json_body={"name": "live", "abilities": ["leads:read"]}).json()["data"]["id"]
    return {"CONTRACT_TOKEN": token, "CONTRACT_LEAD": created["data"]["id"], "CONTRACT_FORM": forms[0]["id"],
            "CONTRACT_STATUS": next(s["id"] for s in statuses if s["name"] == "Contacted"),
            "CONTRACT_WEBHOOK": hook["data"]["id"], "CONTRACT_SPARE_WEBHOOK": spare["data"]["id"],
            "CONTRACT_DELIVERY": delivery["id"], "CONTRACT_NOTE": note["data"]["id"],
            "CONTRACT_SPARE_NOTE": spare_note["data"]["id"], "CONTRACT_TASK": task["data"]["id"],
            "CONTRACT_JOB": job["data"]["id"], "CONTRACT_DEACTIVATED_MEMBER": deactivated,
            # The demo has no connector: well-formed ids reach the routes' checks, and answer 404.
            "CONTRACT_CONNECTOR": "conn_" + "0" * 22, "CONTRACT_INTAKE": "in_" + "0" * 22,
            "CONTRACT_MEMBER": agent, "CONTRACT_REVOCABLE_TOKEN": revocable,
            # Nor a merge: a well-formed id reaches the undo's checks.
            "CONTRACT_MERGE": "mrg_" + "0" * 22}


@pytest.mark.slow
def test_schemathesis_from_outside_finds_no_failure(served_demo, tmp_path):
    server, token = served_demo
    # A bound, not a measure: the run grows with every operation, and a shared machine slows it.
    result = subprocess.run(
        [str(ST), "run", f"{server.url}/api/v1/openapi.json", "--checks", "all",
         "--phases", "examples,coverage,fuzzing,stateful", "--max-examples", str(MAX_EXAMPLES),
         "--seed", str(SEED), "--no-color"],
        cwd=ROOT, env={**clean_env(), **contract_ids(server.url, token)}, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-20000:] + result.stderr
    published = json.loads((ROOT / "schemas" / "openapi.json").read_text(encoding="utf-8"))
    operations = sum(method in METHODS for item in published["paths"].values() for method in item)
    summary = result.stdout[result.stdout.index("SUMMARY"):]
    assert f"Tested: {operations}" in summary, summary   # every operation of the document
