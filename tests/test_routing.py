"""Distribution rules: ordered rules, strategies, fallback, inactive members, reasons."""

from collections import Counter

from conftest import owner_email, with_rules
from leadsvc.models import Activity, Lead, Member, Rule


def assigned_reason(lead) -> dict:
    row = Lead.get(Lead.public_id == lead["id"])
    return Activity.get((Activity.lead == row.id) & (Activity.kind == "assigned")).data


def test_round_robin_over_two_agents_across_20_creates_gives_each_10(client, make_lead, make_workspace):
    ws = make_workspace(with_rules({"name": "North", "assign": {"team": "North", "strategy": "round_robin"}}))
    owners = Counter(owner_email(ws, make_lead(ws)) for _ in range(20))
    assert owners == {"n1@t.test": 10, "n2@t.test": 10}


def test_rules_apply_in_position_order_and_the_first_match_wins(client, make_lead, make_workspace):
    ws = make_workspace(with_rules(
        {"name": "Referrals to Sid", "when": {"source": ["Referral"]}, "assign": {"member": "s1@t.test"}},
        {"name": "Everything to Nora", "assign": {"member": "n2@t.test"}},
    ))
    referral = make_lead(ws, source=ws.ids.sources["Referral"])
    website = make_lead(ws, source=ws.ids.sources["Website"])
    assert owner_email(ws, referral) == "s1@t.test" and owner_email(ws, website) == "n2@t.test"
    assert assigned_reason(referral)["rule"] == ws.ids.rules["Referrals to Sid"]


def test_custom_field_and_value_conditions(client, make_lead, make_workspace):
    ws = make_workspace(with_rules(
        {"name": "Villas", "when": {"custom_fields": {"product_interest": ["villa"]}}, "assign": {"member": "n1@t.test"}},
        {"name": "Big", "when": {"estimated_value_gte": 1000000}, "assign": {"member": "n2@t.test"}},
        {"name": "Small", "when": {"estimated_value_lt": 1000}, "assign": {"member": "s1@t.test"}},
        {"name": "Rest", "assign": {"member": "smgr@t.test"}},
    ))
    assert owner_email(ws, make_lead(ws, custom_fields={"product_interest": "villa"})) == "n1@t.test"
    assert owner_email(ws, make_lead(ws, estimated_value=1000000)) == "n2@t.test"
    assert owner_email(ws, make_lead(ws, estimated_value=999)) == "s1@t.test"
    assert owner_email(ws, make_lead(ws, estimated_value=5000)) == "smgr@t.test"
    assert owner_email(ws, make_lead(ws)) == "smgr@t.test", "no value: value conditions do not hold"


def test_least_open_gives_the_lead_to_the_agent_with_fewest_open_leads(client, make_lead, make_workspace):
    ws = make_workspace(with_rules({"name": "North", "assign": {"team": "North", "strategy": "least_open"}}))
    first = make_lead(ws)
    second = make_lead(ws)
    assert {owner_email(ws, first), owner_email(ws, second)} == {"n1@t.test", "n2@t.test"}
    # Close the first lead: its owner now has fewer open leads and gets the next one.
    lost = ws.ids.statuses["Lost"]
    assert client.post(f"/api/v1/leads/{first['id']}/status", json={"status": lost},
                       headers=ws.headers()).status_code == 200
    assert owner_email(ws, make_lead(ws)) == owner_email(ws, first)
    assert assigned_reason(second)["strategy"] == "least_open"


def test_inactive_members_never_receive_leads(client, make_lead, make_workspace):
    def deactivate_n1(members):
        return [{**m, "active": False} if m["email"] == "n1@t.test" else m for m in members]
    ws = make_workspace(with_rules(
        {"name": "Neel", "assign": {"member": "n1@t.test"}},
        {"name": "North", "assign": {"team": "North", "strategy": "round_robin"}},
        members=deactivate_n1,
    ))
    owners = {owner_email(ws, make_lead(ws)) for _ in range(4)}
    assert owners == {"n2@t.test"}


def test_fallback_is_round_robin_over_all_active_agents(client, make_lead, ws):
    owners = Counter(owner_email(ws, make_lead(ws)) for _ in range(6))
    assert owners == {"n1@t.test": 2, "n2@t.test": 2, "s1@t.test": 2}
    assert assigned_reason(make_lead(ws)) == {"rule": None, "strategy": "round_robin",
                                              "member": ws.ids.members["n1@t.test"], "skipped": []}


def test_a_team_without_active_agents_falls_through_to_the_next_rule(client, make_lead, make_workspace):
    ws = make_workspace(with_rules(
        {"name": "South", "assign": {"team": "South", "strategy": "round_robin"}},
        {"name": "Nora", "assign": {"member": "n2@t.test"}},
    ))
    Member.update(active=False).where(Member.public_id == ws.ids.members["s1@t.test"]).execute()
    assert owner_email(ws, make_lead(ws)) == "n2@t.test"


def test_the_lead_joins_its_owners_team(client, make_lead, make_workspace):
    ws = make_workspace(with_rules({"name": "Sid", "assign": {"member": "s1@t.test"}}))
    lead = make_lead(ws)
    assert lead["team"] == {"id": ws.ids.teams["South"], "name": "South"}


def test_rotation_state_is_kept_in_the_database(client, make_lead, make_workspace, make_app):
    ws = make_workspace(with_rules({"name": "North", "assign": {"team": "North", "strategy": "round_robin"}}))
    first = owner_email(ws, make_lead(ws))
    rule = Rule.get(Rule.public_id == ws.ids.rules["North"])
    assert rule.rotation_last_member_id == ws.member(first).id
    # Another app (another process would be the same) continues the rotation.
    other_client = make_app().test_client()
    second = owner_email(ws, make_lead(ws, via=other_client))
    assert {first, second} == {"n1@t.test", "n2@t.test"}


def test_every_assignment_records_rule_strategy_and_member(client, make_lead, make_workspace):
    ws = make_workspace(with_rules({"name": "North", "assign": {"team": "North", "strategy": "round_robin"}}))
    lead = make_lead(ws)
    reason = assigned_reason(lead)
    assert reason == {"rule": ws.ids.rules["North"], "rule_name": "North", "strategy": "round_robin",
                      "member": lead["owner"]["id"], "skipped": []}
    row = Lead.get(Lead.public_id == lead["id"])
    summary = Activity.get((Activity.lead == row.id) & (Activity.kind == "assigned")).summary
    assert "North" in summary and lead["owner"]["name"] in summary


def test_a_rule_deleted_after_it_was_read_falls_through_to_the_fallback(client, make_workspace):
    # The rules come from the per-process cache; one deleted meanwhile has no row to rotate.
    from leadsvc import routing
    from leadsvc.db import database
    from leadsvc.refs import Refs
    from leadsvc.config import load_settings
    from leadsvc.models import Rule, Workspace

    ws = make_workspace(with_rules({"name": "North", "assign": {"team": "North", "strategy": "round_robin"}}))
    workspace = Workspace.get(Workspace.public_id == ws.public_id)
    refs = Refs.load(workspace, load_settings("/dev/null"))
    Rule.delete().where(Rule.workspace == workspace.id).execute()
    with database.atomic():
        assignment = routing.route(workspace, {"source": None, "custom_fields": {}}, refs.members, refs.rules)
    assert assignment.reason["rule"] is None and assignment.reason["strategy"] == "round_robin"
    assert assignment.member is not None and assignment.member.role == "agent"
