"""The team (DESIGN section 20): availability, capacity, routing with both, members and tokens by API."""

import json
from collections import Counter
from datetime import datetime, time, timedelta

import pytest

from conftest import NOBODY, bearer, lead_body, owner_email, register_webhook, standard_setup, with_rules
from leadsvc import members as members_module, routing
from leadsvc.fields import rfc3339
from leadsvc.models import Activity, Event, Lead, Member, OpenLeadCount, Token, utcnow
from leadsvc.provision import SetupError, parse_setup
from served import race

NORTH_ROUND_ROBIN = {"name": "North", "assign": {"team": "North", "strategy": "round_robin"}}


def in_hours(hours: float) -> str:
    return rfc3339(utcnow() + timedelta(hours=hours))


def assigned(lead) -> dict:
    row = Lead.get(Lead.public_id == lead["id"])
    return Activity.get((Activity.lead == row.id) & (Activity.kind == "assigned")).data


def set_member(ws, email, **columns):
    """Set a member's columns directly (the API's own checks are tested below)."""
    if columns:
        Member.update(**columns).where(Member.public_id == ws.ids.members[email]).execute()


def with_members(**settings):
    """A change for make_workspace: setup values per member e-mail ({"n1@t.test": {"max_open_leads": 1}})."""
    def change(members):
        return [{**m, **settings.get(m["email"].replace("@t.test", ""), {})} for m in members]
    return change


def patch_member(client, ws, who, target, body):
    path = "/api/v1/members/me" if target == "me" else f"/api/v1/members/{ws.ids.members[target]}"
    return client.patch(path, json=body, headers=ws.headers(who))


# --- availability ----------------------------------------------------------------------------

def test_any_member_sets_its_own_availability_with_any_ability(client, ws):
    until = in_hours(48)
    response = client.patch("/api/v1/members/me", json={"availability": "on_leave", "until": until},
                            headers=ws.headers("n1@t.test", ("leads:read",)))
    assert response.status_code == 200, response.json
    assert response.json["data"]["availability"] == "on_leave" and response.json["data"]["until"] == until
    assert response.json["data"]["id"] == ws.ids.members["n1@t.test"]


@pytest.mark.parametrize("body, field", [
    ({"availability": "away", "until": "2020-01-01T00:00:00Z"}, "until"),
    ({"availability": "holiday"}, "availability"),
    ({"availability": "available", "until": "2999-01-01T00:00:00Z"}, "until"),
    ({"until": "2999-01-01T00:00:00Z"}, "until"),          # the member is available: nothing lasts until then
    ({"availability": "away", "until": "tomorrow"}, "until"),
    ({"availability": "away", "name": "Other"}, "name"),    # /members/me changes availability only
])
def test_bad_availability_is_422_on_its_field_and_changes_nothing(client, ws, body, field):
    response = client.patch("/api/v1/members/me", json=body, headers=ws.headers("n1@t.test"))
    assert response.status_code == 422 and field in response.json["errors"], response.json
    assert ws.member("n1@t.test").availability == "available"


def test_after_until_the_member_is_available_again_for_reads_and_routing(client, make_lead, make_workspace,
                                                                          monkeypatch):
    ws = make_workspace(with_rules(NORTH_ROUND_ROBIN))
    assert patch_member(client, ws, "n1@t.test", "me", {"availability": "away", "until": in_hours(1)}).status_code == 200
    assert {owner_email(ws, make_lead(ws)) for _ in range(2)} == {"n2@t.test"}
    later = utcnow() + timedelta(hours=2)
    monkeypatch.setattr(routing, "utcnow", lambda: later)
    monkeypatch.setattr(members_module, "utcnow", lambda: later)
    listed = {m["id"]: m for m in client.get("/api/v1/members", headers=ws.headers()).json["data"]}
    assert listed[ws.ids.members["n1@t.test"]]["availability"] == "available"
    assert listed[ws.ids.members["n1@t.test"]]["until"] is None
    assert {owner_email(ws, make_lead(ws)) for _ in range(2)} == {"n1@t.test", "n2@t.test"}


def test_a_manager_sets_its_own_teams_availability_only(client, ws):
    manager = "nmgr@t.test"
    assert patch_member(client, ws, manager, "n1@t.test", {"availability": "away"}).status_code == 200
    assert ws.member("n1@t.test").availability == "away"
    assert patch_member(client, ws, manager, "s1@t.test", {"availability": "away"}).status_code == 404
    assert patch_member(client, ws, manager, "n1@t.test", {"max_open_leads": 3}).status_code == 403
    assert patch_member(client, ws, manager, "n1@t.test", {"availability": "available", "name": "X"}).status_code == 403
    assert ws.member("n1@t.test").name == "Neel Agent" and ws.member("n1@t.test").max_open_leads is None


def test_an_agent_sets_no_one_elses_availability(client, ws):
    assert patch_member(client, ws, "n1@t.test", "n2@t.test", {"availability": "away"}).status_code == 403
    assert patch_member(client, ws, "n1@t.test", "n1@t.test", {"availability": "away"}).status_code == 200
    assert ws.member("n2@t.test").availability == "available"


def test_the_members_list_shows_availability_caps_and_open_leads_to_managers_and_admins(client, make_lead, ws):
    set_member(ws, "n1@t.test", max_open_leads=5, daily_leads=2)
    make_lead(ws, owner="n1@t.test")
    for who in ("admin@t.test", "nmgr@t.test"):
        listed = {m["id"]: m for m in client.get("/api/v1/members", headers=ws.headers(who)).json["data"]}
        n1 = listed[ws.ids.members["n1@t.test"]]
        assert (n1["availability"], n1["max_open_leads"], n1["daily_leads"], n1["open_leads"]) == ("available", 5, 2, 1)
    agent_view = client.get("/api/v1/members", headers=ws.headers("n1@t.test")).json["data"]
    assert all("open_leads" not in m and "availability" not in m and "max_open_leads" not in m for m in agent_view)


# --- routing with availability and caps ------------------------------------------------------

# North round robin over n1 and n2, the fallback over n1, n2 and s1. Each row: what n1 and n2
# are, who gets the next two leads, and who is skipped why.
ROUTING_TABLE = [
    ({}, {}, ["n1", "n2"], {}),
    ({"availability": "away"}, {}, ["n2", "n2"], {"n1": "away"}),
    ({"availability": "on_leave"}, {}, ["n2", "n2"], {"n1": "on_leave"}),
    ({"max_open_leads": 0}, {}, ["n2", "n2"], {"n1": "max_open_leads"}),
    ({"daily_leads": 0}, {}, ["n2", "n2"], {"n1": "daily_leads"}),
    ({"max_open_leads": 1}, {}, ["n1", "n2"], {"n1": "max_open_leads"}),   # full after its first
    ({"daily_leads": 5, "max_open_leads": 5}, {"availability": "away"}, ["n1", "n1"], {"n2": "away"}),
    ({"active": False}, {}, ["n2", "n2"], {}),   # a team's inactive agents are not candidates at all
    # Nobody in North: the fallback's round robin over every agent gives s1 the leads.
    ({"availability": "away"}, {"daily_leads": 0}, ["s1", "s1"], {"n1": "away", "n2": "daily_leads"}),
]


@pytest.mark.parametrize("n1, n2, owners, skipped", ROUTING_TABLE)
def test_routing_picks_only_eligible_members(client, make_lead, make_workspace, n1, n2, owners, skipped):
    ws = make_workspace(with_rules(NORTH_ROUND_ROBIN))
    set_member(ws, "n1@t.test", **n1)
    set_member(ws, "n2@t.test", **n2)
    leads = [make_lead(ws) for _ in owners]
    assert [owner_email(ws, lead).split("@")[0] for lead in leads] == owners
    reason = assigned(leads[-1])
    assert {s["member"]: s["reason"] for s in reason["skipped"]} == {ws.ids.members[f"{k}@t.test"]: v
                                                                     for k, v in skipped.items()}


def test_nobody_eligible_leaves_the_lead_unassigned_in_the_rules_team_and_fires_lead_unassigned(
        client, make_lead, make_workspace):
    ws = make_workspace(with_rules(NORTH_ROUND_ROBIN))
    register_webhook(client, ws, NOBODY + "/hook", events=["lead.unassigned"])
    for email in ("n1@t.test", "n2@t.test", "s1@t.test"):
        set_member(ws, email, availability="on_leave")
    lead = make_lead(ws)
    assert lead["owner"] is None and lead["team"]["id"] == ws.ids.teams["North"]
    reason = assigned(lead)
    assert reason["member"] is None and reason["rule"] == ws.ids.rules["North"]
    assert sorted(s["reason"] for s in reason["skipped"]) == ["on_leave"] * 3
    row = Lead.get(Lead.public_id == lead["id"])
    event = Event.get((Event.lead == row.id) & (Event.type == "lead.unassigned"))
    assert json.loads(event.body)["data"]["routing"]["owner"] is None
    unassigned = client.get("/api/v1/leads?filter[owner]=none", headers=ws.headers()).json["data"]
    assert [item["id"] for item in unassigned] == [lead["id"]]
    both = client.get(f"/api/v1/leads?filter[owner]=none,{ws.ids.members['n1@t.test']}", headers=ws.headers())
    assert lead["id"] in {item["id"] for item in both.json["data"]}


def test_a_fixed_member_rule_skips_an_unavailable_member_to_the_next_rule(client, make_lead, make_workspace):
    ws = make_workspace(with_rules({"name": "Neel", "assign": {"member": "n1@t.test"}}, NORTH_ROUND_ROBIN))
    set_member(ws, "n1@t.test", availability="away")
    lead = make_lead(ws)
    assert owner_email(ws, lead) == "n2@t.test"
    assert assigned(lead)["skipped"] == [{"member": ws.ids.members["n1@t.test"], "name": "Neel Agent",
                                          "reason": "away"}]
    assert "Neel Agent (away)" in Activity.get((Activity.lead == Lead.get(Lead.public_id == lead["id"]).id)
                                               & (Activity.kind == "assigned")).summary


def test_round_robin_stays_fair_among_the_eligible(client, make_lead, make_workspace):
    ws = make_workspace(with_rules(NORTH_ROUND_ROBIN, members=with_members(n1={"max_open_leads": 2})))
    owners = [owner_email(ws, make_lead(ws)).split("@")[0] for _ in range(6)]
    assert owners == ["n1", "n2", "n1", "n2", "n2", "n2"]


def test_max_open_leads_counts_open_leads_only(client, make_lead, make_workspace):
    ws = make_workspace(with_rules(NORTH_ROUND_ROBIN, members=with_members(n1={"max_open_leads": 1},
                                                                           n2={"max_open_leads": 1})))
    first, _ = make_lead(ws), make_lead(ws)
    assert owner_email(ws, make_lead(ws)) == "s1@t.test"   # North is full: the fallback's s1
    lost = client.post(f"/api/v1/leads/{first['id']}/status", json={"status": ws.ids.statuses["Lost"]},
                       headers=ws.headers())
    assert lost.status_code == 200
    assert owner_email(ws, make_lead(ws)) == owner_email(ws, first)


def test_daily_leads_counts_routed_leads_of_the_workspaces_day_not_manual_ones(client, make_lead, make_workspace,
                                                                             monkeypatch):
    ws = make_workspace(with_rules({"name": "Neel", "assign": {"member": "n1@t.test"}},
                                   members=with_members(n1={"daily_leads": 1})))
    assert owner_email(ws, make_lead(ws)) == "n1@t.test"
    make_lead(ws, owner="n1@t.test")   # a manual assignment over the cap works, and is not counted
    assert owner_email(ws, make_lead(ws)) != "n1@t.test"
    # The next day in Asia/Kolkata (UTC+05:30) starts at 18:30 UTC.
    row = OpenLeadCount.get_by_id(ws.member("n1@t.test").id)
    next_day = routing.local_day(utcnow(), "Asia/Kolkata") + timedelta(days=1)
    assert row.routed_today == 1 and row.routed_on == next_day - timedelta(days=1)
    monkeypatch.setattr(routing, "utcnow", lambda: datetime.combine(next_day, time(0, 0)) - timedelta(hours=5, minutes=30))
    assert owner_email(ws, make_lead(ws)) == "n1@t.test"


def test_manual_assignment_to_an_away_or_full_member_works(client, make_lead, ws):
    set_member(ws, "n1@t.test", availability="away", max_open_leads=0)
    lead = make_lead(ws, owner="n1@t.test")
    assert lead["owner"]["id"] == ws.ids.members["n1@t.test"]


def test_16_concurrent_creates_never_push_a_member_past_its_caps(live_server, make_workspace):
    # n1 takes Referral leads by a fixed-member rule and is in North's rotation too: creates routed
    # by either rule meet on its row. n2 has a daily cap; the rest go to the fallback (s1).
    ws = make_workspace(with_rules(
        {"name": "Referrals to Neel", "when": {"source": ["Referral"]}, "assign": {"member": "n1@t.test"}},
        NORTH_ROUND_ROBIN, members=with_members(n1={"max_open_leads": 3}, n2={"daily_leads": 4})))
    replies = race(live_server, 16, "POST", "/api/v1/leads", headers=ws.headers(), each=lambda n: {
        "json_body": lead_body(ws, source=ws.ids.sources["Referral" if n % 2 else "Website"])})
    assert [reply.status for reply in replies] == [201] * 16, [reply.json() for reply in replies]
    results = [reply.json() for reply in replies]
    owners = Counter(owner_email(ws, payload["data"]) for payload in results)
    assert owners == {"n1@t.test": 3, "n2@t.test": 4, "s1@t.test": 9}
    assert OpenLeadCount.get_by_id(ws.member("n1@t.test").id).open_leads == 3
    assert OpenLeadCount.get_by_id(ws.member("n2@t.test").id).routed_today == 4


# --- members by API --------------------------------------------------------------------------

def test_an_admin_adds_a_member_who_then_gets_leads(client, make_lead, ws):
    body = {"name": "Tara Agent", "email": "Tara@T.test", "role": "agent", "team": ws.ids.teams["South"],
            "max_open_leads": 10, "daily_leads": None}
    response = client.post("/api/v1/members", json=body, headers=ws.headers())
    assert response.status_code == 201, response.json
    data = response.json["data"]
    assert (data["email"], data["team"]["name"], data["max_open_leads"], data["open_leads"]) == \
        ("tara@t.test", "South", 10, 0)
    listed = client.get("/api/v1/members", headers=ws.headers()).json["data"]
    assert data["id"] in {m["id"] for m in listed}, "the reference data cache saw the new member"
    owners = {make_lead(ws)["owner"]["id"] for _ in range(4)}
    assert data["id"] in owners


@pytest.mark.parametrize("body, field, status", [
    ({"max_open_leads": -1}, "max_open_leads", 422),
    ({"max_open_leads": 2.5}, "max_open_leads", 422),
    ({"daily_leads": "3"}, "daily_leads", 422),
    ({"role": "owner"}, "role", 422),
    ({"role": "agent", "team": None}, "team", 422),
    ({"email": "n2@t.test"}, None, 409),
    ({"name": "   "}, "name", 422),
])
def test_bad_member_input_is_a_problem_and_changes_nothing(client, ws, body, field, status):
    base = {"name": "New Agent", "email": "new@t.test", "role": "agent", "team": ws.ids.teams["North"]}
    count = Member.select().where(Member.workspace == ws.member("n1@t.test").workspace_id).count()
    created = client.post("/api/v1/members", json={**base, **body}, headers=ws.headers())
    assert created.status_code == status and created.content_type == "application/problem+json", created.json
    if field:
        assert field in created.json["errors"]
    assert Member.select().where(Member.workspace == ws.member("n1@t.test").workspace_id).count() == count
    patch = {key: value for key, value in body.items() if key != "email"} or {"email": "x@t.test"}
    changed = client.patch(f"/api/v1/members/{ws.ids.members['n1@t.test']}", json=patch, headers=ws.headers())
    assert changed.status_code == 422
    n1 = ws.member("n1@t.test")
    assert (n1.name, n1.role, n1.max_open_leads, n1.daily_leads) == ("Neel Agent", "agent", None, None)


def test_a_team_of_another_workspace_is_422(client, ws, other_ws):
    body = {"name": "Spy", "email": "spy@t.test", "role": "agent", "team": other_ws.ids.teams["North"]}
    response = client.post("/api/v1/members", json=body, headers=ws.headers())
    assert response.status_code == 422 and "team" in response.json["errors"]
    moved = client.patch(f"/api/v1/members/{ws.ids.members['n1@t.test']}", json={"team": other_ws.ids.teams["North"]},
                         headers=ws.headers())
    assert moved.status_code == 422 and "team" in moved.json["errors"]


def test_an_admin_changes_a_members_name_role_team_and_caps(client, ws):
    body = {"name": "Neel Lead", "role": "manager", "team": ws.ids.teams["South"], "max_open_leads": 4,
            "daily_leads": 0, "availability": "away", "until": in_hours(3)}
    response = client.patch(f"/api/v1/members/{ws.ids.members['n1@t.test']}", json=body, headers=ws.headers())
    assert response.status_code == 200, response.json
    data = response.json["data"]
    assert (data["name"], data["role"], data["team"]["name"], data["max_open_leads"], data["daily_leads"],
            data["availability"]) == ("Neel Lead", "manager", "South", 4, 0, "away")
    cleared = client.patch(f"/api/v1/members/{ws.ids.members['n1@t.test']}",
                           json={"max_open_leads": None, "availability": "available"}, headers=ws.headers())
    assert cleared.json["data"]["max_open_leads"] is None and cleared.json["data"]["until"] is None


def test_the_only_admin_cannot_be_demoted(client, ws):
    admin, north = ws.ids.members["admin@t.test"], ws.ids.teams["North"]
    refused = client.patch(f"/api/v1/members/{admin}", json={"role": "manager", "team": north}, headers=ws.headers())
    assert refused.status_code == 409 and "only admin" in refused.json["detail"]
    members = client.get("/api/v1/members", headers=ws.headers()).json["data"]
    assert next(m["role"] for m in members if m["id"] == admin) == "admin"
    # With a second admin, either may step down.
    promoted = client.patch(f"/api/v1/members/{ws.ids.members['n1@t.test']}", json={"role": "admin"},
                            headers=ws.headers())
    assert promoted.status_code == 200, promoted.json
    stepped_down = client.patch(f"/api/v1/members/{admin}", json={"role": "manager", "team": north},
                                headers=ws.headers())
    assert stepped_down.status_code == 200 and stepped_down.json["data"]["role"] == "manager"


def test_member_changes_need_members_manage(client, ws):
    lacking = ws.headers("admin@t.test", ("leads:read",))
    assert client.post("/api/v1/members", json={"name": "X", "email": "x@t.test", "role": "admin"},
                       headers=lacking).status_code == 403
    assert client.patch(f"/api/v1/members/{ws.ids.members['n1@t.test']}", json={"name": "X"},
                        headers=lacking).status_code == 403
    # An admin's token without it still sets availability, as a manager's does for its team.
    assert client.patch(f"/api/v1/members/{ws.ids.members['n1@t.test']}", json={"availability": "away"},
                        headers=lacking).status_code == 200


# --- tokens by API ---------------------------------------------------------------------------

def issue(client, ws, member, body, who="admin@t.test"):
    return client.post(f"/api/v1/members/{ws.ids.members[member]}/tokens", json=body, headers=ws.headers(who))


def test_a_token_issued_by_api_shows_its_secret_once_and_works(client, ws):
    response = issue(client, ws, "n1@t.test", {"name": "phone", "abilities": ["leads:read"], "expires_in_days": 30})
    assert response.status_code == 201, response.json
    data = response.json["data"]
    assert data["secret"].startswith("lsk_") and data["member"]["id"] == ws.ids.members["n1@t.test"]
    assert data["expires_at"] is not None and data["last_used_at"] is None
    assert client.get("/api/v1/leads", headers=bearer(data["secret"])).status_code == 200
    listed = client.get(f"/api/v1/tokens?filter[member]={ws.ids.members['n1@t.test']}", headers=ws.headers())
    row = next(t for t in listed.json["data"] if t["id"] == data["id"])
    assert "secret" not in row and row["last_used_at"] is not None
    assert data["secret"] not in listed.get_data(as_text=True)
    assert Token.get(Token.public_id == data["id"]).secret_hash != data["secret"]


@pytest.mark.parametrize("body, field", [
    ({"name": "x", "abilities": ["leads:assign"]}, "abilities"),   # agents may not hold it
    ({"name": "x", "abilities": ["members:manage"]}, "abilities"),
    ({"name": "x", "abilities": ["leads:fly"]}, "abilities"),
    ({"name": "x", "abilities": []}, "abilities"),
    ({"name": "x", "abilities": ["*"], "expires_in_days": 0}, "expires_in_days"),
    ({"abilities": ["*"]}, "name"),
])
def test_a_token_the_role_may_not_hold_is_422_on_its_field(client, ws, body, field):
    tokens = Token.select().where(Token.member == ws.member("n1@t.test").id)
    before = tokens.count()
    response = issue(client, ws, "n1@t.test", body)
    assert response.status_code == 422 and field in response.json["errors"], response.json
    assert tokens.count() == before


def test_tokens_are_listed_in_keyset_pages(client, ws):
    for n in range(3):
        assert issue(client, ws, "n2@t.test", {"name": f"t{n}", "abilities": ["leads:read"]}).status_code == 201
    url, seen = f"/api/v1/tokens?filter[member]={ws.ids.members['n2@t.test']}&page[size]=2", []
    while url:
        page = client.get(url, headers=ws.headers())
        assert page.status_code == 200
        seen += [t["name"] for t in page.json["data"]]
        url = page.json["links"]["next"]
    assert sorted(seen) == ["t0", "t1", "t2"]


def test_any_token_lists_and_revokes_its_own_members_tokens_only(client, ws):
    mine = issue(client, ws, "n1@t.test", {"name": "mine", "abilities": ["leads:read"]}).json["data"]
    theirs = issue(client, ws, "n2@t.test", {"name": "theirs", "abilities": ["leads:read"]}).json["data"]
    agent = ws.headers("n1@t.test", ("leads:read",))
    listed = {t["id"] for t in client.get("/api/v1/tokens", headers=agent).json["data"]}
    assert mine["id"] in listed and theirs["id"] not in listed
    widened = client.get(f"/api/v1/tokens?filter[member]={ws.ids.members['n2@t.test']}", headers=agent)
    assert widened.status_code == 200 and widened.json["data"] == []
    assert client.delete(f"/api/v1/tokens/{theirs['id']}", headers=agent).status_code == 404
    assert client.delete(f"/api/v1/tokens/{mine['id']}", headers=agent).status_code == 204
    assert client.get("/api/v1/leads", headers=bearer(mine["secret"])).status_code == 401
    assert client.get("/api/v1/leads", headers=bearer(theirs["secret"])).status_code == 200
    assert client.delete(f"/api/v1/tokens/{mine['id']}", headers=ws.headers()).status_code == 204   # again: no change


def test_no_token_of_another_workspace_is_listed_or_revoked(client, ws, other_ws):
    theirs = issue(client, other_ws, "n1@t.test", {"name": "theirs", "abilities": ["leads:read"]}).json["data"]
    listed = client.get("/api/v1/tokens?page[size]=200", headers=ws.headers()).json["data"]
    assert theirs["id"] not in {t["id"] for t in listed}
    assert client.delete(f"/api/v1/tokens/{theirs['id']}", headers=ws.headers()).status_code == 404
    assert Token.get(Token.public_id == theirs["id"]).revoked_at is None


def test_least_open_counts_open_leads_among_the_eligible(client, make_lead, make_workspace):
    ws = make_workspace(with_rules({"name": "North", "assign": {"team": "North", "strategy": "least_open"}},
                                   members=with_members(n1={"max_open_leads": 1})))
    owners = [owner_email(ws, make_lead(ws)).split("@")[0] for _ in range(3)]
    assert owners == ["n1", "n2", "n2"]   # n1 has fewest first; then it is full, and n2 takes the rest


@pytest.mark.parametrize("cap", [-1, 1.5, "2"])
def test_a_setup_file_cap_must_be_an_integer_of_0_or_more(cap):
    data = standard_setup("Caps")
    data["members"][3]["max_open_leads"] = cap
    with pytest.raises(SetupError) as failure:
        parse_setup(data)
    assert "members[3].max_open_leads" in str(failure.value)
