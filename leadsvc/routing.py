"""Distribution rules: who gets a new lead, and why. API creates, web forms and imports all call `route`.

Rules are tried in position order; the first whose conditions all hold and that has someone
active to give the lead to assigns it. Otherwise the fallback is round robin over every active
agent of the workspace. Rotation state lives in the database, on the rule (or, for the fallback,
the workspace) that rotates. The create transaction locks that one row: a rotation advances in
one UPDATE that locks it, least-open locks the rule before it reads the open-lead counts. So
creates routed by the same rule take turns (across processes), and creates routed by different
rules do not wait for each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Mapping

import peewee as pw

from .db import Prepared, database, for_update
from .models import Lead, Member, OpenLeadCount, Rule, Status, Workspace


@dataclass(frozen=True)
class Assignment:
    member: Member | None
    reason: dict[str, Any]   # what the `assigned` activity records: rule, strategy, member

    @property
    def summary(self) -> str:
        who = self.member.name if self.member else "nobody"
        how = self.reason["strategy"].replace("_", " ")
        if self.reason.get("rule"):
            return f"Assigned to {who} by rule {self.reason['rule_name']!r} ({how})."
        return f"Assigned to {who} ({how})."


def matches(conditions: Mapping[str, Any], lead: Mapping[str, Any]) -> bool:
    """Whether a lead's fields ({source: src public id, estimated_value, custom_fields}) meet a rule."""
    if "source" in conditions and lead.get("source") not in conditions["source"]:
        return False
    custom = lead.get("custom_fields") or {}
    for key, allowed in (conditions.get("custom_fields") or {}).items():
        if key not in custom or custom[key] not in allowed:
            return False
    value = lead.get("estimated_value")
    if "estimated_value_gte" in conditions and (value is None or value < Decimal(str(conditions["estimated_value_gte"]))):
        return False
    if "estimated_value_lt" in conditions and (value is None or value >= Decimal(str(conditions["estimated_value_lt"]))):
        return False
    return True


# Each create runs them: their SQL is built once per database.
_open_leads_in_team = Prepared(lambda team: OpenLeadCount.select(OpenLeadCount.member, OpenLeadCount.open_leads)
                               .join(Member).where(Member.team == team))
_locked_rule = Prepared(lambda rule: for_update(Rule.select(Rule.id).where(Rule.id == rule)))


def route(workspace_id: int, lead: Mapping[str, Any], members: Mapping[int, Member], rules: list[Rule]) -> Assignment:
    """Choose the owner of a new lead among the workspace's members (by internal id), by its rules
    in order (as cached with the reference tables). Call inside the create transaction: the state a
    strategy reads is locked there until the lead is written."""
    agents = sorted((m for m in members.values() if m.active and m.role == "agent"), key=lambda m: m.id)
    for rule in rules:
        if not matches(rule.conditions, lead):
            continue
        reason = {"rule": rule.public_id, "rule_name": rule.name, "strategy": rule.strategy}
        if rule.strategy == "member":
            member = members.get(rule.member_id)
            member = member if member is not None and member.active else None
        else:
            team = [agent for agent in agents if agent.team_id == rule.team_id]
            if not team:
                continue
            if rule.strategy == "least_open":
                member = _least_open(team) if _lock_rule(rule.id) else None
            else:
                member = _rotate(Rule, rule.id, team)
        if member is not None:   # None: no one to give it to, or the rule is gone
            return Assignment(member, {**reason, "member": member.public_id})
    member = _rotate(Workspace, workspace_id, agents) if agents else None
    return Assignment(member, {"rule": None, "strategy": "round_robin",
                               "member": member.public_id if member else None})


def _lock_rule(rule_id: int) -> bool:
    """Lock the rule's row until the transaction ends (SQLite: already the only writer); False
    when the rule is gone."""
    return bool(_locked_rule(rule_id))


_rotate_sql: dict[tuple[int, type, int], str] = {}


def _rotate(model: type[Rule] | type[Workspace], holder_id: int, agents: list[Member]) -> Member | None:
    """The agent after the holder's last one (by id, wrapping around), recorded as its new last
    one by one UPDATE, which also locks the holder's row until the transaction ends; None when the
    holder is gone. The agents come in id order."""
    key = (id(database.obj), model, len(agents))
    if key not in _rotate_sql:
        table, p = model._meta.table_name, database.param
        _rotate_sql[key] = (
            f'UPDATE "{table}" SET "rotation_last_member_id" = COALESCE('
            f'(SELECT MIN("column1") FROM (VALUES {", ".join([f"({p})"] * len(agents))}) AS "agent" '
            f'WHERE "column1" > COALESCE("{table}"."rotation_last_member_id", 0)), {p}) '
            f'WHERE "id" = {p} RETURNING "rotation_last_member_id"')
    ids = [agent.id for agent in agents]
    rows = database.execute_kept(_rotate_sql[key], [*ids, ids[0], holder_id]).fetchall()
    return next((agent for agent in agents if agent.id == rows[0][0]), None) if rows else None


def _least_open(agents: list[Member]) -> Member:
    """The agent with the fewest open leads; ties go to the earliest member."""
    # Counted by triggers as leads are written: counting here would scan the team's leads.
    counts = {row.member_id: row.open_leads for row in _open_leads_in_team(agents[0].team_id)}
    return min(agents, key=lambda a: (counts.get(a.id, 0), a.id))


def recount_open_leads(workspace_id: int) -> None:
    """Count the workspace's open leads per owner afresh (after a bulk load that set the triggers aside)."""
    members = Member.select(Member.id).where(Member.workspace == workspace_id)
    OpenLeadCount.delete().where(OpenLeadCount.member.in_(members)).execute()
    counts = (Lead.select(Lead.owner, pw.fn.COUNT(Lead.id)).join(Status)
              .where((Lead.workspace == workspace_id) & Lead.owner.is_null(False) & (Status.kind == "open"))
              .group_by(Lead.owner))
    OpenLeadCount.insert_from(counts, [OpenLeadCount.member, OpenLeadCount.open_leads]).execute()
