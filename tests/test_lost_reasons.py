"""Lost reasons: defined in setup, listed, required on moves to a lost status, kept on the transition
and the lead, counted in the conversion report."""

from __future__ import annotations

import json

import pytest

from conftest import standard_setup
from leadsvc.export import ATTRIBUTION_COLUMNS
from leadsvc.models import AuditEntry, Lead, Transition
from leadsvc.provision import apply_setup, parse_setup

REASONS = ["Budget too low", "Bought elsewhere", "Not reachable"]


def with_reasons(data):
    data["lost_reasons"] = [{"name": name} for name in REASONS]


@pytest.fixture
def lr_ws(make_workspace):
    return make_workspace(with_reasons)


def move(client, ws, lead_id, status, headers=None, **extra):
    return client.post(f"/api/v1/leads/{lead_id}/status", json={"status": ws.ids.statuses[status], **extra},
                       headers=headers or ws.headers())


def test_setup_creates_the_reasons_in_order_and_is_idempotent(lr_ws):
    assert list(lr_ws.ids.lost_reasons) == REASONS
    assert all(pid.startswith("lr_") for pid in lr_ws.ids.lost_reasons.values())
    data = standard_setup(_workspace_name(lr_ws))
    with_reasons(data)
    again = apply_setup(parse_setup(data))
    assert again.lost_reasons == lr_ws.ids.lost_reasons


def _workspace_name(ws):
    from leadsvc.models import Workspace

    return Workspace.get(Workspace.public_id == ws.public_id).name


def test_a_reason_named_twice_is_a_setup_error(app):
    from leadsvc.provision import SetupError

    data = standard_setup("Twice")
    data["lost_reasons"] = [{"name": "Price"}, {"name": "Price"}]
    with pytest.raises(SetupError, match=r"lost_reasons\[1\]\.name"):
        parse_setup(data)


def test_setup_json_prints_the_lost_reasons(run_cli, tmp_path):
    path = tmp_path / "ws.toml"
    path.write_text('[workspace]\nname = "Reasons JSON"\n[[statuses]]\nname = "New"\nkind = "open"\n'
                    '[[statuses]]\nname = "Lost"\nkind = "lost"\n'
                    '[[lost_reasons]]\nname = "Price"\n[[lost_reasons]]\nname = "Timing"\n')
    result = run_cli("setup", str(path), "--json")
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    assert list(printed["lost_reasons"]) == ["Price", "Timing"]
    assert all(pid.startswith("lr_") for pid in printed["lost_reasons"].values())


def test_the_lost_reasons_list_holds_the_workspace_reasons_in_order(client, lr_ws, ws):
    response = client.get("/api/v1/lost-reasons", headers=lr_ws.headers("n1@t.test"))
    assert response.status_code == 200
    assert [(r["name"], r["id"], r["position"]) for r in response.json["data"]] == [
        (name, lr_ws.ids.lost_reasons[name], i) for i, name in enumerate(REASONS, start=1)]
    assert response.json["meta"] == {"has_more": False}
    assert client.get("/api/v1/lost-reasons", headers=ws.headers()).json["data"] == [], "another workspace's"


def test_a_move_to_lost_needs_a_known_reason_when_the_workspace_has_reasons(client, make_lead, lr_ws):
    lead = make_lead(lr_ws)
    missing = move(client, lr_ws, lead["id"], "Lost")
    assert missing.status_code == 422 and "reason" in missing.json["errors"]
    assert REASONS[0] in missing.json["errors"]["reason"][0], "the message names the reasons"
    unknown = move(client, lr_ws, lead["id"], "Lost", reason="lr_0000000000000000")
    assert unknown.status_code == 422 and "reason" in unknown.json["errors"]
    malformed = move(client, lr_ws, lead["id"], "Lost", reason="Budget too low")
    assert malformed.status_code == 422 and "reason" in malformed.json["errors"]
    assert Lead.get(Lead.public_id == lead["id"]).status_id != lr_ws.ids.statuses["Lost"]
    assert Transition.select().join(Lead).where(Lead.public_id == lead["id"]).count() == 1, "nothing moved"


def test_a_reason_on_a_move_to_an_open_status_is_422(client, make_lead, lr_ws):
    lead = make_lead(lr_ws)
    response = move(client, lr_ws, lead["id"], "Contacted", reason=lr_ws.ids.lost_reasons["Budget too low"])
    assert response.status_code == 422 and "reason" in response.json["errors"]


def test_the_reason_is_kept_on_the_transition_and_the_lead_and_reopening_clears_the_leads(client, make_lead, lr_ws):
    lead = make_lead(lr_ws)
    reason = lr_ws.ids.lost_reasons["Bought elsewhere"]
    lost = move(client, lr_ws, lead["id"], "Lost", reason=reason, note="Went with a rival")
    assert lost.status_code == 200, lost.json
    expected = {"id": reason, "name": "Bought elsewhere"}
    assert lost.json["transition"]["lost_reason"] == expected
    assert lost.json["data"]["lost_reason"] == expected
    assert client.get(f"/api/v1/leads/{lead['id']}", headers=lr_ws.headers()).json["data"]["lost_reason"] == expected
    listed = client.get("/api/v1/leads", headers=lr_ws.headers()).json["data"]
    assert next(row for row in listed if row["id"] == lead["id"])["lost_reason"] == expected

    audit = AuditEntry.select().join(Lead).where(Lead.public_id == lead["id"]).order_by(AuditEntry.id.desc()).first()
    assert audit.changes["lost_reason"] == {"old": None, "new": reason}

    reopened = move(client, lr_ws, lead["id"], "New")
    assert reopened.status_code == 200
    assert reopened.json["data"]["lost_reason"] is None and reopened.json["transition"]["lost_reason"] is None
    history = client.get(f"/api/v1/leads/{lead['id']}/transitions", headers=lr_ws.headers()).json["data"]
    assert [t["lost_reason"] for t in history] == [None, expected, None], "the transition keeps it"


def test_without_reasons_a_move_to_lost_needs_none(client, make_lead, ws):
    lead = make_lead(ws)
    response = move(client, ws, lead["id"], "Lost")
    assert response.status_code == 200 and response.json["data"]["lost_reason"] is None
    assert response.json["transition"]["lost_reason"] is None
    other = make_lead(ws)
    assert move(client, ws, other["id"], "Lost", reason="lr_0000000000000000").status_code == 422


def test_a_reason_added_by_setup_is_usable_at_once(client, make_lead, ws):
    lead = make_lead(ws)
    client.get("/api/v1/statuses", headers=ws.headers())   # the reference data is cached now
    data = standard_setup(_workspace_name(ws))
    data["lost_reasons"] = [{"name": "Late"}]
    added = apply_setup(parse_setup(data)).lost_reasons["Late"]
    assert move(client, ws, lead["id"], "Lost").status_code == 422, "the workspace has reasons now"
    assert move(client, ws, lead["id"], "Lost", reason=added).status_code == 200


def test_the_conversion_report_counts_lost_leads_by_reason_in_scope(client, make_lead, lr_ws):
    budget, elsewhere = lr_ws.ids.lost_reasons["Budget too low"], lr_ws.ids.lost_reasons["Bought elsewhere"]
    north = [make_lead(lr_ws) for _ in range(3)]
    south = make_lead(lr_ws)
    client.patch(f"/api/v1/leads/{south['id']}", json={"owner": lr_ws.ids.members["s1@t.test"]},
                 headers=lr_ws.headers())
    for lead in north[:3]:
        client.patch(f"/api/v1/leads/{lead['id']}", json={"owner": lr_ws.ids.members["n1@t.test"]},
                     headers=lr_ws.headers())
    for lead, reason in ((north[0], budget), (north[1], budget), (north[2], elsewhere), (south, elsewhere)):
        assert move(client, lr_ws, lead["id"], "Lost", reason=reason).status_code == 200
    assert move(client, lr_ws, north[2]["id"], "New").status_code == 200   # re-opened: no longer lost

    def counts(headers):
        report = client.get("/api/v1/reports/conversion", headers=headers)
        assert report.status_code == 200
        return [(row["lost_reason"]["name"] if row["lost_reason"] else None, row["count"])
                for row in report.json["data"]["by_lost_reason"]]

    assert counts(lr_ws.headers()) == [("Budget too low", 2), ("Bought elsewhere", 1), ("Not reachable", 0)]
    assert counts(lr_ws.headers("nmgr@t.test")) == [("Budget too low", 2), ("Bought elsewhere", 0),
                                                    ("Not reachable", 0)], "the North manager's team only"


def test_lost_leads_without_a_reason_are_counted_apart(client, make_lead, ws):
    lead = make_lead(ws)
    assert move(client, ws, lead["id"], "Lost").status_code == 200
    report = client.get("/api/v1/reports/conversion", headers=ws.headers()).json["data"]
    assert report["by_lost_reason"] == [{"lost_reason": None, "count": 1}]
    assert report["overall"]["lost"] == 1


def test_the_export_shows_the_lost_reason_after_the_fixed_columns_and_imports_back_as_it_is(
        client, make_lead, lr_ws, make_workspace, database_url, tmp_path):
    import csv
    import io
    import os

    from click.testing import CliRunner

    from leadsvc.cli import cli

    lost, still_open = make_lead(lr_ws), make_lead(lr_ws)
    assert move(client, lr_ws, lost["id"], "Lost", reason=lr_ws.ids.lost_reasons["Not reachable"]).status_code == 200
    export = client.get("/api/v1/leads/export.csv", headers=lr_ws.headers())
    assert export.status_code == 200
    text = export.get_data(as_text=True)
    header = next(csv.reader(io.StringIO(text)))
    assert "lost_reason" in header, header
    assert header.index("lost_reason") == header.index("last_activity_at") + 1, "after the fixed columns"
    assert header.index("next_task_due_at") == header.index("lost_reason") + 1, "then the next task's due time"
    after = header[header.index("next_task_due_at") + 1:]
    assert after[:len(ATTRIBUTION_COLUMNS)] == list(ATTRIBUTION_COLUMNS), "then the attribution"
    assert after[len(ATTRIBUTION_COLUMNS):] == ["product_interest", "budget_confirmed", "family_size",
                                                "site_visit_on", "notes_from_call"], "custom fields follow"
    rows = {row["id"]: row for row in csv.DictReader(io.StringIO(text))}
    assert rows[lost["id"]]["lost_reason"] == "Not reachable" and rows[still_open["id"]]["lost_reason"] == ""

    other = make_workspace()
    path = tmp_path / "export.csv"
    path.write_text(text, encoding="utf-8")
    result = CliRunner().invoke(cli, ["--config", os.devnull, "import", str(path), "--workspace", other.public_id,
                                      "--json"], env={"LEADSVC_DATABASE_URL": database_url}, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["created"] == 2 and report["errors"] == [], report
