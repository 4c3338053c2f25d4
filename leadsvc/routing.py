"""Distribution rules: who gets a new lead, and why. API creates, web forms and imports all call `route`.

Rules are tried in position order; the first whose conditions all hold and that has someone
eligible to give the lead to assigns it. Otherwise the fallback is round robin over every active
agent of the workspace, and with nobody eligible there the lead stays unassigned. Eligible is
active, available and under both caps (DESIGN section 20), as a `Gate` says. `Router` is that
choice; where its state lives is a `Turns`: in the database for the API, web forms and imports
(`route`, with `DatabaseGate`), in memory for synthetic demo data (no gate: every active agent).

In the database, rotation state is on the rule (or, for the fallback, the workspace) that
rotates, and the create transaction locks that one row before reading it; least-open locks the
rule before it reads the open-lead counts. So creates routed by the same rule take turns across
processes; within one, a workspace's creates queue before they begin (db.transaction's turn).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any, Callable, Iterable, Mapping, Protocol
from zoneinfo import ZoneInfo

import peewee as pw

from .db import database, for_update
from .models import Lead, Member, OpenLeadCount, Rule, Status, Workspace, utcnow


# Why a member was passed over (the `assigned` activity's `skipped`): not working, or full.
SKIP_REASONS = ("inactive", "away", "on_leave", "max_open_leads", "daily_leads")


@dataclass(frozen=True)
class Assignment:
    member: Member | None
    # What the `assigned` activity records: rule, strategy, member, and the members skipped and why.
    reason: dict[str, Any]
    team_id: int | None = None   # the lead's team: its owner's, or (unassigned) the matching rule's

    @property
    def summary(self) -> str:
        how = self.reason["strategy"].replace("_", " ")
        by = f" by rule {self.reason['rule_name']!r}" if self.reason.get("rule") else ""
        skipped = "; ".join(f"{s['name']} ({s['reason']})" for s in self.reason.get("skipped", ()))
        if self.member is None:
            return f"Left unassigned{by} ({how}): nobody was eligible" + (f"; skipped {skipped}." if skipped else ".")
        return f"Assigned to {self.member.name}{by} ({how})" + (f"; skipped {skipped}." if skipped else ".")


def availability_of(member: Any, now: datetime) -> str:
    """The member's availability as of now: away or on leave until a time that has passed is
    available again, without anything having to run."""
    if member.availability != "available" and member.until is not None and member.until <= now:
        return "available"
    return member.availability


def until_of(member: Any, now: datetime) -> datetime | None:
    """When the member's away or leave ends (None: it is available, or until changed again)."""
    return None if availability_of(member, now) == "available" else member.until


class Gate(Protocol):
    """Who may take a lead now: availability and the caps. `refusal` screens a candidate from what
    it can see; `take` is the final word, counting the lead against the chosen member's caps."""

    def refusal(self, member: Any) -> str | None:
        """Why the member may not get a lead now (a SKIP_REASONS value), or None."""

    def take(self, member: Any) -> str | None:
        """Give the member the lead unless a cap forbids it now (then why), atomically."""


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

    def assign(self, lead: Mapping[str, Any], turns: Turns, gate: Gate | None = None) -> Assignment:
        """Who gets a lead ({source: src public id, estimated_value, custom_fields}), and why.

        A strategy picks among the eligible members only (gate: available and under both caps),
        so a rotation moves among them. When a rule has nobody eligible the next matching rule is
        tried, then the fallback; when nobody is, the lead stays unassigned in the matching rule's team."""
        skipped: dict[int, str] = {}   # member id -> why, in the order met
        first_match = None
        for rule in self.rules:
            if not matches(rule.conditions, lead):
                continue
            if rule.strategy == "member":
                member = self.members.get(rule.member_id)
                if member is None:
                    continue
                first_match = first_match or (rule, member.team_id)
                if not member.active:
                    skipped.setdefault(member.id, "inactive")
                    continue
                chosen = self._choose([member], lambda pool: pool[0], gate, skipped)
            else:
                first_match = first_match or (rule, rule.team_id)
                team = [agent for agent in self.agents if agent.team_id == rule.team_id]
                pick = ((lambda pool, rule=rule: turns.least_open(rule, pool)) if rule.strategy == "least_open"
                        else (lambda pool, rule=rule: turns.after_last(rule, pool)))
                chosen = self._choose(team, pick, gate, skipped)
            if chosen is not None:   # None: no one eligible, or the rule is gone
                return self._assignment(chosen, rule, skipped)
        chosen = self._choose(self.agents, lambda pool: turns.after_last(None, pool), gate, skipped)
        if chosen is None and first_match is not None:
            rule, team_id = first_match
            return self._assignment(None, rule, skipped, team_id)
        return self._assignment(chosen, None, skipped)

    @staticmethod
    def _choose(candidates: list[Any], pick: Callable[[list[Any]], Any | None], gate: Gate | None,
                skipped: dict[int, str]) -> Any | None:
        """The member `pick` chooses among the eligible candidates that the gate lets take the
        lead; one that a cap stops at the last moment (a concurrent create filled it) is skipped
        and the choice is made again among the rest."""
        pool = []
        for member in candidates:
            why = skipped.get(member.id) or (gate.refusal(member) if gate else None)
            if why is None:
                pool.append(member)
            else:
                skipped.setdefault(member.id, why)
        while pool:
            member = pick(pool)
            if member is None:
                return None
            why = gate.take(member) if gate else None
            if why is None:
                return member
            skipped[member.id] = why
            pool.remove(member)
        return None

    def _assignment(self, member: Any | None, rule: Any | None, skipped: dict[int, str],
                    team_id: int | None = None) -> Assignment:
        reason = {"rule": rule.public_id if rule else None, "strategy": rule.strategy if rule else "round_robin",
                  "member": member.public_id if member else None}
        if rule is not None:
            reason["rule_name"] = rule.name
        reason["skipped"] = [{"member": self.members[mid].public_id, "name": self.members[mid].name, "reason": why}
                             for mid, why in skipped.items()]
        return Assignment(member, reason, member.team_id if member is not None else team_id)


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


def local_day(moment: datetime, timezone: str) -> date:
    """The day a naive UTC moment falls on in a time zone (a workspace's day for daily_leads)."""
    return moment.replace(tzinfo=UTC).astimezone(ZoneInfo(timezone)).date()


class DatabaseGate:
    """Availability from the (cached) member rows; the caps on open_lead_count, where the open
    leads are counted by triggers and the leads routed today by `take`.

    `refusal` reads the counts of the workspace's capped members once per create, and only when a
    capped member is a candidate. `take` is one conditional upsert of the chosen member's row: it
    counts the lead for today only if both caps still allow it, and the row stays locked until the
    create commits, so the lead's insert (whose trigger adds to open_leads) lands before any other
    create reads the row. Concurrent creates therefore never push a member past a cap."""

    def __init__(self, workspace: Workspace, members: Iterable[Member], now: datetime):
        self.now = now
        self.today = local_day(now, workspace.timezone)
        self.capped = [m.id for m in members if m.max_open_leads is not None or m.daily_leads is not None]
        self.loads: dict[int, tuple[int, date | None, int]] | None = None

    def _load(self, member: Member) -> tuple[int, int]:
        """The member's open leads and the leads routed to it today."""
        if self.loads is None:
            rows = (OpenLeadCount.select(OpenLeadCount.member, OpenLeadCount.open_leads, OpenLeadCount.routed_on,
                                         OpenLeadCount.routed_today)
                    .where(OpenLeadCount.member.in_(self.capped)).tuples())
            self.loads = {member_id: (open_leads, day, routed) for member_id, open_leads, day, routed in rows}
        open_leads, day, routed = self.loads.get(member.id, (0, None, 0))
        return open_leads, routed if day == self.today else 0

    def _over(self, member: Member, open_leads: int, routed_today: int) -> str | None:
        if member.max_open_leads is not None and open_leads >= member.max_open_leads:
            return "max_open_leads"
        if member.daily_leads is not None and routed_today >= member.daily_leads:
            return "daily_leads"
        return None

    def refusal(self, member: Member) -> str | None:
        availability = availability_of(member, self.now)
        if availability != "available":
            return availability
        if member.max_open_leads is None and member.daily_leads is None:
            return None
        return self._over(member, *self._load(member))

    def take(self, member: Member) -> str | None:
        params = (member.id, OpenLeadCount.routed_on.db_value(self.today),
                  member.max_open_leads, member.max_open_leads, member.daily_leads, member.daily_leads)
        take = TAKE.format(p=database.param)
        if member.max_open_leads is None and member.daily_leads is None:
            database.execute_sql(take, params)
            return None
        # In a savepoint: PostgreSQL locks the row even when the cap refuses, and this create may
        # go on to lock another rule's row, which a create waiting for this row may hold. Rolling
        # the savepoint back lets the row go.
        with database.atomic() as savepoint:
            if database.execute_sql(take, params).fetchone() is not None:
                return None
            savepoint.rollback()
        current = OpenLeadCount.get_by_id(member.id)
        return self._over(member, current.open_leads,
                          current.routed_today if current.routed_on == self.today else 0) or "max_open_leads"


# `take` as one statement: count the lead as routed to the member today unless a cap (NULL: none)
# forbids it, RETURNING the member when it was counted. Written as SQL text because peewee builds
# an upsert afresh on every call, which costs more than the database's work on each create.
TAKE = ("INSERT INTO open_lead_count (member_id, open_leads, routed_on, routed_today) VALUES ({p}, 0, {p}, 1) "
        "ON CONFLICT (member_id) DO UPDATE SET "
        "routed_today = CASE WHEN open_lead_count.routed_on = excluded.routed_on "
        "THEN open_lead_count.routed_today + 1 ELSE 1 END, routed_on = excluded.routed_on "
        "WHERE (CAST({p} AS INTEGER) IS NULL OR open_lead_count.open_leads < {p}) "
        "AND (CAST({p} AS INTEGER) IS NULL OR open_lead_count.routed_on IS NULL "
        "OR open_lead_count.routed_on <> excluded.routed_on OR open_lead_count.routed_today < {p}) "
        "RETURNING member_id")


def route(workspace: Workspace, lead: Mapping[str, Any], members: Mapping[int, Member], rules: list[Rule]) -> Assignment:
    """Choose the owner of a new lead among the workspace's members (by internal id), by its rules
    in order (as cached with the reference tables). Call inside the create transaction: the state a
    strategy reads, and the chosen member's caps, are locked there until the lead is written."""
    gate = DatabaseGate(workspace, members.values(), utcnow())
    return Router(members.values(), rules).assign(lead, DatabaseTurns(workspace.id), gate)


def recount_open_leads(workspace_id: int) -> None:
    """Count the workspace's open leads per owner afresh (after a bulk load that set the triggers
    aside), keeping each member's count of the leads routed today."""
    members = Member.select(Member.id).where(Member.workspace == workspace_id)
    OpenLeadCount.update(open_leads=0).where(OpenLeadCount.member.in_(members)).execute()
    counts = (Lead.select(Lead.owner, pw.fn.COUNT(Lead.id)).join(Status)
              .where((Lead.workspace == workspace_id) & Lead.owner.is_null(False) & Lead.merged_into.is_null()
                     & (Status.kind == "open"))
              .group_by(Lead.owner))
    (OpenLeadCount.insert_from(counts, [OpenLeadCount.member, OpenLeadCount.open_leads])
     .on_conflict(conflict_target=[OpenLeadCount.member], update={OpenLeadCount.open_leads: pw.EXCLUDED.open_leads})
     .execute())
