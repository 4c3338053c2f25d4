"""CSV import (through the API's create path) and export (the caller's scope, read in chunks)."""

from __future__ import annotations

import csv
import io
import json

import pytest

from conftest import ROLE_EMAILS, run_import
from leadsvc.models import Activity, Lead, Team

HEADER = ["first_name", "last_name", "phone", "email", "source", "estimated_value",
          "product_interest", "budget_confirmed", "family_size", "site_visit_on"]
EXISTING = 40
ROWS = 10_000


def write_csv(path, header, rows):
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        writer.writerows(rows)


def existing_leads(client, ws, count):
    headers = ws.headers()
    for i in range(count):
        response = client.post("/api/v1/leads", headers=headers,
                               json={"first_name": f"Old{i}", "phone": f"+917000000{i:03d}",
                                     "email": f"old{i}@t.test"})
        assert response.status_code == 201


# Bad rows: (what is wrong, the cells to change, the fields the report must name)
BAD_KINDS = [
    ("phone", {"phone": "12345"}, ["phone"]),
    ("email", {"email": "not-an-email"}, ["email"]),
    ("source", {"source": "Billboard"}, ["source"]),
    ("value", {"estimated_value": "lots"}, ["estimated_value"]),
    ("choice", {"product_interest": "castle"}, ["custom_fields.product_interest"]),
    ("boolean", {"budget_confirmed": "maybe"}, ["custom_fields.budget_confirmed"]),
    ("contact", {"phone": "", "email": ""}, ["email", "phone"]),
    ("date", {"site_visit_on": "31/12/2026"}, ["custom_fields.site_visit_on"]),
]


def planted_file(path, website_id):
    """10,000 rows: good ones, duplicates of existing leads and of earlier rows, and bad rows.

    Returns what the report must say: created count, {row: (first_row, matched_on)} for
    duplicates, and {row: fields} for failures.
    """
    rows, duplicates, failures = [], {}, {}
    for i in range(ROWS):
        row_number = i + 2   # the header is row 1
        cells = {"first_name": f"Imp{i}", "last_name": "Row", "phone": f"+9198{i:08d}",
                 "email": f"imp{i}@import.test", "source": ["Website", "referral", website_id][i % 3],
                 "estimated_value": "2,50,000", "product_interest": ["villa", "2bhk", ""][i % 3],
                 "budget_confirmed": ["yes", "no"][i % 2], "family_size": str(i % 6 + 1),
                 "site_visit_on": "2026-12-01" if i % 5 == 0 else ""}
        slot = i % 100
        if slot == 7:        # the same phone, or only the same e-mail, as a lead already there
            old = (i // 100) % EXISTING
            if i % 200 == 7:
                cells.update(phone=f"+917000000{old:03d}")
                duplicates[row_number] = (None, ["phone"])
            else:
                cells.update(phone="", email=f"OLD{old}@t.test")
                duplicates[row_number] = (None, ["email"])
        elif slot == 53:     # a row of this file, ten rows up
            earlier = rows[i - 10]
            if i % 200 == 53:
                cells.update(phone=earlier["phone"].replace("+91", "0"), email="")
                duplicates[row_number] = (row_number - 10, ["phone"])
            else:
                cells.update(phone=f"+9170{i:08d}", email=earlier["email"])
                duplicates[row_number] = (row_number - 10, ["email"])
        elif slot in (21, 89):
            kind, change, fields = BAD_KINDS[(i // 50) % len(BAD_KINDS)]
            cells.update({"phone": f"+9170{i:08d}", **change})
            failures[row_number] = fields
        elif i == 4:
            cells["first_name"] = "=HYPERLINK(\"http://evil.test\")"
        rows.append(cells)
    write_csv(path, HEADER, [[cells[name] for name in HEADER] for cells in rows])
    return ROWS - len(duplicates) - len(failures), duplicates, failures


def export_rows(client, headers, query=""):
    response = client.get(f"/api/v1/leads/export.csv{query}", headers=headers)
    assert response.status_code == 200 and response.mimetype == "text/csv"
    return list(csv.DictReader(io.StringIO(response.get_data(as_text=True))))


@pytest.mark.slow
def test_import_of_10000_rows_reports_duplicates_and_bad_rows_exactly_and_export_follows_scope(
        client, ws, database_url, tmp_path):
    existing_leads(client, ws, EXISTING)
    website = next(s for s in client.get("/api/v1/sources", headers=ws.headers()).json["data"]
                   if s["name"] == "Website")
    path = tmp_path / "leads.csv"
    created, duplicates, failures = planted_file(path, website["id"])

    result = run_import(database_url, path, ws.public_id, "--json")
    report = json.loads(result.stdout)

    assert result.exit_code == 1, "some rows failed"
    assert (report["rows"], report["created"], report["duplicates"], report["failed"]) == (
        ROWS, created, len(duplicates), len(failures))
    assert created == 9_600
    assert {d["row"]: (d["first_row"], d["matched_on"]) for d in report["duplicate_rows"]} == duplicates
    reported = {}
    for error in report["errors"]:
        reported.setdefault(error["row"], []).append(error["field"])
        assert error["message"]
    assert {row: sorted(fields) for row, fields in reported.items()} == failures

    # Nothing created twice: the workspace holds the old leads plus one per created row.
    leads = Lead.select().where(Lead.workspace == ws.member("admin@t.test").workspace_id)
    assert leads.count() == EXISTING + created
    imported = Activity.select().where((Activity.kind == "created") & (Activity.data["via"] == "import"))
    assert imported.where(Activity.lead.in_(leads)).count() == created
    assert not imported.where(Activity.lead.in_(leads) & Activity.actor_token.is_null(False)).exists(), \
        "the actor is the system"

    # Export: each role gets exactly its scope.
    agent, manager = ws.member(ROLE_EMAILS["agent"]), ws.member(ROLE_EMAILS["manager"])
    scopes = {"admin": leads, "manager": leads.where(Lead.team == manager.team_id),
              "agent": leads.where(Lead.owner == agent.id)}
    for role, email in ROLE_EMAILS.items():
        rows = export_rows(client, ws.headers(email, ("leads:read",)))
        assert len(rows) == len({row["id"] for row in rows}), "no lead twice across chunks"
        assert {row["id"] for row in rows} == {lead.public_id for lead in scopes[role]}, role
    agent_rows = export_rows(client, ws.headers(ROLE_EMAILS["agent"], ("leads:read",)))
    assert agent_rows and {row["owner_email"] for row in agent_rows} == {ROLE_EMAILS["agent"]}
    north = Team.get_by_id(manager.team_id).name
    assert {row["team"] for row in export_rows(client, ws.headers(ROLE_EMAILS["manager"]))} == {north}

    # Cells a spreadsheet would run as formulas are defused; E.164 phones stay as they are.
    formula = next(row for row in export_rows(client, ws.headers(), "?filter[score_band]=hot,warm,cold")
                   if row["last_name"] == "Row" and row["first_name"].startswith("'"))
    assert formula["first_name"] == "'=HYPERLINK(\"http://evil.test\")" and formula["phone"] == "+919800000004"


@pytest.mark.parametrize("header,message", [
    (["first_name", "phone", "colour"], "Unknown columns: colour"),
    (["first_name", "last_name"], "needs a phone or an email column"),
    (["phone", "Phone"], "more than once: phone"),
])
def test_a_bad_header_imports_nothing_and_says_why(client, ws, database_url, tmp_path, header, message):
    path = tmp_path / "bad.csv"
    write_csv(path, header, [["+919876543210"] * len(header)])
    result = run_import(database_url, path, ws.public_id)
    assert result.exit_code == 1 and message in result.stderr and "Nothing was imported" in result.stderr
    assert client.get("/api/v1/leads", headers=ws.headers()).json["data"] == []


def test_import_prints_a_readable_report_and_running_it_again_creates_nothing(client, ws, database_url, tmp_path):
    path = tmp_path / "small.csv"
    write_csv(path, ["first_name", "phone", "email", "source", "family_size"],
              [["Asha", "98765 43210", "", "website", "3"], ["Ravi", "", "RAVI@x.test", "", ""],
               ["Bad", "123", "", "Billboard", "many"], ["Asha again", "+919876543210", "", "", ""]])
    first = run_import(database_url, path, ws.public_id)
    assert first.exit_code == 1
    assert "4 rows, 2 created, 1 duplicates (not created), 1 failed" in first.stdout
    assert "row 5: duplicate of ld_" in first.stdout and "created from row 2 of this file" in first.stdout
    assert "row 4, phone: Enter a valid Indian mobile number" in first.stdout
    assert "row 4, source: Unknown source 'Billboard'" in first.stdout and "row 4, custom_fields.family_size" in first.stdout
    again = json.loads(run_import(database_url, path, ws.public_id, "--json").stdout)
    assert (again["created"], again["duplicates"], again["failed"], len(again["errors"])) == (0, 3, 1, 3)
    lead = client.get("/api/v1/leads?filter[source]=" + ",".join(
        s["id"] for s in client.get("/api/v1/sources", headers=ws.headers()).json["data"]), headers=ws.headers())
    assert [row["contact"]["phone"] for row in lead.json["data"]] == ["+919876543210"]
    assert lead.json["data"][0]["custom_fields"] == {"family_size": 3}


def test_import_needs_an_existing_workspace(database_url, tmp_path):
    path = tmp_path / "x.csv"
    write_csv(path, ["phone"], [["+919876543210"]])
    result = run_import(database_url, path, "ws_" + "x" * 20)
    assert result.exit_code == 1 and "No workspace ws_xxxx" in result.stderr


def test_export_csv_is_not_taken_for_a_lead_id_and_needs_leads_read(client, ws):
    assert client.get("/api/v1/leads/export.csv").status_code == 401
    denied = client.get("/api/v1/leads/export.csv", headers=ws.headers(abilities=("leads:create",)))
    assert denied.status_code == 403 and "leads:read" in denied.json["detail"]
    response = client.get("/api/v1/leads/export.csv", headers=ws.headers())
    assert response.status_code == 200 and response.mimetype == "text/csv"
    assert response.headers["Content-Disposition"].startswith("attachment;")


def test_export_takes_the_list_filters_and_an_unknown_filter_gives_the_header_only(client, ws):
    headers = ws.headers()
    for i in range(3):
        client.post("/api/v1/leads", headers=headers, json={"phone": f"+91987654321{i}"})
    owners = {row["owner"] for row in export_rows(client, headers)}
    one = client.get("/api/v1/members", headers=headers).json["data"]
    agent_id = next(m["id"] for m in one if m["email"] == "n1@t.test")
    assert {row["owner_email"] for row in export_rows(client, headers, f"?filter[owner]={agent_id}")} == {"n1@t.test"}
    assert len(owners) == 3
    unknown = client.get("/api/v1/leads/export.csv?filter[colour]=red", headers=headers)
    assert unknown.status_code == 200 and unknown.headers["X-Unknown-Filters"] == "filter[colour]"
    assert unknown.get_data(as_text=True).count("\n") == 1
    bad = client.get("/api/v1/leads/export.csv?filter[status]=New", headers=headers)
    assert bad.status_code == 422 and "filter[status]" in bad.json["errors"]


def test_an_export_while_every_export_writer_is_busy_is_a_429_to_retry_in_seconds(make_app, ws):
    app = make_app(server={"threads": 2}, rate_limits={"enabled": True})   # one writer: half the threads
    writers = app.extensions["leadsvc.export_writers"]
    assert writers.acquire(blocking=False)   # as an export being written
    try:
        busy = app.test_client().get("/api/v1/leads/export.csv", headers=ws.headers())
    finally:
        writers.release()
    assert busy.status_code == 429 and busy.json["code"] == "rate_limited"
    assert busy.headers["Retry-After"] == "5"   # its own wait, not the rate limit's window
    assert app.test_client().get("/api/v1/leads/export.csv", headers=ws.headers()).status_code == 200


def test_export_is_documented_as_text_csv(client):
    spec = client.get("/api/v1/openapi.json").json
    operation = spec["paths"]["/api/v1/leads/export.csv"]["get"]
    assert "text/csv" in operation["responses"]["200"]["content"]
    assert {p["name"] for p in operation["parameters"]} >= {"filter[status]", "filter[created_at]", "sort"}


def test_head_of_the_export_answers_its_headers_without_writing_the_export(client, ws, monkeypatch, live_server):
    from leadsvc import export
    from served import call

    exports = []
    write = export.written
    monkeypatch.setattr(export, "written", lambda rows: exports.append(1) or write(rows))
    head = client.head("/api/v1/leads/export.csv", headers=ws.headers())
    assert head.status_code == 200 and head.mimetype == "text/csv" and head.get_data() == b""
    assert head.headers["Content-Disposition"].startswith('attachment; filename="leads-')
    assert "Content-Length" not in head.headers, "a HEAD may leave it out; it must not be a wrong one"
    assert exports == [], "nothing was written"
    unknown = client.head("/api/v1/leads/export.csv?filter[colour]=red", headers=ws.headers())
    assert unknown.status_code == 200 and unknown.headers["X-Unknown-Filters"] == "filter[colour]"
    assert client.head("/api/v1/leads/export.csv?filter[status]=New", headers=ws.headers()).status_code == 422
    assert client.head("/api/v1/leads/export.csv").status_code == 401
    assert client.get("/api/v1/leads/export.csv", headers=ws.headers()).status_code == 200 and exports == [1]

    served = call(live_server, "HEAD", "/api/v1/leads/export.csv", headers=ws.headers())
    assert served.status == 200 and served.body == b"" and served.headers["content-type"].startswith("text/csv")
    assert exports == [1], "through waitress neither"


def test_head_of_the_export_needs_no_export_writer(make_app, ws):
    app = make_app()
    writers = app.extensions["leadsvc.export_writers"]
    held = 0
    while writers.acquire(blocking=False):   # as exports being written on every writer
        held += 1
    try:
        client = app.test_client()
        assert client.get("/api/v1/leads/export.csv", headers=ws.headers()).status_code == 429
        assert client.head("/api/v1/leads/export.csv", headers=ws.headers()).status_code == 200
    finally:
        for _ in range(held):
            writers.release()
