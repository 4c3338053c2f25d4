"""GET /api/v1/leads: scope, filters, sorts, keyset cursors and links."""

from datetime import datetime, timedelta
from urllib.parse import parse_qs, urlsplit

import pytest

from leadsvc.listing import Period, parse_period
from leadsvc.models import NEVER, Lead


def ids(response) -> list[str]:
    assert response.status_code == 200, response.get_json()
    return [lead["id"] for lead in response.json["data"]]


def walk(client, ws, url, email="admin@t.test") -> list[str]:
    seen = []
    while url:
        response = client.get(url, headers=ws.headers(email))
        seen += ids(response)
        url = response.json["links"]["next"]
        assert response.json["meta"]["has_more"] is (url is not None)
    return seen


def set_fields(lead_id: str, **fields) -> None:
    Lead.update(**fields).where(Lead.public_id == lead_id).execute()


@pytest.fixture
def three_owners(client, make_lead, ws):
    """One lead per agent (fallback rotation gives n1, n2, s1 in turn)."""
    leads = [make_lead(ws) for _ in range(3)]
    return {lead["owner"]["id"]: lead["id"] for lead in leads}


# --- scope -------------------------------------------------------------------------------------

def test_agent_sees_only_its_own_leads(client, ws, three_owners):
    assert ids(client.get("/api/v1/leads", headers=ws.headers("n1@t.test"))) == [three_owners[ws.ids.members["n1@t.test"]]]


def test_manager_sees_its_teams_leads(client, ws, three_owners):
    north = {three_owners[ws.ids.members["n1@t.test"]], three_owners[ws.ids.members["n2@t.test"]]}
    assert set(ids(client.get("/api/v1/leads", headers=ws.headers("nmgr@t.test")))) == north
    assert ids(client.get("/api/v1/leads", headers=ws.headers("smgr@t.test"))) == [three_owners[ws.ids.members["s1@t.test"]]]


def test_admin_sees_the_workspace_and_never_another(client, make_lead, ws, other_ws, three_owners):
    make_lead(other_ws)
    assert set(ids(client.get("/api/v1/leads", headers=ws.headers()))) == set(three_owners.values())


def test_no_parameter_widens_the_scope(client, ws, three_owners):
    s1_lead = three_owners[ws.ids.members["s1@t.test"]]
    response = client.get(f"/api/v1/leads?filter[owner]={ws.ids.members['s1@t.test']}", headers=ws.headers("n1@t.test"))
    assert ids(response) == []
    assert s1_lead not in ids(client.get("/api/v1/leads?page[size]=200", headers=ws.headers("n1@t.test")))


# --- filters -----------------------------------------------------------------------------------

def test_id_filters_take_comma_separated_public_ids(client, make_lead, ws):
    website = make_lead(ws, source=ws.ids.sources["Website"])
    referral = make_lead(ws, source=ws.ids.sources["Referral"])
    src = ws.ids.sources
    assert ids(client.get(f"/api/v1/leads?filter[source]={src['Referral']}", headers=ws.headers())) == [referral["id"]]
    both = client.get(f"/api/v1/leads?filter[source]={src['Referral']},{src['Website']}", headers=ws.headers())
    assert set(ids(both)) == {website["id"], referral["id"]}
    owner = website["owner"]["id"]
    assert website["id"] in ids(client.get(f"/api/v1/leads?filter[owner]={owner}", headers=ws.headers()))
    new = ws.ids.statuses["New"]
    assert len(ids(client.get(f"/api/v1/leads?filter[status]={new}", headers=ws.headers()))) == 2
    assert ids(client.get(f"/api/v1/leads?filter[status]={ws.ids.statuses['Won']}", headers=ws.headers())) == []


@pytest.mark.parametrize("param,value", [("filter[status]", "New"), ("filter[owner]", "st_AAAAAAAAAAAAAAAAAAAA"),
                                         ("filter[source]", "src_short"), ("filter[score_band]", "lukewarm"),
                                         ("filter[created_at]", "yesteryear"), ("filter[created_at]", "2026-13-01.."),
                                         ("filter[created_at]", "2026-02-01..2026-01-01"), ("filter[created_at]", ".."),
                                         ("filter[created_at]", "..9999-12-31"), ("filter[created_at]", "0001-01-01.."),
                                         ("sort", "name"), ("sort", "-score"), ("page[size]", "0"),
                                         ("page[size]", "201"), ("page[size]", "ten"), ("page[after]", "garbage!"),
                                         ("color", "red")])
def test_malformed_parameters_are_422_naming_the_parameter(client, ws, param, value):
    response = client.get("/api/v1/leads", query_string={param: value}, headers=ws.headers())
    assert response.status_code == 422
    assert response.content_type == "application/problem+json"
    assert param in response.json["errors"]


def test_well_formed_ids_that_match_nothing_give_an_empty_page(client, make_lead, ws, other_ws):
    make_lead(ws)
    foreign = other_ws.ids.statuses["New"]
    response = client.get(f"/api/v1/leads?filter[status]={foreign}", headers=ws.headers())
    assert ids(response) == [] and response.json["meta"] == {"has_more": False}


def test_unknown_filter_keys_give_an_empty_200_naming_them(client, make_lead, ws):
    make_lead(ws)
    response = client.get("/api/v1/leads?filter[stauts]=x&filter[color]=red", headers=ws.headers())
    assert ids(response) == []
    assert response.json["meta"] == {"has_more": False, "unknown_filters": ["filter[color]", "filter[stauts]"]}
    assert response.json["links"] == {"next": None}


def test_score_band_filter_uses_the_configured_thresholds(client, make_lead, ws):
    leads = [make_lead(ws) for _ in range(3)]
    for lead, score in zip(leads, (85, 45, 10)):
        set_fields(lead["id"], score=score)
    get = lambda bands: set(ids(client.get(f"/api/v1/leads?filter[score_band]={bands}", headers=ws.headers())))
    assert get("hot") == {leads[0]["id"]}
    assert get("warm") == {leads[1]["id"]}
    assert get("cold") == {leads[2]["id"]}
    assert get("hot,cold") == {leads[0]["id"], leads[2]["id"]}


@pytest.mark.parametrize("path", ["/api/v1/leads", "/api/v1/leads/export.csv"])
def test_a_band_named_many_times_filters_like_once(client, make_lead, ws, path):
    """A band repeated hundreds of times once nested as many ORs, past SQLite's parser stack (500)."""
    lead = make_lead(ws)
    set_fields(lead["id"], score=85)
    response = client.get(f"{path}?filter[score_band]={','.join(['hot'] * 500)},cold", headers=ws.headers())
    assert response.status_code == 200
    assert lead["id"] in response.get_data(as_text=True)


def test_created_at_ranges_are_in_the_workspace_time_zone_with_dates_inclusive(client, make_lead, ws):
    leads = [make_lead(ws) for _ in range(3)]
    # Asia/Kolkata is UTC+05:30: 2026-03-31 20:00 UTC is already 1 April there.
    for lead, at in zip(leads, (datetime(2026, 3, 1, 0, 0), datetime(2026, 3, 31, 18, 29), datetime(2026, 3, 31, 20, 0))):
        set_fields(lead["id"], created_at=at)
    march = set(ids(client.get("/api/v1/leads?filter[created_at]=2026-03-01..2026-03-31", headers=ws.headers())))
    assert march == {leads[0]["id"], leads[1]["id"]}
    april = ids(client.get("/api/v1/leads?filter[created_at]=2026-04-01..", headers=ws.headers()))
    assert april == [leads[2]["id"]]
    until = ids(client.get("/api/v1/leads?filter[created_at]=..2026-03-01", headers=ws.headers()))
    assert until == [leads[0]["id"]]
    exact = ids(client.get("/api/v1/leads", query_string={"filter[created_at]": "2026-03-31T18:29:00Z..2026-03-31T18:29:00Z"},
                           headers=ws.headers()))
    assert exact == [leads[1]["id"]], "datetime ends are inclusive"


def test_created_at_keywords_cover_recent_leads(client, make_lead, ws):
    recent, old = make_lead(ws), make_lead(ws)
    set_fields(old["id"], created_at=datetime.now() - timedelta(days=400))
    for keyword in ("today", "last_7_days", "last_30_days", "last_90_days", "this_year"):
        assert ids(client.get(f"/api/v1/leads?filter[created_at]={keyword}", headers=ws.headers())) == [recent["id"]], keyword
    assert ids(client.get("/api/v1/leads?filter[created_at]=yesterday", headers=ws.headers())) == []


@pytest.mark.parametrize("keyword,today,first,after", [
    ("today", "2026-05-14", "2026-05-14", "2026-05-15"),
    ("yesterday", "2026-05-14", "2026-05-13", "2026-05-14"),
    ("last_7_days", "2026-05-14", "2026-05-08", "2026-05-15"),
    ("last_30_days", "2026-05-14", "2026-04-15", "2026-05-15"),
    ("this_week", "2026-05-14", "2026-05-11", "2026-05-18"),
    ("this_month", "2026-12-14", "2026-12-01", "2027-01-01"),
    ("last_month", "2026-01-14", "2025-12-01", "2026-01-01"),
    ("this_quarter", "2026-05-14", "2026-04-01", "2026-07-01"),
    ("this_quarter", "2026-12-31", "2026-10-01", "2027-01-01"),
    ("this_year", "2026-05-14", "2026-01-01", "2027-01-01"),
])
def test_keyword_periods_are_whole_local_days(keyword, today, first, after):
    start, end = parse_period(keyword).utc_bounds("UTC", today=datetime.fromisoformat(today).date())
    assert (start, end) == (datetime.fromisoformat(first), datetime.fromisoformat(after))
    start, _ = Period(keyword="today").utc_bounds("Asia/Kolkata", today=datetime(2026, 5, 14).date())
    assert start == datetime(2026, 5, 13, 18, 30)


# --- sorts and cursors -------------------------------------------------------------------------

def test_default_sort_is_newest_first_with_the_id_breaking_ties(client, make_lead, ws):
    leads = [make_lead(ws)["id"] for _ in range(4)]
    same = datetime(2026, 1, 1, 12, 0)
    for lead in leads:
        set_fields(lead, created_at=same)
    assert ids(client.get("/api/v1/leads", headers=ws.headers())) == sorted(leads, reverse=True)


def test_score_sort_is_ascending_with_the_id_breaking_ties(client, make_lead, ws):
    leads = [make_lead(ws)["id"] for _ in range(4)]
    for lead, score in zip(leads, (50, 10, 50, 90)):
        set_fields(lead, score=score)
    expected = [leads[1]] + sorted([leads[0], leads[2]]) + [leads[3]]
    assert ids(client.get("/api/v1/leads?sort=score", headers=ws.headers())) == expected


def test_last_activity_sort_puts_leads_without_activity_last(client, make_lead, ws):
    never, old, recent = (make_lead(ws)["id"] for _ in range(3))
    for lead, kind in ((old, "call"), (recent, "meeting")):
        response = client.post(f"/api/v1/leads/{lead}/activities", json={"kind": kind, "summary": "talked"},
                               headers=ws.headers())
        if response.status_code == 404:   # the timeline endpoint may not exist yet: log directly
            set_fields(lead, last_activity_at=datetime.now(), activity_sort_at=datetime.now())
    set_fields(old, last_activity_at=datetime(2026, 1, 1), activity_sort_at=datetime(2026, 1, 1))
    listed = ids(client.get("/api/v1/leads?sort=-last_activity_at", headers=ws.headers()))
    assert listed == [recent, old, never]
    assert Lead.get(Lead.public_id == never).activity_sort_at == NEVER


@pytest.mark.parametrize("sort", ["-created_at", "score", "-last_activity_at"])
def test_pages_follow_links_next_without_repeats_or_gaps(client, make_lead, ws, sort):
    leads = [make_lead(ws)["id"] for _ in range(7)]
    for i, lead in enumerate(leads):
        set_fields(lead, score=i % 3, created_at=datetime(2026, 1, 1 + i % 2))
    walked = walk(client, ws, f"/api/v1/leads?sort={sort}&page[size]=2")
    assert sorted(walked) == sorted(leads) and len(walked) == 7
    assert walked == ids(client.get(f"/api/v1/leads?sort={sort}&page[size]=200", headers=ws.headers()))


def test_links_next_carries_every_filter_the_sort_and_the_page_size(client, make_lead, ws):
    for _ in range(3):
        make_lead(ws)
    params = {"filter[status]": ws.ids.statuses["New"], "filter[score_band]": "cold,warm,hot",
              "filter[created_at]": "last_30_days", "sort": "score", "page[size]": "2"}
    response = client.get("/api/v1/leads", query_string=params, headers=ws.headers())
    link = response.json["links"]["next"]
    parts = urlsplit(link)
    assert parts.path == "/api/v1/leads" and not parts.netloc
    query = {k: v[0] for k, v in parse_qs(parts.query).items()}
    assert {k: query[k] for k in params} == params and query["page[after]"]
    assert response.json["meta"]["has_more"] is True


def test_a_cursor_is_bound_to_its_sort_and_filters(client, make_lead, ws):
    for _ in range(3):
        make_lead(ws)
    link = client.get("/api/v1/leads?page[size]=1", headers=ws.headers()).json["links"]["next"]
    after = parse_qs(urlsplit(link).query)["page[after]"][0]
    for other in (f"sort=score&page[after]={after}", f"filter[score_band]=cold&page[after]={after}"):
        response = client.get(f"/api/v1/leads?{other}", headers=ws.headers())
        assert response.status_code == 422 and "page[after]" in response.json["errors"]
    assert client.get(f"/api/v1/leads?page[size]=5&page[after]={after}", headers=ws.headers()).status_code == 200


def test_cursors_hold_no_internal_ids(client, make_lead, ws):
    for _ in range(2):
        make_lead(ws)
    import base64
    import json
    link = client.get("/api/v1/leads?page[size]=1", headers=ws.headers()).json["links"]["next"]
    after = parse_qs(urlsplit(link).query)["page[after]"][0]
    decoded = json.loads(base64.urlsafe_b64decode(after + "=" * (-len(after) % 4)))
    assert decoded[2].startswith("ld_") and not any(isinstance(part, int) for part in decoded)


def test_default_page_size_is_50(client, make_lead, ws):
    for _ in range(51):
        make_lead(ws)
    response = client.get("/api/v1/leads", headers=ws.headers())
    assert len(response.json["data"]) == 50 and response.json["meta"]["has_more"] is True


def test_a_crafted_cursor_with_a_bad_id_is_422(client, ws):
    import base64
    import json
    for last in ("ld_\x00AAAAAAAAAAAAAAAAAAAA", "1", "ld_" + "A" * 20 + "\n"):
        from leadsvc.listing import binding
        raw = json.dumps([binding("-created_at", {}), {"t": "2026-01-01T00:00:00"}, last]).encode()
        cursor = base64.urlsafe_b64encode(raw).decode().rstrip("=")
        response = client.get("/api/v1/leads", query_string={"page[after]": cursor}, headers=ws.headers())
        assert response.status_code == 422 and "page[after]" in response.json["errors"]


def test_a_crafted_cursor_with_a_huge_sort_value_is_422(client, ws):
    import base64
    import json
    from leadsvc.listing import binding
    raw = json.dumps([binding("score", {}), 10**20, "ld_" + "A" * 20]).encode()
    cursor = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    response = client.get("/api/v1/leads", query_string={"sort": "score", "page[after]": cursor}, headers=ws.headers())
    assert response.status_code == 422 and "page[after]" in response.json["errors"]
