"""examples/embed/host.py: the example host site keeps its pages and logging while the API serves under /crm."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import pytest

from conftest import config_for

HOST = Path(__file__).resolve().parent.parent / "examples" / "embed" / "host.py"


@pytest.fixture
def host(app, database_url):
    spec = importlib.util.spec_from_file_location("embed_host", HOST)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.create_host_app(config_for(database_url))


def test_host_keeps_its_own_pages_and_404(host):
    client = host.test_client()
    assert "Acme Realty" in client.get("/").get_data(as_text=True)
    missing = client.get("/no-such-page")
    assert missing.status_code == 404 and missing.mimetype == "text/html"
    assert "Page not found" in missing.get_data(as_text=True)


def test_api_under_the_prefix_answers_with_its_own_problems_and_docs(host, ws):
    client = host.test_client()
    listed = client.get("/crm/api/v1/leads", headers=ws.headers())
    assert listed.status_code == 200 and listed.json["data"] == []
    created = client.post("/crm/api/v1/leads", headers=ws.headers(), json={"phone": "+919876543210"})
    assert created.status_code == 201 and created.headers["Location"].startswith("/crm/api/v1/leads/ld_")
    missing = client.get("/crm/api/v1/nothing-here", headers=ws.headers())
    assert missing.status_code == 404 and missing.mimetype == "application/problem+json"
    assert missing.json["type"] == "/crm/docs/api/problems/not_found"
    assert client.get("/crm/docs").status_code == 200


def test_leadsvc_logs_through_the_hosts_handlers_and_installs_none(host, ws, caplog):
    client = host.test_client()
    with caplog.at_level(logging.INFO):
        client.get("/crm/api/v1/leads", headers={**ws.headers(), "X-Request-ID": "embed-check-1"})
        client.get("/crm/api/v1/nothing-here", headers=ws.headers())
    access = [r for r in caplog.records if r.name == "leadsvc.access"]
    assert [(r.route, r.status) for r in access] == [("/api/v1/leads", 200), ("(unmatched)", 404)]
    assert access[0].request_id == "embed-check-1"
    logger = logging.getLogger("leadsvc")
    assert logger.handlers == [] and logger.propagate, "the host's handlers decide where lines go"
    assert logging.getLogger("leadsvc.access").handlers == []
