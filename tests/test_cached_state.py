"""State kept for speed stays exact: cached reference tables, open-lead counts, synthetic leads."""

from __future__ import annotations

from datetime import datetime

import peewee as pw
import phonenumbers

from leadsvc import bulk_load, pipeline
from leadsvc.refs import Refs
from leadsvc.models import (CHANNELS, NEVER, Activity, Lead, Member, OpenLeadCount, Rule, Source, Status, Transition,
                            Workspace)


def real_open_counts(workspace_public_id: str) -> dict[int, int]:
    workspace = Workspace.get(Workspace.public_id == workspace_public_id)
    return dict(Lead.select(Lead.owner, pw.fn.COUNT(Lead.id)).join(Status)
                .where((Lead.workspace == workspace.id) & Lead.owner.is_null(False) & (Status.kind == "open"))
                .group_by(Lead.owner).tuples())


def kept_open_counts(workspace_public_id: str) -> dict[int, int]:
    workspace = Workspace.get(Workspace.public_id == workspace_public_id)
    members = Member.select(Member.id).where(Member.workspace == workspace.id)
    return {member: count for member, count in OpenLeadCount.select(OpenLeadCount.member, OpenLeadCount.open_leads)
            .where(OpenLeadCount.member.in_(members)).tuples() if count}


def test_renamed_member_shows_at_once_in_lead_documents(client, make_lead, ws):
    lead = make_lead(ws, phone="+919876500001", last_name=None, source=None)
    owner = lead["owner"]["id"]
    assert client.get("/api/v1/leads", headers=ws.headers()).status_code == 200   # reference tables cached

    Member.update(name="Renamed Agent").where(Member.public_id == owner).execute()

    listed = client.get("/api/v1/leads", headers=ws.headers()).get_json()["data"]
    assert {row["owner"]["name"] for row in listed if row["owner"]["id"] == owner} == {"Renamed Agent"}


def test_new_source_is_usable_at_once(client, make_lead, ws):
    assert client.get("/api/v1/leads", headers=ws.headers()).status_code == 200
    workspace = Workspace.get(Workspace.public_id == ws.public_id)
    source = Source.create(workspace=workspace, name="Hoarding", score=3)

    lead = make_lead(ws, phone="+919876500002", last_name=None, source=source.public_id)

    assert lead["source"] == {"id": source.public_id, "name": "Hoarding"}


def test_a_changed_rule_routes_the_next_lead_and_routing_itself_keeps_the_cache(client, make_lead, make_workspace):
    ws = make_workspace(lambda data: data.update(rules=[{"name": "North", "assign": {"team": "North",
                                                                                     "strategy": "round_robin"}}]))
    workspace = Workspace.get(Workspace.public_id == ws.public_id)
    make_lead(ws, phone="+919876500003", last_name=None, source=None)   # rules cached, the rule's rotation advanced
    version = Workspace.get_by_id(workspace.id).refs_version
    make_lead(ws, phone="+919876500004", last_name=None, source=None)
    assert Workspace.get_by_id(workspace.id).refs_version == version, "routing bumped the cache version"

    sid = Member.get(Member.public_id == ws.ids.members["s1@t.test"])
    Rule.create(workspace=workspace, name="All to Sid", position=-1, strategy="member", member=sid, conditions={})

    assert make_lead(ws, phone="+919876500005", last_name=None, source=None)["owner"]["id"] == sid.public_id
    Rule.update(member=Member.get(Member.public_id == ws.ids.members["n1@t.test"])).where(
        Rule.name == "All to Sid").execute()
    lead = make_lead(ws, phone="+919876500006", last_name=None, source=None)
    assert lead["owner"]["id"] == ws.ids.members["n1@t.test"]


def test_open_lead_counts_follow_creates_moves_reassignments_and_status_kinds(client, make_lead, ws):
    leads = [make_lead(ws, phone=f"+91987650010{i}", last_name=None, source=None) for i in range(4)]
    assert kept_open_counts(ws.public_id) == real_open_counts(ws.public_id)

    lost = ws.ids.statuses["Lost"]
    assert client.post(f"/api/v1/leads/{leads[0]['id']}/status", json={"status": lost},
                       headers=ws.headers()).status_code == 200
    agent = ws.ids.members["s1@t.test"]
    assert client.patch(f"/api/v1/leads/{leads[1]['id']}", json={"owner": agent},
                        headers=ws.headers()).status_code == 200
    assert kept_open_counts(ws.public_id) == real_open_counts(ws.public_id)

    Status.update(kind="won").where(Status.public_id == ws.ids.statuses["New"]).execute()
    assert kept_open_counts(ws.public_id) == real_open_counts(ws.public_id) == {}


def test_least_open_routing_gives_the_lead_to_the_agent_with_fewest_open_leads(client, make_lead, make_workspace):
    def least_open_north(data):
        data["rules"] = [{"name": "North by load", "when": {}, "assign": {"team": "North", "strategy": "least_open"}}]
    ws = make_workspace(least_open_north)
    owners = [make_lead(ws, phone=f"+91987650020{i}", last_name=None, source=None)["owner"]["id"] for i in range(4)]
    n1, n2 = ws.ids.members["n1@t.test"], ws.ids.members["n2@t.test"]
    assert sorted(owners) == sorted([n1, n1, n2, n2])

    n1_lead = next(lead for lead in client.get("/api/v1/leads", headers=ws.headers()).get_json()["data"]
                   if lead["owner"]["id"] == n1)
    assert client.post(f"/api/v1/leads/{n1_lead['id']}/status", json={"status": ws.ids.statuses["Lost"]},
                       headers=ws.headers()).status_code == 200

    assert make_lead(ws, phone="+919876500299", last_name=None, source=None)["owner"]["id"] == n1


def test_synthetic_leads_keep_every_invariant_the_api_relies_on(client, ws):
    workspace = Workspace.get(Workspace.public_id == ws.public_id)
    assert bulk_load.add_leads(workspace, 300, seed=7) == 300

    refs = Refs.load(workspace, client.application.config["LEADSVC"])
    first = refs.first_status()
    leads = list(Lead.select().where(Lead.workspace == workspace.id))
    assert len(leads) == 300
    for lead in leads:
        assert lead.phone or lead.email
        if lead.phone:
            parsed = phonenumbers.parse(lead.phone, "IN")
            assert phonenumbers.number_type(parsed) == phonenumbers.PhoneNumberType.MOBILE
            assert phonenumbers.format_number(parsed, phonenumbers.PhoneNumberFormat.E164) == lead.phone
        if lead.email:
            assert lead.email == lead.email.lower()
        assert lead.team_id == refs.members[lead.owner_id].team_id
        assert lead.activity_sort_at == (lead.last_activity_at or NEVER)
        assert lead.version == 1
        # Where it came from, as the create path records it.
        assert lead.channel in CHANNELS and lead.connector_id is None
        assert pipeline.first_touch(lead.attribution) == (lead.attribution, lead.campaign)
        assert Activity.get((Activity.lead == lead.id) & (Activity.kind == "created")).data == {"via": lead.channel}
        chain = list(Transition.select().where(Transition.lead == lead.id).order_by(Transition.at, Transition.id))
        assert chain[0].from_status_id is None and chain[0].to_status_id == first.id
        assert chain[0].at == lead.created_at
        for before, after in zip(chain, chain[1:]):
            assert after.from_status_id == before.to_status_id
            assert refs.statuses[after.to_status_id].public_id in refs.statuses[before.to_status_id].next_ids(
                refs.pipeline())
            assert after.seconds_in_from == int((after.at - before.at).total_seconds())
        assert chain[-1].to_status_id == lead.status_id and chain[-1].at == lead.status_changed_at
        assert lead.created_at <= lead.updated_at <= datetime.utcnow()
        expected = Lead(**lead.__data__)
        pipeline.rescore(expected, refs)
        assert (lead.score, lead.score_reasons) == (expected.score, expected.score_reasons)
    assert kept_open_counts(ws.public_id) == real_open_counts(ws.public_id)

    page = client.get("/api/v1/leads?page[size]=200", headers=ws.headers())
    assert page.status_code == 200 and len(page.get_json()["data"]) == 200


def test_synthetic_leads_never_clash_with_existing_ones(client, ws):
    workspace = Workspace.get(Workspace.public_id == ws.public_id)
    bulk_load.add_leads(workspace, 50, seed=3)

    assert bulk_load.add_leads(workspace, 50, seed=3) == 50   # the same seed again: new numbers

    assert Lead.select().where(Lead.workspace == workspace.id).count() == 100


def test_a_bulk_load_samples_its_statistics_on_the_writer_connection(client, ws, backend, monkeypatch):
    # SQLite: ANALYZE sampling each index (a full ANALYZE of a large load reads every index
    # whole), on the connection that holds the load's settings; PostgreSQL: VACUUM (ANALYZE).
    from leadsvc.db import database, is_postgres

    statistics = []
    run = type(database.obj).execute_sql

    def spy(self, sql, params=None, *args, **kwargs):
        if "ANALYZE" in sql:
            limit = None if is_postgres() else run(self, "PRAGMA analysis_limit").fetchone()[0]
            statistics.append((sql, limit))
        return run(self, sql, params, *args, **kwargs)

    monkeypatch.setattr(type(database.obj), "execute_sql", spy)
    workspace = Workspace.get(Workspace.public_id == ws.public_id)
    bulk_load.add_leads(workspace, 20, seed=5)
    expected = ("VACUUM (ANALYZE) lead, lead_name_part, transition, activity, task, timer", None) if is_postgres() else ("ANALYZE", 1000)
    assert statistics == [expected]
