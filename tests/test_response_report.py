"""GET /reports/response against hand-set first responses: eight leads in a workspace with an SLA.

Each lead is created through the API, then its response columns are set directly to known values
(`due` is ten days ago plus an hour, so that the one unanswered lead due then is overdue now):

    lead  owner  source    first response          working seconds   state
    L1    n1     Website   due - 30 min            1800              met
    L2    n1     Website   due (exactly)           3600              met
    L3    n1     Referral  due + 1 h               7200              missed
    L4    n2     Referral  due + 2 h               10800             missed
    L5    n2     -         none                    -                 overdue
    L6    s1     Website   none, due tomorrow      -                 due
    L7    -      Referral  due - 50 min            600               met
    L8    s1     Website   responded, no due time  60                not in the report

n1 and n2 are in team North, s1 in South; L7 has no owner and so no team.
"""

import random
from datetime import timedelta

import pytest

from conftest import bulk_leads, plan
from leadsvc.bulk_load import gather_statistics
from leadsvc.db import database, is_postgres
from leadsvc.models import Lead, utcnow

DUE = utcnow().replace(microsecond=0) - timedelta(days=10) + timedelta(hours=1)
LEADS = {
    "L1": ("n1@t.test", "Website", dict(first_response_at=DUE - timedelta(minutes=30), first_response_seconds=1800)),
    "L2": ("n1@t.test", "Website", dict(first_response_at=DUE, first_response_seconds=3600)),
    "L3": ("n1@t.test", "Referral", dict(first_response_at=DUE + timedelta(hours=1), first_response_seconds=7200)),
    "L4": ("n2@t.test", "Referral", dict(first_response_at=DUE + timedelta(hours=2), first_response_seconds=10800)),
    "L5": ("n2@t.test", None, {}),
    "L6": ("s1@t.test", "Website", dict(response_due_at=utcnow() + timedelta(days=1))),
    "L7": (None, "Referral", dict(first_response_at=DUE - timedelta(minutes=50), first_response_seconds=600)),
    "L8": ("s1@t.test", "Website", dict(response_due_at=None, first_response_at=DUE, first_response_seconds=60)),
}
KEYS = ("count", "responded", "met", "missed", "overdue", "median_seconds", "p90_seconds")


def with_sla(data):
    data["sla"] = {"first_response_minutes": 60}


@pytest.fixture
def sla_ws(make_workspace):
    return make_workspace(with_sla)


@pytest.fixture
def responses(sla_ws, make_lead):
    """The eight leads of the module docstring in `sla_ws`; returns their public ids by name."""
    ids = {}
    for name, (owner, source, columns) in LEADS.items():
        lead = make_lead(sla_ws, owner=owner, source=sla_ws.ids.sources[source] if source else None)
        ids[name] = lead["id"]
        values = {"created_at": DUE - timedelta(hours=1), "response_due_at": DUE, **columns}
        if owner is None:   # unassigned, whatever the workspace's distribution did
            values.update(owner=None, team=None)
        Lead.update(**values).where(Lead.public_id == lead["id"]).execute()
    return ids


def report(client, tenant, email="admin@t.test", **params):
    response = client.get("/api/v1/reports/response", query_string=params, headers=tenant.headers(email))
    assert response.status_code == 200, response.json
    return response.json["data"]


def figures(item):
    return tuple(item[key] for key in KEYS)


def breakdown(data, by):
    return [((item[by] or {}).get("name"), *figures(item)) for item in data[f"by_{by}"]]


EVERYONE = (7, 5, 3, 2, 1, 3600, 10800)          # seconds 600 1800 3600 7200 10800: ranks 3 and 5
BY_OWNER = [
    ("Neel Agent", 3, 3, 2, 1, 0, 3600, 7200),     # 1800 3600 7200: ranks 2 and 3
    ("Nora Agent", 2, 1, 0, 1, 1, 10800, 10800),
    ("Sid Agent", 1, 0, 0, 0, 0, None, None),      # L6 still due; L8 has no due time
    (None, 1, 1, 1, 0, 0, 600, 600),               # no owner: last
]
BY_SOURCE = [
    ("Referral", 3, 3, 1, 2, 0, 7200, 10800),      # 600 7200 10800: ranks 2 and 3
    ("Website", 3, 2, 2, 0, 0, 1800, 3600),        # 1800 3600: the lower middle, then rank 2
    (None, 1, 0, 0, 0, 1, None, None),             # no source: last
]


def test_counts_states_and_nearest_rank_percentiles_of_the_leads_with_a_due_time(client, sla_ws, responses):
    data = report(client, sla_ws)
    assert figures(data) == EVERYONE
    assert breakdown(data, "owner") == BY_OWNER
    assert breakdown(data, "source") == BY_SOURCE
    assert data["by_owner"][0]["owner"]["id"] == sla_ws.ids.members["n1@t.test"]
    assert data["by_source"][0]["source"]["id"] == sla_ws.ids.sources["Referral"]


def test_a_filter_that_keeps_every_lead_ranks_in_sql_windows_to_the_same_figures(client, sla_ws, responses):
    """Without filters an admin's percentiles are index walks; with any filter, windows over the scope."""
    data = report(client, sla_ws, **{"filter[created_at]": "2020-01-01.."})
    assert figures(data) == EVERYONE
    assert breakdown(data, "owner") == BY_OWNER
    assert breakdown(data, "source") == BY_SOURCE


def test_a_manager_counts_only_its_teams_leads(client, sla_ws, responses):
    north = report(client, sla_ws, "nmgr@t.test")
    assert figures(north) == (5, 4, 2, 2, 1, 3600, 10800)   # L1-L5; 1800 3600 7200 10800: ranks 2 and 4
    assert breakdown(north, "owner") == BY_OWNER[:2]
    assert breakdown(north, "source") == [("Referral", 2, 2, 0, 2, 0, 7200, 10800),
                                          ("Website", 2, 2, 2, 0, 0, 1800, 3600), (None, 1, 0, 0, 0, 1, None, None)]
    south = report(client, sla_ws, "smgr@t.test")
    assert figures(south) == (1, 0, 0, 0, 0, None, None)
    assert breakdown(south, "owner") == [BY_OWNER[2]] and breakdown(south, "source")[0][:2] == ("Website", 1)


def test_filters_by_owner_source_and_created_at(client, sla_ws, responses):
    neel = report(client, sla_ws, **{"filter[owner]": sla_ws.ids.members["n1@t.test"]})
    assert figures(neel) == BY_OWNER[0][1:] and breakdown(neel, "owner") == BY_OWNER[:1]
    referral = report(client, sla_ws, **{"filter[source]": sla_ws.ids.sources["Referral"]})
    assert figures(referral) == BY_SOURCE[0][1:]
    assert [name for name, *_ in breakdown(referral, "owner")] == ["Neel Agent", "Nora Agent", None]
    # Dates are days of the workspace's time zone (UTC+5:30): from 18:30 UTC the leads' creation day
    # there is already the next UTC day, so the first day certainly after it is two UTC days on.
    later = report(client, sla_ws, **{"filter[created_at]": f"{(DUE + timedelta(days=2)).date()}.."})
    assert figures(later) == (0, 0, 0, 0, 0, None, None)
    assert later["by_owner"] == [] and later["by_source"] == []


def test_a_workspace_without_an_sla_reports_zeros_and_nulls(client, ws, make_lead):
    lead = make_lead(ws, owner="n1@t.test")
    # A contact stamps a first response whether or not the lead has a due time.
    Lead.update(first_response_at=utcnow(), first_response_seconds=60).where(Lead.public_id == lead["id"]).execute()
    assert report(client, ws) == {"count": 0, "responded": 0, "met": 0, "missed": 0, "overdue": 0,
                                  "median_seconds": None, "p90_seconds": None, "by_owner": [], "by_source": []}


def test_another_workspace_counts_none_of_these_leads(client, other_ws, responses):
    assert figures(report(client, other_ws)) == (0, 0, 0, 0, 0, None, None)


def test_a_contact_logged_within_the_window_is_a_met_first_response(client, sla_ws, make_lead):
    lead = make_lead(sla_ws, owner="n2@t.test")
    assert figures(report(client, sla_ws)) == (1, 0, 0, 0, 0, None, None)   # due in an hour
    logged = client.post(f"/api/v1/leads/{lead['id']}/activities", json={"kind": "call", "summary": "Called"},
                         headers=sla_ws.headers())
    assert logged.status_code == 201, logged.json
    data = report(client, sla_ws)
    assert figures(data)[:5] == (1, 1, 1, 0, 0)
    stamped = Lead.get(Lead.public_id == lead["id"]).first_response_seconds
    assert data["median_seconds"] == data["p90_seconds"] == stamped


# --- at scale --------------------------------------------------------------------------------

COUNTS_INDEX = "lead_workspace_id_owner_id_source_id_response"
SECONDS_INDEXES = ("lead_workspace_id_owner_id_first_response_seconds",
                   "lead_workspace_id_source_id_first_response_seconds", "lead_workspace_id_first_response_seconds")


@pytest.fixture
def bulk_sla_ws(sla_ws):
    """5,000 leads with varied owners, sources and responses, and the statistics a bulk load leaves."""
    bulk_leads(sla_ws, 5_000, random.Random(18), responses=True)
    gather_statistics()
    return sla_ws


def test_walks_down_the_indexes_give_what_windows_give(client, bulk_sla_ws):
    walked = report(client, bulk_sla_ws)
    assert walked["count"] == 4_750 and 0 < walked["responded"] < walked["count"]
    assert len(walked["by_owner"]) == 4 and len(walked["by_source"]) == 3
    assert report(client, bulk_sla_ws, **{"filter[created_at]": "2020-01-01.."}) == walked


def test_a_whole_workspace_report_reads_its_indexes_without_a_sort(client, bulk_sla_ws, monkeypatch):
    statements = []
    run = type(database.obj).execute_sql

    def spy(self, sql, params=None, *args, **kwargs):
        statements.append((sql, params))
        return run(self, sql, params, *args, **kwargs)

    monkeypatch.setattr(type(database.obj), "execute_sql", spy)
    report(client, bulk_sla_ws)
    monkeypatch.undo()
    counts = [(sql, params) for sql, params in statements if "GROUP BY" in sql and "response_due_at" in sql]
    walks = [(sql, params) for sql, params in statements if 'ORDER BY "t1"."first_response_seconds"' in sql]
    assert len(counts) == 1 and len(walks) == 2 * (1 + 4 + 3)
    text = plan(*counts[0])
    if is_postgres():
        assert f'"Index Name": "{COUNTS_INDEX}"' in text and '"Seq Scan"' not in text and '"Sort"' not in text, text
    else:
        assert f"COVERING INDEX {COUNTS_INDEX}" in text and "TEMP B-TREE" not in text, text
    for sql, params in walks:
        text = plan(sql, params)
        assert any(name in text for name in SECONDS_INDEXES), text
        if is_postgres():
            # IS NULL is no equality to PostgreSQL's ordering: the leads without an owner or a
            # source are sorted, top-N, after their range of the index is read.
            assert '"Seq Scan"' not in text and ('"Sort"' not in text or "IS NULL" in sql), text
        else:
            assert text.startswith("SEARCH") and "TEMP B-TREE" not in text, text
