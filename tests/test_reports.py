"""Reports against a hand-computed pipeline: seven leads moved through known stages at known times.

The leads come from conftest's `pipeline_data`, which describes them.
"""

import pytest

H = 3600
PIPELINE = ["New", "Contacted", "Qualified", "Proposal", "Won", "Lost"]


def report(client, tenant, name, email="admin@t.test", **params):
    response = client.get(f"/api/v1/reports/{name}", query_string=params, headers=tenant.headers(email))
    assert response.status_code == 200, response.json
    return response.json["data"]


def funnel_table(data):
    return [(s["status"]["name"], s["reached"], s["conversion"]) for s in data["stages"]]


# --- funnel ----------------------------------------------------------------------------------

def test_funnel_counts_each_lead_once_per_status_reached(client, ws, pipeline_data):
    data = report(client, ws, "funnel")
    assert data["leads"] == 7
    assert funnel_table(data) == [
        ("New", 7, None),                 # L4 entered New twice and counts once
        ("Contacted", 6, 0.8571),         # 6 / 7
        ("Qualified", 3, 0.5),            # 3 / 6
        ("Proposal", 2, 0.6667),          # 2 / 3
        ("Won", 2, 1.0),                  # 2 / 2
        ("Lost", 3, None),                # lost stages have no step conversion
    ]


@pytest.mark.only_on("postgresql")
def test_the_funnel_sorts_in_more_memory_for_its_own_query_only(client, ws, pipeline_data, monkeypatch):
    from leadsvc.db import database
    from leadsvc.reports import FUNNEL_WORK_MEM

    default = database.execute_sql("SHOW work_mem").fetchone()[0]
    seen = []
    run = type(database.obj).execute_sql

    def spy(self, sql, params=None, *args, **kwargs):
        cursor = run(self, sql, params, *args, **kwargs)
        if "COUNT(DISTINCT" in sql:
            seen.append(run(self, "SHOW work_mem").fetchone()[0])
        return cursor

    monkeypatch.setattr(type(database.obj), "execute_sql", spy)
    assert funnel_table(report(client, ws, "funnel"))[0] == ("New", 7, None)
    assert seen == [FUNNEL_WORK_MEM] != [default]
    monkeypatch.undo()
    assert database.execute_sql("SHOW work_mem").fetchone()[0] == default   # SET LOCAL ended with its transaction


def test_funnel_of_a_manager_counts_only_its_team(client, ws, pipeline_data):
    data = report(client, ws, "funnel", "nmgr@t.test")
    assert data["leads"] == 5             # L1, L2, L3, L4, L7
    assert funnel_table(data) == [("New", 5, None), ("Contacted", 5, 1.0), ("Qualified", 2, 0.4),
                                  ("Proposal", 2, 1.0), ("Won", 2, 1.0), ("Lost", 2, None)]
    south = report(client, ws, "funnel", "smgr@t.test")
    assert south["leads"] == 2 and funnel_table(south)[0] == ("New", 2, None)


def test_funnel_filtered_by_owner_with_an_empty_step(client, ws, pipeline_data):
    data = report(client, ws, "funnel", **{"filter[owner]": ws.ids.members["s1@t.test"]})
    assert funnel_table(data) == [("New", 2, None), ("Contacted", 1, 0.5), ("Qualified", 1, 1.0),
                                  ("Proposal", 0, 0.0), ("Won", 0, None), ("Lost", 1, None)]


# --- velocity --------------------------------------------------------------------------------

def velocity_table(data):
    return {s["status"]["name"]: (s["count"], s["median_seconds"], s["p90_seconds"]) for s in data["stages"]}


def test_velocity_is_the_nearest_rank_median_and_p90_of_time_in_status(client, ws, pipeline_data):
    data = report(client, ws, "velocity")
    assert [s["status"]["name"] for s in data["stages"]] == PIPELINE
    assert velocity_table(data) == {
        "New": (7, 4 * H, 10 * H),        # 1 2 2 4 6 8 10: ranks 4 and 7
        "Contacted": (4, 4 * H, 8 * H),   # 2 4 6 8: ranks 2 and 4
        "Qualified": (3, 6 * H, 10 * H),  # 4 6 10: ranks 2 and 3
        "Proposal": (2, 8 * H, 12 * H),   # 8 12: ranks 1 and 2
        "Won": (0, None, None),
        "Lost": (1, 3 * H, 3 * H),
    }
    assert data["time_to_won"] == {"count": 2, "median_seconds": 20 * H, "p90_seconds": 30 * H}


def test_velocity_of_a_manager_uses_only_its_team(client, ws, pipeline_data):
    data = report(client, ws, "velocity", "nmgr@t.test")
    assert velocity_table(data)["New"] == (6, 2 * H, 8 * H)   # 1 2 2 4 6 8: ranks 3 and 6
    south = report(client, ws, "velocity", "smgr@t.test")
    assert velocity_table(south)["New"] == (1, 10 * H, 10 * H)
    assert south["time_to_won"] == {"count": 0, "median_seconds": None, "p90_seconds": None}


# --- conversion ------------------------------------------------------------------------------

def outcome(item):
    return item["won"], item["lost"], item["open"], item["won_rate"]


def test_conversion_overall_by_source_and_by_owner(client, ws, pipeline_data):
    data = report(client, ws, "conversion")
    assert outcome(data["overall"]) == (2, 2, 3, 0.5) and data["overall"]["leads"] == 7
    assert {s["source"]["name"]: outcome(s) for s in data["by_source"]} == {
        "Website": (1, 2, 0, 0.3333), "Referral": (1, 0, 3, 1.0)}
    assert [(o["owner"]["name"], *outcome(o)) for o in data["by_owner"]] == [
        ("Neel Agent", 1, 1, 1, 0.5), ("Nora Agent", 1, 0, 1, 1.0), ("Sid Agent", 0, 1, 1, 0.0)]


def test_conversion_of_a_manager_counts_only_its_team(client, ws, pipeline_data):
    data = report(client, ws, "conversion", "nmgr@t.test")
    assert outcome(data["overall"]) == (2, 1, 2, 0.6667)
    assert {o["owner"]["name"] for o in data["by_owner"]} == {"Neel Agent", "Nora Agent"}


def test_conversion_filtered_by_source_and_created_at(client, ws, pipeline_data):
    referral = report(client, ws, "conversion", **{"filter[source]": ws.ids.sources["Referral"]})
    assert outcome(referral["overall"]) == (1, 0, 3, 1.0)
    early = report(client, ws, "conversion", **{"filter[created_at]": "..2026-03-04T00:00:00Z"})
    assert outcome(early["overall"]) == (1, 1, 0, 0.5)                # L1 and L2
    nothing = report(client, ws, "conversion", **{"filter[created_at]": "2030-01-01.."})
    assert outcome(nothing["overall"]) == (0, 0, 0, None) and nothing["by_source"] == []


# --- scope and input -------------------------------------------------------------------------

REPORTS = ["funnel", "velocity", "conversion", "response"]


@pytest.mark.parametrize("name", REPORTS)
def test_agents_never_read_reports(client, ws, name):
    response = client.get(f"/api/v1/reports/{name}", headers=ws.headers("n1@t.test"))
    assert response.status_code == 403 and "reports:read" in response.json["detail"]


@pytest.mark.parametrize("name", REPORTS)
def test_a_token_without_reports_read_is_403(client, ws, name):
    response = client.get(f"/api/v1/reports/{name}", headers=ws.headers("admin@t.test", ("leads:read",)))
    assert response.status_code == 403


@pytest.mark.parametrize("name", REPORTS)
def test_no_token_is_401(client, name):
    assert client.get(f"/api/v1/reports/{name}").status_code == 401


def test_another_workspace_counts_none_of_these_leads(client, ws, other_ws, pipeline_data):
    assert report(client, other_ws, "funnel")["leads"] == 0
    assert report(client, other_ws, "conversion")["overall"]["leads"] == 0
    assert all(s["count"] == 0 for s in report(client, other_ws, "velocity")["stages"])


@pytest.mark.parametrize("name", REPORTS)
@pytest.mark.parametrize("query, field", [
    ({"filter[owner]": "Neel"}, "filter[owner]"),
    ({"filter[source]": "st_0000000000000000"}, "filter[source]"),
    ({"filter[created_at]": "March"}, "filter[created_at]"),
    ({"filter[status]": "st_0000000000000000"}, "filter[status]"),
    ({"page[size]": "10"}, "page[size]"),
])
def test_bad_report_query_is_422(client, ws, name, query, field):
    response = client.get(f"/api/v1/reports/{name}", query_string=query, headers=ws.headers())
    assert response.status_code == 422 and field in response.json["errors"]
