"""Distribution rules: who gets a new lead, and why. API creates, web forms and imports all call `route`.

Rules are tried in position order; the first whose conditions all hold and that has someone
active to give the lead to assigns it. Otherwise the fallback is round robin over every active
agent of the workspace. Rotation state lives in the database and is advanced inside the create
transaction, whose workspace lock keeps concurrent creates (across processes) in step.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Mapping

import peewee as pw

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


def route(workspace: Workspace, lead: Mapping[str, Any], members: Mapping[int, Member]) -> Assignment:
    """Choose the owner of a new lead among the workspace's members (by internal id). Call inside
    the create transaction, after locking the workspace: the rules' rotation state is read there."""
    agents = sorted((m for m in members.values() if m.active and m.role == "agent"), key=lambda m: m.id)
    for rule in Rule.select().where(Rule.workspace == workspace.id).order_by(Rule.position, Rule.id):
        if not matches(rule.conditions, lead):
            continue
        reason = {"rule": rule.public_id, "rule_name": rule.name, "strategy": rule.strategy}
        if rule.strategy == "member":
            member = members.get(rule.member_id)
            member = member if member is not None and member.active else None
        else:
            team = [agent for agent in agents if agent.team_id == rule.team_id]
            member = _least_open(team) if rule.strategy == "least_open" else _next_in_rotation(team, rule, Rule)
        if member is not None:
            return Assignment(member, {**reason, "member": member.public_id})
    member = _next_in_rotation(agents, workspace, Workspace)
    return Assignment(member, {"rule": None, "strategy": "round_robin",
                               "member": member.public_id if member else None})


def _next_in_rotation(agents: list[Member], holder: Rule | Workspace, model: type) -> Member | None:
    """The agent after the holder's last one (wrapping), recorded as its new last one."""
    if not agents:
        return None
    last = holder.rotation_last_member_id or 0
    chosen = next((a for a in agents if a.id > last), agents[0])
    model.update(rotation_last_member_id=chosen.id).where(model.id == holder.id).execute()
    holder.rotation_last_member_id = chosen.id
    return chosen


def _least_open(agents: list[Member]) -> Member | None:
    """The agent with the fewest open leads; ties go to the earliest member."""
    if not agents:
        return None
    # Counted by triggers as leads are written: counting here would scan the team's leads.
    counts = dict(OpenLeadCount.select(OpenLeadCount.member, OpenLeadCount.open_leads)
                  .where(OpenLeadCount.member.in_([a.id for a in agents])).tuples())
    return min(agents, key=lambda a: (counts.get(a.id, 0), a.id))


def recount_open_leads(workspace_id: int) -> None:
    """Count the workspace's open leads per owner afresh (after a bulk load that set the triggers aside)."""
    members = Member.select(Member.id).where(Member.workspace == workspace_id)
    OpenLeadCount.delete().where(OpenLeadCount.member.in_(members)).execute()
    counts = (Lead.select(Lead.owner, pw.fn.COUNT(Lead.id)).join(Status)
              .where((Lead.workspace == workspace_id) & Lead.owner.is_null(False) & (Status.kind == "open"))
              .group_by(Lead.owner))
    OpenLeadCount.insert_from(counts, [OpenLeadCount.member, OpenLeadCount.open_leads]).execute()
