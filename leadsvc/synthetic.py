"""Synthetic leads for evaluation and benchmarks (`leadsvc demo --leads N`): the rows they are made of.

The leads look like a year and a half of a real pipeline: created over the last ~18 months,
owned by the agents the workspace's distribution rules would pick (team = the owner's team),
moved through the pipeline by real transition chains (first from null, each next status one the
previous may move to, `seconds_in_from` the time spent there), with `created`, `assigned`,
`status_changed` and logged contact activities, about one follow-up task per lead (most done,
the open ones due around now, some overdue), and scores from `scoring.score_lead`. Every
invariant the API relies on holds: unique valid Indian mobiles and e-mails per workspace,
`activity_sort_at` = last activity or the epoch, `next_task_due_at` and `open_tasks` = the lead's
open tasks, a completed contact task's activity logged, the response due time, first response
and `stale_since` as lead_timers writes them, version 1.

The rows are plain tuples in the column order below, ready for bulk_load.py to write. The history
rows are the system's (no actor token, member or form), as for any import. The same seed,
workspace and starting lead count give the same data.
"""

from __future__ import annotations

import bisect
import itertools
import json
import random
from dataclasses import dataclass
from types import SimpleNamespace
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, Sequence

import peewee as pw

from . import routing, sla
from .pipeline import first_touch
from .models import (BASE62, CONTACT_KINDS, NEVER, NO_TASK, PUBLIC_ID_LENGTH, CustomField, LostReason, Member, Rule,
                     Source, Status, Workspace)
from .scoring import ENGAGEMENT_POINTS, score_lead
from .search import name_key, parts_of, phone_reversed

# Leads per chunk: each chunk has its own random stream, and bulk_load writes each in one transaction.
CHUNK = 10_000
HISTORY_DAYS = 548         # about 18 months
MOBILE_SPACE = 10 ** 8     # +9198 followed by 8 digits
MOBILE_STEP = 48_271_397   # coprime with 10**8: i -> (i * step + offset) % 10**8 is a permutation

FIRST_NAMES = ("Aarav", "Aditi", "Akash", "Ananya", "Arjun", "Asha", "Deepak", "Divya", "Farhan", "Gaurav",
               "Harini", "Ishaan", "Jaya", "Kabir", "Kavya", "Lakshmi", "Manish", "Meera", "Mohan", "Neha",
               "Nikhil", "Pooja", "Pranav", "Priya", "Rahul", "Ravi", "Rohan", "Sanjay", "Shreya", "Sneha",
               "Suresh", "Tanvi", "Uday", "Varun", "Vidya", "Vikram", "Yash", "Zoya", "Imran", "Fatima")
LAST_NAMES = ("Agarwal", "Bhat", "Chopra", "Das", "Desai", "Gupta", "Iyer", "Jain", "Joshi", "Kapoor",
              "Khan", "Kulkarni", "Kumar", "Menon", "Mehta", "Mishra", "Nair", "Pandey", "Patel", "Pillai",
              "Rao", "Reddy", "Saxena", "Shah", "Sharma", "Singh", "Sinha", "Thomas", "Varma", "Yadav")
DOMAINS = ("example.com", "example.in", "mail.test", "inbox.test")
LOCATIONS = ("Whitefield", "Koramangala", "Hebbal", "Andheri", "Powai", "Gachibowli", "Baner", "Salt Lake")
CONTACT_SUMMARIES = {"call": "Called about the site visit.", "email": "Sent the brochure.",
                     "meeting": "Met at the sales office.", "whatsapp": "Shared the floor plans.",
                     "sms": "Reminder about the visit.", "visit": "Walked through the show flat."}
# Follow-ups: how many a lead gets (about one), of which kinds, and what they say.
TASKS_PER_LEAD = (0, 1, 1, 1, 2)
TASK_KINDS_DRAWN = ("call", "call", "call", "whatsapp", "whatsapp", "visit", "meeting", "email", "todo")
TASK_TITLES = {"call": "Call back", "whatsapp": "Send the floor plans on WhatsApp", "visit": "Site visit",
               "meeting": "Meeting at the sales office", "email": "E-mail the price sheet", "todo": "Prepare the quote"}
TASK_OUTCOMES = ("Interested; wants the price sheet.", "No answer; try again.", "Visiting on Sunday.",
                 "Asked for a callback next week.")
# How leads came in (channel, attribution), taken by the lead's number rather than a random draw:
# the same data as before for every other column, and no per-row work beyond an index.
TOUCHES = (
    ("api", None), ("api", None), ("api", None), ("api", None), ("import", None), ("form", None),
    ("form", {"utm_source": "google", "utm_medium": "cpc", "utm_campaign": "villas-search"}),
    ("form", {"utm_source": "google", "utm_medium": "cpc", "utm_campaign": "plots-launch"}),
    ("form", {"utm_source": "facebook", "utm_medium": "paid_social", "utm_campaign": "diwali-offer"}),
    ("form", {"utm_source": "google", "utm_medium": "organic"}),
)
OPEN_TASKS_SINCE = timedelta(days=3)   # an open lead's tasks due after now minus this are still open
# Mean days spent in a status before the next move, and the chance a lead at a stage gives up.
MEAN_DAYS_IN_STATUS = 6.0
LOST_AT_STAGE = 0.22
STAY_AT_STAGE = 0.25
REOPEN = 0.04

_ID_ALPHABET = bytes(ord(BASE62[b % 62]) for b in range(256))


def _plain(row: pw.Model, *fields: str) -> SimpleNamespace:
    return SimpleNamespace(**{name: getattr(row, name) for name in fields})


@dataclass
class _Pipeline:
    forward: list[SimpleNamespace]          # first status, then each next non-lost status in order
    lost: dict[int, SimpleNamespace]        # forward status id -> the lost status it may move to
    reopen: dict[int, SimpleNamespace]      # lost status id -> the status it may reopen to


def _pipeline(statuses: list[Status]) -> _Pipeline:
    by_public = {s.public_id: s for s in statuses}
    ordered = sorted(statuses, key=lambda s: (s.position, s.id))

    def allowed(status: Status) -> list[Status]:
        return [by_public[p] for p in status.next_ids(ordered)]

    forward = [ordered[0]]
    while forward[-1].kind == "open":
        later = [s for s in allowed(forward[-1]) if s.kind != "lost" and s.position > forward[-1].position]
        if not later:
            break
        forward.append(later[0])
    lost = {}
    for status in forward:
        losing = [s for s in allowed(status) if s.kind == "lost"]
        if losing:
            lost[status.id] = losing[0]
    reopen = {}
    for status in {s.id: s for s in lost.values()}.values():
        back = [s for s in allowed(status) if s.id == forward[0].id]
        if back:
            reopen[status.id] = back[0]
    plain = {s.id: _plain(s, "id", "public_id", "name", "kind") for s in statuses}
    return _Pipeline([plain[s.id] for s in forward], {k: plain[s.id] for k, s in lost.items()},
                     {k: plain[s.id] for k, s in reopen.items()})


class _Ids:
    """Public ids from the seeded generator: the model's prefix and 20 base62 characters."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.pool: dict[str, list[str]] = {}

    def __call__(self, prefix: str) -> str:
        pool = self.pool.get(prefix)
        if not pool:
            raw = self.rng.randbytes(PUBLIC_ID_LENGTH * 4096).translate(_ID_ALPHABET).decode("ascii")
            pool = self.pool[prefix] = [prefix + raw[i:i + PUBLIC_ID_LENGTH]
                                        for i in range(0, len(raw), PUBLIC_ID_LENGTH)]
        return pool.pop()


class _Turns:
    """Routing state in memory (routing.Turns): each generator keeps its own rotations, and
    least-open rotates too (the open counts of a fresh pipeline stay even)."""

    def __init__(self) -> None:
        self.last: dict[int | None, int] = {}

    def after_last(self, holder: Any, agents: list[Any]) -> Any:
        key = None if holder is None else holder.id
        agent = routing.next_after(self.last.get(key), agents)
        self.last[key] = agent.id
        return agent

    least_open = after_last


# The order of each row's values; bulk_load names these columns when it writes the rows.
LEAD_COLUMNS = ("id", "workspace_id", "public_id", "first_name", "last_name", "phone", "email", "source_id",
                "status_id", "owner_id", "team_id", "estimated_value", "custom_fields", "score", "score_reasons",
                "engagement", "version", "created_at", "updated_at", "status_changed_at", "last_activity_at",
                "activity_sort_at", "phone_reversed", "lost_reason_id", "name_key", "next_task_due_at", "open_tasks",
                "task_sort_at", "response_due_at", "first_response_at", "first_response_seconds", "response_sort_at",
                "stale_since", "channel", "campaign", "attribution")
NAME_PART_COLUMNS = ("lead_id", "workspace_id", "part")
TRANSITION_COLUMNS = ("workspace_id", "public_id", "lead_id", "from_status_id", "to_status_id", "note", "at",
                      "seconds_in_from", "lost_reason_id")
ACTIVITY_COLUMNS = ("workspace_id", "public_id", "lead_id", "kind", "summary", "data", "occurred_at", "created_at")
TASK_COLUMNS = ("workspace_id", "public_id", "lead_id", "lead_owner_id", "lead_team_id", "kind", "title", "due_at",
                "remind_at", "assignee_id", "state", "done_at", "closed_at", "outcome", "version", "created_at",
                "updated_at")


# One encoder: json.dumps with options builds a new one per call, which costs more than the encoding.
_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def _time(value: datetime) -> str:
    """A naive UTC time as both drivers store it (what peewee's SQLite adapter writes)."""
    return value.isoformat(" ")


NEVER_TEXT = _time(NEVER)
NO_TASK_TEXT = _time(NO_TASK)


def _touch_row(channel: str, sent: dict[str, str] | None) -> tuple[tuple, str]:
    """A touch as its lead's columns (channel, campaign, attribution) and its `created` activity's data."""
    attribution, campaign = first_touch(sent)
    return (channel, campaign, attribution and _dumps(attribution)), _dumps({"via": channel})


TOUCH_ROWS = [_touch_row(*touch) for touch in TOUCHES]


Rows = dict[str, Any]   # {"lead": [...], "name_part": [...], "transition": [...], "activity": [...], "task": [...],
                        #  "size": leads made}


class Generator:
    """Makes the rows of synthetic leads for one workspace, chunk by chunk."""

    def __init__(self, workspace: Workspace, *, seed: int, start: int, now: datetime):
        # Everything is read here, once, into plain objects: attribute access on a model instance
        # costs a descriptor call, and the generator runs in a forked process without the database.
        self.workspace_id = ws = workspace.id
        self.rng = random.Random(f"{seed}:{start}")
        self.ids = _Ids(self.rng)
        self.seed, self.start = seed, start
        self.now = now
        members = [_plain(m, "id", "public_id", "name", "role", "team_id", "active")
                   for m in Member.select().where(Member.workspace == ws).order_by(Member.id)]
        rules = [_plain(r, "id", "public_id", "name", "strategy", "conditions", "member_id", "team_id")
                 for r in Rule.select().where(Rule.workspace == ws).order_by(Rule.position, Rule.id)]
        self.router, self.turns = routing.Router(members, rules), _Turns()
        if not self.router.agents and not rules:
            raise ValueError("The workspace has no active agents to own leads.")
        statuses = list(Status.select().where(Status.workspace == ws))
        if not statuses:
            raise ValueError("The workspace has no pipeline statuses.")
        self.pipeline = _pipeline(statuses)
        self.kind = {s.id: s.kind for s in statuses}
        self.lost_reasons = [_plain(r, "id", "public_id", "name") for r in LostReason.select()
                             .where(LostReason.workspace == ws).order_by(LostReason.position, LostReason.id)]
        self.hours = sla.working_hours(workspace)
        self.response_minutes = workspace.first_response_minutes
        self.stale_days = {s.id: s.stale_after_days for s in statuses}
        self.sources = [_plain(s, "id", "public_id", "name", "score", "first_response_minutes")
                        for s in Source.select().where(Source.workspace == ws).order_by(Source.id)]
        self.source_weights = list(itertools.accumulate(max(1, 30 - 4 * i) for i in range(len(self.sources))))   # cumulative
        self.fields = {f.name: _plain(f, "name", "type", "options", "score")
                       for f in CustomField.select().where(CustomField.workspace == ws)}
        self.field_scores = {name: f.score for name, f in self.fields.items() if f.score}
        self.offset = self.rng.randrange(MOBILE_SPACE)
        self.assignment_text: dict[tuple, tuple[str, str]] = {}

    def created_times(self, count: int) -> list[datetime]:
        """Creation times over the last ~18 months, growing towards now, in ascending order."""
        span = HISTORY_DAYS * 86_400
        # sqrt skews towards recent: a business that grows.
        ages = sorted((span * (1 - self.rng.random() ** 0.5) for _ in range(count)), reverse=True)
        return [self.now - timedelta(seconds=age, microseconds=self.rng.randrange(1_000_000)) for age in ages]

    def pick(self, items: Sequence[Any]) -> Any:
        """A random item: random.choice's exact draw costs several times more, once per row of a large load."""
        return items[int(self.rng.random() * len(items))]

    def custom_fields(self) -> dict[str, Any]:
        rng, values, pick = self.rng, {}, self.pick
        for name, field in self.fields.items():
            if rng.random() > (0.7 if field.type == "choice" else 0.35):
                continue
            if field.type == "choice":
                values[name] = pick(field.options or [""])
            elif field.type == "boolean":
                values[name] = rng.random() < 0.5
            elif field.type == "number":
                values[name] = 1 + int(rng.random() * 8)
            elif field.type == "date":
                values[name] = (self.now.date() + timedelta(days=int(rng.random() * 231) - 200)).isoformat()
            else:
                values[name] = pick(LOCATIONS)
        return values

    def assigned(self, lead: dict[str, Any]) -> tuple[SimpleNamespace, str, str]:
        """The owner, and the `assigned` activity's summary and data (JSON) for a new lead."""
        assignment = self.router.assign(lead, self.turns)
        key = (assignment.reason.get("rule"), assignment.member.id)
        if key not in self.assignment_text:
            self.assignment_text[key] = (assignment.summary, _dumps(assignment.reason))
        return (assignment.member, *self.assignment_text[key])

    def response(self, created: datetime, source: Any, responded: datetime | None) -> tuple:
        """A lead's response_due_at, first_response_at, first_response_seconds and response_sort_at,
        as lead_timers.start and .responded write them, its first response being the earliest of
        its first move and its first contact."""
        minutes = sla.response_minutes(self.response_minutes,
                                       source.first_response_minutes if source is not None else None)
        if minutes is None:
            return None, None, None, NO_TASK_TEXT
        due = _time(self.hours.add(created, minutes * 60))
        if responded is None:
            return due, None, None, due
        return due, _time(responded), self.hours.between(created, responded), due

    def chunk(self, index: int, first_id: int, times: list[datetime]) -> "Rows":
        """The rows of one chunk of leads; each chunk has its own random stream, so workers agree."""
        self.rng = random.Random(f"{self.seed}:{self.start}:{index}")
        self.ids = _Ids(self.rng)
        out: Rows = {"lead": [], "name_part": [], "transition": [], "activity": [], "task": [], "size": len(times)}
        number = self.start + index * CHUNK
        for offset, created in enumerate(times):
            self.lead(number + offset, first_id + offset, created, out)
        return out

    def lead(self, number: int, lead_id: int, created: datetime, out: dict[str, list[tuple]]) -> None:
        """One lead with its transitions and activities, appended to out's row lists."""
        rng, ws, now, new_id, pick = self.rng, self.workspace_id, self.now, self.ids, self.pick
        activities, transitions = out["activity"], out["transition"]
        first, last = pick(FIRST_NAMES), pick(LAST_NAMES)
        contact = rng.random()
        phone = f"+9198{(number * MOBILE_STEP + self.offset) % MOBILE_SPACE:08d}" if contact > 0.06 else None
        email = (f"{first}.{last}.{number}@{pick(DOMAINS)}".lower()
                 if contact < 0.90 or phone is None else None)
        if rng.random() < 0.03:
            last = ""
        source = (self.sources[bisect.bisect(self.source_weights, rng.random() * self.source_weights[-1])]
                  if self.sources and rng.random() < 0.95 else None)
        value = Decimal((15 + int(rng.random() * 385)) * 100_000) if rng.random() < 0.6 else None
        custom = self.custom_fields()
        owner, assigned_summary, assigned_data = self.assigned(
            {"source": source.public_id if source else None, "estimated_value": value, "custom_fields": custom})
        created_text = _time(created)
        touch, via = TOUCH_ROWS[number % len(TOUCH_ROWS)]
        activities.append((ws, new_id("act_"), lead_id, "created", "Lead created.", via, created_text, created_text))
        activities.append((ws, new_id("act_"), lead_id, "assigned", assigned_summary, assigned_data,
                           created_text, created_text))

        # The pipeline walk: forward step by step, sometimes lost, sometimes reopened; no move is
        # later than now, so young leads are early in the pipeline.
        pipeline = self.pipeline
        status, at, stage, lost_reason = pipeline.forward[0], created, 0, None
        first_move = None
        transitions.append((ws, new_id("tr_"), lead_id, None, status.id, None, created_text, None, None))
        while True:
            roll, reason = rng.random(), None
            if self.kind[status.id] == "lost":
                target = pipeline.reopen.get(status.id) if roll < REOPEN else None
                stage = 0
            elif roll < STAY_AT_STAGE or stage + 1 >= len(pipeline.forward):
                target = None
            elif roll < STAY_AT_STAGE + LOST_AT_STAGE:
                target = pipeline.lost.get(status.id)
                if self.lost_reasons:   # from the same draw: the rest of the random stream stays as it was
                    reasons = self.lost_reasons
                    reason = reasons[min(len(reasons) - 1, int((roll - STAY_AT_STAGE) / LOST_AT_STAGE * len(reasons)))]
            else:
                target = pipeline.forward[stage + 1]
                stage += 1
            if target is None:
                break
            moved = at + timedelta(seconds=int(rng.expovariate(1 / (MEAN_DAYS_IN_STATUS * 86_400))) + 60)
            if moved >= now:
                break
            transition_id, moved_text = new_id("tr_"), _time(moved)
            transitions.append((ws, transition_id, lead_id, status.id, target.id, None, moved_text,
                                int((moved - at).total_seconds()), reason.id if reason else None))
            # Public ids are base62: nothing in them needs JSON escaping.
            activities.append((ws, new_id("act_"), lead_id, "status_changed",
                               f"Moved from {status.name} to {target.name}" + (f" ({reason.name})." if reason else "."),
                               f'{{"from":"{status.public_id}","to":"{target.public_id}",'
                               f'"transition":"{transition_id}"'
                               + (f',"lost_reason":"{reason.public_id}"}}' if reason else "}"), moved_text, moved_text))
            status, at, lost_reason = target, moved, reason
            first_move = first_move or moved

        # Calls and messages while the lead is worked: up to a month after its last move.
        engagement, last_activity, first_contact = 0, None, None
        window = max(2, int((min(now, at + timedelta(days=30)) - created).total_seconds()))
        for _ in range(pick((0, 0, 0, 1, 1, 2, 3))):
            kind = pick(CONTACT_KINDS)
            occurred = created + timedelta(seconds=1 + int(rng.random() * (window - 1)))
            engagement += ENGAGEMENT_POINTS[kind]
            last_activity = occurred if last_activity is None or occurred > last_activity else last_activity
            first_contact = occurred if first_contact is None or occurred < first_contact else first_contact
            occurred_text = _time(occurred)
            activities.append((ws, new_id("act_"), lead_id, kind, CONTACT_SUMMARIES[kind], "{}",
                               occurred_text, occurred_text))

        # Follow-ups, made some time after creation and due a few days later: an open lead's are
        # still open when due lately (some overdue), every other one is done (its contact logged) or cancelled.
        next_due, open_tasks = None, 0
        lead_is_open = self.kind[status.id] == "open"
        for _ in range(pick(TASKS_PER_LEAD)):
            kind = pick(TASK_KINDS_DRAWN)
            made = created + timedelta(seconds=int(rng.random() * max(1, (now - created).total_seconds())))
            due = made + timedelta(hours=2 + int(rng.random() * 166))
            made_text, due_text, task_id = _time(made), _time(due), new_id("task_")
            if lead_is_open and due > now - OPEN_TASKS_SINCE:
                state, done_text, closed_text, outcome = "open", None, NEVER_TEXT, None
                open_tasks += 1
                next_due = due if next_due is None or due < next_due else next_due
            else:
                closed = min(now, due + timedelta(seconds=int(rng.random() * 86_400)))
                closed_text = _time(closed)
                state = "done" if rng.random() < 0.85 else "cancelled"
                done_text, outcome = (closed_text, pick(TASK_OUTCOMES)) if state == "done" else (None, None)
                if state == "done" and kind in ENGAGEMENT_POINTS:   # completing a contact task logs it
                    engagement += ENGAGEMENT_POINTS[kind]
                    last_activity = closed if last_activity is None or closed > last_activity else last_activity
                    first_contact = closed if first_contact is None or closed < first_contact else first_contact
                    activities.append((ws, new_id("act_"), lead_id, kind, outcome, f'{{"task":"{task_id}"}}',
                                       closed_text, closed_text))
                elif state == "done":
                    activities.append((ws, new_id("act_"), lead_id, "task_completed", outcome,
                                       f'{{"task":"{task_id}"}}', closed_text, closed_text))
            out["task"].append((ws, task_id, lead_id, owner.id, owner.team_id, kind, TASK_TITLES[kind], due_text,
                                None, owner.id, state, done_text, closed_text, outcome, 1, made_text,
                                closed_text if state != "open" else made_text))

        response = self.response(created, source, min(filter(None, (first_move, first_contact)), default=None))
        stale_days = self.stale_days[status.id]
        stale_since = _time(max(at, last_activity or NEVER) + timedelta(days=stale_days)) if stale_days else None

        score, reasons = score_lead(
            phone=phone, email=email, first_name=first, last_name=last, estimated_value=value,
            custom_fields=custom, source=(source.name, source.score) if source else None,
            field_scores=self.field_scores, engagement=engagement, status_kind=self.kind[status.id])
        updated = max(at, last_activity) if last_activity else at
        last_text = _time(last_activity) if last_activity else None
        key = name_key(first, last)
        out["lead"].append((lead_id, ws, new_id("ld_"), first, last, phone, email, source.id if source else None,
                            status.id, owner.id, owner.team_id, None if value is None else str(value),
                            _dumps(custom), score, _dumps(reasons), engagement, 1, created_text, _time(updated),
                            _time(at), last_text, last_text or NEVER_TEXT, phone_reversed(phone),
                            lost_reason.id if lost_reason else None, key,
                            _time(next_due) if next_due else None, open_tasks, _time(next_due) if next_due else NO_TASK_TEXT,
                            *response, stale_since, *touch))
        out["name_part"].extend((lead_id, ws, part) for part in parts_of(key))
