"""Query plans at benchmark scale. The lead list, every sort, for each role's scope, first and
deep pages: each must read the scope's index in order (no sort step, no scan of the table). A
create's duplicate lookup: it must read the phone and e-mail indexes, not the workspace. A search
(q) of each kind, in each role's scope: it must read its match index (a rare match is then
sorted, which is cheap), except a common name word: it reads the scope's sort index in order and
checks each lead's name key.

    .venv/bin/python bench/explain.py sqlite:///bench/.cache/leads-1000000.sqlite3
"""

from __future__ import annotations

import os
import sys
from datetime import datetime

os.environ.setdefault("LEADSVC_CONFIG", os.devnull)

from leadsvc import create_app, pipeline, search  # noqa: E402
from leadsvc.db import database, is_postgres  # noqa: E402
from leadsvc.listing import SORTS  # noqa: E402
from leadsvc.models import Lead, Member  # noqa: E402

SCOPES = {"admin": lambda m: Lead.workspace == m.workspace_id,
          "manager": lambda m: Lead.team == m.team_id,
          "agent": lambda m: Lead.owner == m.id}
ROLE_EMAILS = {"admin": "admin@demo.test", "manager": "asha@demo.test", "agent": "ravi@demo.test"}


def plan(query) -> list[str]:
    sql, params = query.sql()
    prefix = "EXPLAIN " if is_postgres() else "EXPLAIN QUERY PLAN "
    rows = database.execute_sql(prefix + sql, params).fetchall()
    return [row[0] if is_postgres() else row[-1] for row in rows]


def problems(lines: list[str], needed: tuple[str, ...] = ()) -> list[str]:
    bad = ("Sort", "Seq Scan", "TEMP B-TREE", "SCAN lead") if is_postgres() else ("TEMP B-TREE", "SCAN lead")
    text = " ".join(lines)
    return ([line for line in lines if any(word in line for word in bad)]
            + [f"{index} unused" for index in needed if index not in text])


def report(failed: list[str], label: str, lines: list[str]) -> int:
    print(f"{'FAIL' if failed else 'ok  '} {label} | " + " / ".join(line.strip() for line in lines))
    return int(bool(failed))


def main(url: str) -> int:
    create_app({"database": {"url": url}})
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
