"""Every write is one transaction: a failure halfway leaves no trace."""

import pytest

from conftest import lead_body
from leadsvc import pipeline
from leadsvc.models import Activity, AuditEntry, Lead, Transition, Workspace


def counts(ws) -> dict[str, int]:
    workspace = Workspace.get(Workspace.public_id == ws.public_id).id
    return {model.__name__: model.select().where(model.workspace == workspace).count()
            for model in (Lead, Transition, Activity, AuditEntry)}


@pytest.fixture
def failing_history(monkeypatch):
    """The history of a new lead (transition, activities, audit entry) fails to be written, after
    the lead row."""
    def explode(lead, assignment, actor):
        assert Lead.select().where(Lead.id == lead.id).exists(), "the lead row is written first"
        raise RuntimeError("injected failure while writing the history")
    monkeypatch.setattr(pipeline, "_record_creation", explode)


def test_a_failure_after_the_lead_row_leaves_no_lead_transition_activity_or_audit(client, ws, failing_history):
    before = counts(ws)
    response = client.post("/api/v1/leads", json=lead_body(ws, email="ghost@example.com"), headers=ws.headers())
    assert response.status_code == 500 and response.json["code"] == "internal_error"
    assert "injected" not in response.get_data(as_text=True) and "Traceback" not in response.get_data(as_text=True)
    assert counts(ws) == before
    assert not Lead.select().where(Lead.email == "ghost@example.com").exists()


def test_a_failed_update_or_move_changes_nothing(client, make_lead, ws, monkeypatch):
    lead = make_lead(ws)
    before = counts(ws)
    monkeypatch.setattr(pipeline, "record_audit", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    assert client.patch(f"/api/v1/leads/{lead['id']}", json={"first_name": "Changed"},
                        headers=ws.headers()).status_code == 500
    assert client.post(f"/api/v1/leads/{lead['id']}/status", json={"status": ws.ids.statuses["Contacted"]},
                       headers=ws.headers()).status_code == 500
    assert counts(ws) == before
    row = Lead.get(Lead.public_id == lead["id"])
    assert (row.first_name, row.status_id, row.version) == ("Asha", Lead.get(Lead.public_id == lead["id"]).status_id, 1)
    assert client.get(f"/api/v1/leads/{lead['id']}", headers=ws.headers()).json["data"] == lead


def test_a_write_rechecks_the_scope_under_its_lock(client, make_lead, ws):
    """A lead reassigned between the view's lookup and the write's lock is no longer the caller's."""
    from leadsvc.auth import Caller
    from leadsvc.config import load_settings
    from leadsvc.history import Actor
    from leadsvc.problems import NotFound
    from leadsvc.refs import Refs
    lead = make_lead(ws)
    row = Lead.get(Lead.public_id == lead["id"])
    agent = next(ws.member(e) for e, m in ws.ids.members.items() if m == lead["owner"]["id"])
    caller = Caller(None, agent, agent.workspace, frozenset())
    actor = Actor(workspace=agent.workspace, member=agent, caller=caller)
    refs = Refs.load(agent.workspace, load_settings("/dev/null"))
    Lead.update(owner=None).where(Lead.id == row.id).execute()   # reassigned meanwhile
    with pytest.raises(NotFound):
        pipeline.update_lead(row, {"first_name": "Stale"}, actor, refs)
    with pytest.raises(NotFound):
        pipeline.move_status(row, ws.ids.statuses["Contacted"], None, actor, refs)
    assert Lead.get_by_id(row.id).first_name == "Asha"
