"""Distribution rules: who gets a new lead, and why. API creates, web forms and imports all call `route`.

Rules are tried in position order; the first whose conditions all hold and that has someone
active to give the lead to assigns it. Otherwise the fallback is round robin over every active
agent of the workspace. `Router` is that choice; where its state lives is a `Turns`: in the
database for the API, web forms and imports (`route`), in memory for synthetic demo data.

In the database, rotation state is on the rule (or, for the fallback, the workspace) that
rotates, and the create transaction locks that one row before reading it; least-open locks the
rule before it reads the open-lead counts. So creates routed by the same rule take turns (across
processes), and creates routed by different rules do not wait for each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Iterable, Mapping, Protocol

import peewee as pw

from .db import for_update
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


class Turns(Protocol):
    """Where a strategy keeps its state: whose turn it is, how many open leads each agent has."""

    def after_last(self, holder: Any, agents: list[Any]) -> Any | None:
        """The agent after the holder's last one (by id, wrapping around), now its last one;
        the holder is a rule, or None for the workspace's fallback rotation."""

    def least_open(self, rule: Any, agents: list[Any]) -> Any | None:
        """The agent with the fewest open leads (ties: the earliest member)."""


def next_after(last_id: int | None, agents: list[Any]) -> Any:
    """The first agent (in id order) after the one with last_id, wrapping around."""
    return next((agent for agent in agents if agent.id > (last_id or 0)), agents[0])


class Router:
    """The workspace's rules in position order, then round robin over all its active agents."""

    def __init__(self, members: Iterable[Any], rules: Iterable[Any]):
        self.members = {member.id: member for member in members}
        self.agents = sorted((m for m in self.members.values() if m.active and m.role == "agent"),
                             key=lambda m: m.id)
        self.rules = list(rules)

    def assign(self, lead: Mapping[str, Any], turns: Turns) -> Assignment:
        """Who gets a lead ({source: src public id, estimated_value, custom_fields}), and why."""
        for rule in self.rules:
            if not matches(rule.conditions, lead):
                continue
            if rule.strategy == "member":
                member = self.members.get(rule.member_id)
                member = member if member is not None and member.active else None
            else:
                team = [agent for agent in self.agents if agent.team_id == rule.team_id]
                if not team:
                    continue
                member = (turns.least_open(rule, team) if rule.strategy == "least_open"
                          else turns.after_last(rule, team))
            if member is not None:   # None: no one to give it to, or the rule is gone
                return Assignment(member, {"rule": rule.public_id, "rule_name": rule.name,
                                           "strategy": rule.strategy, "member": member.public_id})
        member = turns.after_last(None, self.agents) if self.agents else None
        return Assignment(member, {"rule": None, "strategy": "round_robin",
                                   "member": member.public_id if member else None})


class DatabaseTurns:
    """Rotation state on the rule (or, for the fallback, the workspace) row, and open-lead counts
    kept by triggers. Each strategy locks the row it rotates until the transaction ends."""

    def __init__(self, workspace_id: int):
        self.workspace_id = workspace_id

    def after_last(self, holder: Rule | None, agents: list[Member]) -> Member | None:
        # One UPDATE reads the last agent, writes the next (next_after, as SQL) and locks the row.
        model, holder_id = (Workspace, self.workspace_id) if holder is None else (Rule, holder.id)
        last = pw.fn.COALESCE(model.rotation_last_member_id, 0)
        after_last = pw.Case(None, [(last < agent.id, agent.id) for agent in agents], agents[0].id)
        rotated = (model.update(rotation_last_member_id=after_last).where(model.id == holder_id)
                   .returning(model.rotation_last_member_id).tuples().execute())
        chosen = next(iter(rotated), None)
        if chosen is None:
            return None   # the rule was deleted meanwhile
        return next(agent for agent in agents if agent.id == chosen[0])

    def least_open(self, rule: Rule, agents: list[Member]) -> Member | None:
        if for_update(Rule.select(Rule.id).where(Rule.id == rule.id)).first() is None:
            return None
        counts = dict(OpenLeadCount.select(OpenLeadCount.member, OpenLeadCount.open_leads)
                      .where(OpenLeadCount.member.in_([agent.id for agent in agents])).tuples())
        return min(agents, key=lambda a: (counts.get(a.id, 0), a.id))


def route(workspace_id: int, lead: Mapping[str, Any], members: Mapping[int, Member], rules: list[Rule]) -> Assignment:
    """Choose the owner of a new lead among the workspace's members (by internal id), by its rules
    in order (as cached with the reference tables). Call inside the create transaction: the state a
    strategy reads is locked there until the lead is written."""
    return Router(members.values(), rules).assign(lead, DatabaseTurns(workspace_id))


def recount_open_leads(workspace_id: int) -> None:
    """Count the workspace's open leads per owner afresh (after a bulk load that set the triggers aside)."""
    members = Member.select(Member.id).where(Member.workspace == workspace_id)
    OpenLeadCount.delete().where(OpenLeadCount.member.in_(members)).execute()
    counts = (Lead.select(Lead.owner, pw.fn.COUNT(Lead.id)).join(Status)
              .where((Lead.workspace == workspace_id) & Lead.owner.is_null(False) & (Status.kind == "open"))
              .group_by(Lead.owner))
    OpenLeadCount.insert_from(counts, [OpenLeadCount.member, OpenLeadCount.open_leads]).execute()
