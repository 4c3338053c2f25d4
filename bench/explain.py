"""Query plans of the lead list at benchmark scale: every sort, for each role's scope, first and
deep pages. Each must read the scope's index in order (no sort step, no scan of the table).

    .venv/bin/python bench/explain.py sqlite:///bench/.cache/leads-1000000.sqlite3
"""

from __future__ import annotations

import os
import sys
from datetime import datetime

os.environ.setdefault("LEADSVC_CONFIG", os.devnull)

from leadsvc import create_app  # noqa: E402
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


def problems(lines: list[str]) -> list[str]:
    bad = ("Sort", "Seq Scan", "TEMP B-TREE", "SCAN lead") if is_postgres() else ("TEMP B-TREE", "SCAN lead")
    return [line for line in lines if any(word in line for word in bad)]


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
                bad = problems(lines)
                failures += bool(bad)
                print(f"{'FAIL' if bad else 'ok  '} {role:<8} {sort:<18} {depth:<5} | " + " / ".join(l.strip() for l in lines))
    return failures


if __name__ == "__main__":
    sys.exit(1 if main(sys.argv[1]) else 0)
