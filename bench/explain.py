"""Query plans at benchmark scale. The lead list, every sort, for each role's scope, first and
deep pages: each must read the scope's index in order (no sort step, no scan of the table). A
create's duplicate lookup: it must read the phone and e-mail indexes, not the workspace. A search
(q) of each kind, in each role's scope: it must read its match index (a rare match is then
sorted, which is cheap), except a common name word: it reads the scope's sort index in order and
checks each lead's name key. The next-task filters of the lead list (in the next_task_due_at order
they are a range of its index), and the task list of each role: open tasks by due time, closed
ones most recent first, and an assignee's tasks due today, each on its index without a sort step.
The conversion report of a whole workspace: one GROUP BY on the report index, without a sort step.

    .venv/bin/python bench/explain.py sqlite:///bench/.cache/leads-1000000.sqlite3
"""

from __future__ import annotations

import os
import sys
from datetime import datetime

os.environ.setdefault("LEADSVC_CONFIG", os.devnull)

from leadsvc import create_app, pipeline, reports, search  # noqa: E402
from leadsvc.auth import Caller  # noqa: E402
from leadsvc.db import database, is_postgres  # noqa: E402
from leadsvc.config import settings  # noqa: E402
from leadsvc.listing import SORTS, TASK_SORTS, Period, next_task_condition  # noqa: E402
from leadsvc.models import Lead, Member, Task, Token, Workspace  # noqa: E402
from leadsvc.refs import cached_refs  # noqa: E402

SCOPES = {"admin": lambda m: Lead.workspace == m.workspace_id,
          "manager": lambda m: Lead.team == m.team_id,
          "agent": lambda m: Lead.owner == m.id}
ROLE_EMAILS = {"admin": "admin@demo.test", "manager": "asha@demo.test", "agent": "ravi@demo.test"}


def plan(query) -> list[str]:
    sql, params = query.sql()
    prefix = "EXPLAIN " if is_postgres() else "EXPLAIN QUERY PLAN "
    rows = database.execute_sql(prefix + sql, params).fetchall()
    return [row[0] if is_postgres() else row[-1] for row in rows]


def problems(lines: list[str], needed: tuple[str, ...] = (), table: str = "lead") -> list[str]:
    bad = ("Sort", "Seq Scan", "TEMP B-TREE", f"SCAN {table}") if is_postgres() else ("TEMP B-TREE", f"SCAN {table}")
    text = " ".join(lines)
    return ([line for line in lines if any(word in line for word in bad)]
            + [f"{index} unused" for index in needed if index not in text])


def report(failed: list[str], label: str, lines: list[str]) -> int:
    print(f"{'FAIL' if failed else 'ok  '} {label} | " + " / ".join(line.strip() for line in lines))
    return int(bool(failed))


def main(url: str) -> int:
    app = create_app({"database": {"url": url}})
    failures = 0
    for role, email in ROLE_EMAILS.items():
        member = Member.get(Member.email == email)
        for sort, order in SORTS.items():
            for depth in ("first", "deep"):
                after = None if depth == "first" else ((datetime(2026, 1, 1) if order.column.name != "score" else 50), "ld_M")
                query = order.apply(Lead.select().where(SCOPES[role](member)), after).limit(51)
                lines = plan(query)
                failures += report(problems(lines), f"{role:<8} {sort:<18} {depth:<5}", lines)
    lookup = pipeline.leads_with_contact(member.workspace_id, "+919700000000", "someone@example.test")
    lines = plan(lookup)
    failures += report(problems(lines, ("lead_workspace_id_phone", "lead_workspace_id_email")),
                       f"{'create':<8} {'duplicate lookup':<24}", lines)
    for role, email in ROLE_EMAILS.items():
        member = Member.get(Member.email == email)
        for label, q, index in SEARCHES:
            query = SORTS["-created_at"].apply(Lead.select().where(SCOPES[role](member)).where(
                search.matching(search.parse(q), member.workspace_id)), None).limit(51)
            lines = plan(query)
            if index is None:
                failed = problems(lines, (SORT_INDEXES[role],))
            else:
                failed = [f"{index} unused"] if index not in " ".join(lines) else []
            failures += report(failed, f"{role:<8} q {label:<24}", lines)
    with app.app_context():
        failures += next_task_plans() + task_plans() + conversion_plan()
    return failures


def conversion_plan() -> int:
    """The conversion report of a whole workspace: every breakdown from one pass over the report index."""
    member = Member.get(Member.email == ROLE_EMAILS["admin"])
    workspace = Workspace.get_by_id(member.workspace_id)
    query = reports.conversion_groups(Caller(Token(), member, workspace, frozenset()), {},
                                      cached_refs(workspace, settings()))
    lines = plan(query)
    return report(problems(lines, ("lead_workspace_id_status_id_source_id_owner_id_channel_c",)),
                  f"{'admin':<8} {'conversion report':<24}", lines)


TASK_SORT_INDEXES = {"admin": "lead_workspace_id_task_sort_at_public_id", "manager": "lead_team_id_task_sort_at_public_id",
                     "agent": "lead_owner_id_task_sort_at_public_id"}


def next_task_plans() -> int:
    """filter[next_task] under sort=next_task_due_at: a range of the scope's task sort index."""
    failures = 0
    for role, email in ROLE_EMAILS.items():
        member = Member.get(Member.email == email)
        refs = cached_refs(Workspace.get_by_id(member.workspace_id), settings())
        for wanted in ("overdue", "today", "scheduled"):
            query = SORTS["next_task_due_at"].apply(Lead.select().where(SCOPES[role](member)).where(
                next_task_condition(wanted, refs)), None).limit(51)
            lines = plan(query)
            failures += report(problems(lines, (TASK_SORT_INDEXES[role],)), f"{role:<8} next_task={wanted:<14}", lines)
    return failures


TASK_SCOPES = {"admin": (lambda m: Task.workspace == m.workspace_id, "workspace_id"),
               "manager": (lambda m: Task.lead_team == m.team_id, "lead_team_id"),
               "agent": (lambda m: Task.lead_owner == m.id, "lead_owner_id")}


def task_plans() -> int:
    """GET /tasks: open tasks by due time, closed ones most recent first, and filter[assignee]=me
    with filter[due]=today, first and deep pages, each on its index in order."""
    failures = 0
    for role, email in ROLE_EMAILS.items():
        member = Member.get(Member.email == email)
        scope, column = TASK_SCOPES[role]
        today = Period(keyword="today").utc_bounds(Workspace.get_by_id(member.workspace_id).timezone)
        by_due = f"task_{column}_state_due_at_public_id"
        shapes = (("due_at", "open", Task.select().where(scope(member) & (Task.state == "open")), (by_due,)),
                  ("-done_at", "done", Task.select().where(scope(member) & (Task.state == "done")),
                   (f"task_{column}_state_closed_at_public_id",)),
                  ("due_at", "me today", Task.select().where(
                      scope(member) & (Task.workspace == member.workspace_id) & (Task.assignee == member.id)
                      & (Task.state == "open") & (Task.due_at >= today[0]) & (Task.due_at < today[1])),
                   # an agent's own tasks are mostly on its own leads: its scope's index serves as well
                   ("task_workspace_id_assignee_id_state_due_at_public_id", by_due)))
        for sort, label, query, indexes in shapes:
            for depth in ("first", "deep"):
                after = None if depth == "first" else (datetime(2026, 1, 1), "task_M")
                lines = plan(TASK_SORTS[sort].apply(query, after).limit(51))
                unused = [] if any(index in " ".join(lines) for index in indexes) else [f"{indexes[0]} unused"]
                failures += report(problems(lines, table="task") + unused, f"{role:<8} tasks {label:<8} {depth:<5}",
                                   lines)
    return failures


# Each kind of q and the index that must serve it; None: the scope's sort index, in order.
SEARCHES = (("phone suffix", "43210", "lead_workspace_id_phone_reversed"),
            ("e-mail", "asha.rao.12345@example.com", "lead_workspace_id_email"),
            ("common name prefix", "ash", None),
            ("rare name prefix", "zqx", "leadnamepart_workspace_id_part_lead_id"))
SORT_INDEXES = {"admin": "lead_workspace_id_created_at_public_id", "manager": "lead_team_id_created_at_public_id",
                "agent": "lead_owner_id_created_at_public_id"}


if __name__ == "__main__":
    sys.exit(1 if main(sys.argv[1]) else 0)
