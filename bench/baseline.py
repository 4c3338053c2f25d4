"""The thinnest Flask + waitress service doing the same work as leadsvc's list and create.

`GET /api/v1/leads` looks the bearer token up by sha256, scopes by the member's role (admin:
workspace, manager: team, agent: own leads), reads one keyset page of 50 (default sort,
`page[after]` cursor) with the source, status, owner, team, lost reason and connector joined in,
and answers with the same document built by hand and `json.dumps` (the bench checks that the
pages are equal). `POST /api/v1/leads` does the same unique checks as a create (phone and e-mail
lookups in the workspace) and inserts the lead. No ORM, no schemas, no rate limiter, no audit:
it is the yardstick that `make bench` divides by.

    python bench/baseline.py --url sqlite:///bench/.cache/leads.sqlite3 --port 8090
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import secrets
import sqlite3
import string
import threading
import time
from datetime import datetime, timezone

from flask import Flask, Response, request
from waitress import serve

BASE62 = string.digits + string.ascii_letters

LEAD_COLUMNS = """l.public_id, l.first_name, l.last_name, l.phone, l.email, s.public_id, s.name,
    st.public_id, st.name, st.kind, st.position, m.public_id, m.name, m.role, t.public_id, t.name,
    l.estimated_value, l.custom_fields, l.score, l.score_reasons, l.created_at, l.updated_at,
    l.last_activity_at, l.status_changed_at, lr.public_id, lr.name, l.consent, l.do_not_contact, l.erased_at,
    l.next_task_due_at, l.open_tasks, l.response_due_at, l.first_response_at, l.first_response_seconds,
    l.stale_since, l.channel, c.public_id, c.name, l.attribution"""
LEAD_JOINS = """FROM lead l LEFT JOIN source s ON s.id = l.source_id JOIN status st ON st.id = l.status_id
    LEFT JOIN member m ON m.id = l.owner_id LEFT JOIN team t ON t.id = l.team_id
    LEFT JOIN lost_reason lr ON lr.id = l.lost_reason_id LEFT JOIN connector c ON c.id = l.connector_id"""
ERASED_CONTACT = {"first_name": None, "last_name": None, "full_name": None, "phone": None, "email": None}
RANDOM_SPACE = 62**16


def lead_id() -> str:
    """ld_, the Unix second in 6 base-62 digits, then 16 random ones: leadsvc's id scheme, so
    that both put a new lead on the same index pages."""
    number, digits = int(time.time()) * RANDOM_SPACE + secrets.randbelow(RANDOM_SPACE), []
    for _ in range(22):
        number, digit = divmod(number, 62)
        digits.append(BASE62[digit])
    return "ld_" + "".join(reversed(digits))


SCOPE_COLUMN = {"admin": "l.workspace_id", "manager": "l.team_id", "agent": "l.owner_id"}


class Store:
    """One connection per serving thread; SQL written for both databases with a placeholder swap."""

    def __init__(self, url: str):
        self.url = url
        self.postgres = url.startswith("postgres")
        self.local = threading.local()

    def connection(self):
        conn = getattr(self.local, "conn", None)
        if conn is None:
            if self.postgres:
                import psycopg
                conn = psycopg.connect(self.url, autocommit=True)
            else:
                conn = sqlite3.connect(self.url[len("sqlite:///"):], isolation_level=None, check_same_thread=False)
                conn.execute("PRAGMA busy_timeout = 5000")
                conn.execute("PRAGMA synchronous = NORMAL")
            self.local.conn = conn
        return conn

    def sql(self, text: str) -> str:
        return text.replace("?", "%s") if self.postgres else text

    def all(self, text: str, params: tuple) -> list[tuple]:
        return self.connection().execute(self.sql(text), params).fetchall()

    def one(self, text: str, params: tuple):
        return self.connection().execute(self.sql(text), params).fetchone()


def when(value) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) else value


def iso(value) -> str | None:
    if value is None:
        return None
    return when(value).isoformat(timespec="microseconds") + "Z"


def problem(status: int, code: str) -> Response:
    return Response(json.dumps({"status": status, "code": code}), status=status,
                    mimetype="application/problem+json")


def create_app(url: str) -> Flask:
    app = Flask("baseline")
    store = Store(url)

    def caller():
        header = request.headers.get("Authorization", "")
        if not header.startswith("Bearer "):
            return None
        digest = hashlib.sha256(header[7:].strip().encode()).hexdigest()
        row = store.one("""SELECT m.id, m.role, m.team_id, w.id, w.currency, t.revoked_at, t.expires_at, m.active
                           FROM token t JOIN member m ON m.id = t.member_id JOIN workspace w ON w.id = t.workspace_id
                           WHERE t.secret_hash = ?""", (digest,))
        if row is None or row[5] is not None or not row[7]:
            return None
        return row

    @app.get("/api/v1/leads")
    def leads():
        who = caller()
        if who is None:
            return problem(401, "unauthenticated")
        member_id, role, team_id, workspace_id, currency = who[:5]
        scope = {"admin": workspace_id, "manager": team_id, "agent": member_id}[role]
        where, params = f"{SCOPE_COLUMN[role]} = ?", [scope]
        after = request.args.get("page[after]")
        if after:
            created_at, public_id = json.loads(base64.urlsafe_b64decode(after + "=" * (-len(after) % 4)))
            where += " AND (l.created_at, l.public_id) < (?, ?)"
            params += [datetime.fromisoformat(created_at) if store.postgres else created_at, public_id]
        rows = store.all(f"SELECT {LEAD_COLUMNS} {LEAD_JOINS} WHERE {where} "
                         f"ORDER BY l.created_at DESC, l.public_id DESC LIMIT 51", tuple(params))
        data = []
        now = datetime.now(timezone.utc).replace(tzinfo=None)
        for r in rows[:50]:
            custom, reasons, consent, attribution = r[17], r[19], r[26], r[38]
            due, responded = when(r[31]), when(r[32])
            first, last = r[1] or "", r[2] or ""
            data.append({
                "id": r[0],
                "contact": ERASED_CONTACT if r[28] is not None else {
                    "first_name": first, "last_name": last, "full_name": f"{first} {last}".strip(), "phone": r[3],
                    "email": r[4]},
                "source": {"id": r[5], "name": r[6]} if r[5] else None,
                "status": {"id": r[7], "name": r[8], "kind": r[9], "position": r[10]},
                "owner": {"id": r[11], "name": r[12], "role": r[13]} if r[11] else None,
                "team": {"id": r[14], "name": r[15]} if r[14] else None,
                "estimated_value": None if r[16] is None else float(r[16]),
                "currency": currency,
                "custom_fields": json.loads(custom) if isinstance(custom, str) else custom,
                "score": r[18],
                "score_band": "hot" if r[18] >= 70 else "warm" if r[18] >= 40 else "cold",
                "score_reasons": json.loads(reasons) if isinstance(reasons, str) else reasons,
                "created_at": iso(r[20]), "updated_at": iso(r[21]), "last_activity_at": iso(r[22]),
                "status_changed_at": iso(r[23]),
                "lost_reason": {"id": r[24], "name": r[25]} if r[24] else None,
                "consent": json.loads(consent) if isinstance(consent, str) else consent,
                "do_not_contact": bool(r[27]), "erased_at": iso(r[28]), "next_task_due_at": iso(r[29]),
                "open_tasks": r[30],
                "sla": None if due is None else {
                    "due_at": iso(due), "responded_at": iso(responded), "response_seconds": r[33],
                    "state": ("overdue" if now >= due else "due") if responded is None
                    else "met" if responded <= due else "missed"},
                "stale_since": iso(r[34]),
                "attribution": {"channel": r[35], "connector": {"id": r[36], "name": r[37]} if r[36] else None,
                                **((json.loads(attribution) if isinstance(attribution, str) else attribution) or {})},
            })
        next_link = None
        if len(rows) > 50:
            last = rows[49]
            created = last[20] if isinstance(last[20], str) else last[20].isoformat(" ")
            cursor = base64.urlsafe_b64encode(json.dumps([created, last[0]]).encode()).rstrip(b"=").decode()
            next_link = f"/api/v1/leads?page%5Bafter%5D={cursor}"
        body = {"data": data, "links": {"next": next_link}, "meta": {"has_more": next_link is not None}}
        return Response(json.dumps(body, ensure_ascii=False), mimetype="application/json")

    @app.post("/api/v1/leads")
    def create():
        who = caller()
        if who is None:
            return problem(401, "unauthenticated")
        member_id, role, team_id, workspace_id, currency = who[:5]
        data = request.get_json()
        phone, email = data.get("phone"), (data.get("email") or "").lower() or None
        conn = store.connection()
        conn.execute("BEGIN" if store.postgres else "BEGIN IMMEDIATE")
        try:
            existing = None
            if phone:
                existing = store.one("SELECT public_id FROM lead WHERE workspace_id = ? AND phone = ?",
                                     (workspace_id, phone))
            if existing is None and email:
                existing = store.one("SELECT public_id FROM lead WHERE workspace_id = ? AND email = ?",
                                     (workspace_id, email))
            if existing is not None:
                conn.execute("COMMIT")
                return Response(json.dumps({"data": {"id": existing[0]}, "duplicate": True}),
                                status=200, mimetype="application/json")
            status_id = store.one("SELECT id FROM status WHERE workspace_id = ? ORDER BY position LIMIT 1",
                                  (workspace_id,))[0]
            public_id = lead_id()
            now = datetime.now(timezone.utc).replace(tzinfo=None)
            stamp = now if store.postgres else now.isoformat(" ")
            store.one("""INSERT INTO lead (workspace_id, public_id, first_name, last_name, phone, email, status_id,
                             owner_id, team_id, custom_fields, score, score_reasons, engagement, version, created_at,
                             updated_at, status_changed_at, activity_sort_at)
                         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, '{}', 0, '[]', 0, 1, ?, ?, ?, ?) RETURNING id""",
                      (workspace_id, public_id, data.get("first_name") or "", data.get("last_name") or "", phone,
                       email, status_id, member_id, team_id, stamp, stamp, stamp,
                       datetime(1970, 1, 1) if store.postgres else "1970-01-01 00:00:00"))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return Response(json.dumps({"data": {"id": public_id, "phone": phone, "email": email}, "duplicate": False}),
                        status=201, mimetype="application/json")

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="sqlite:///path or postgresql://...")
    parser.add_argument("--port", type=int, default=8090)
    parser.add_argument("--threads", type=int, default=8)
    args = parser.parse_args()
    serve(create_app(args.url), host="127.0.0.1", port=args.port, threads=args.threads, ident="baseline",
          connection_limit=200, channel_timeout=60)


if __name__ == "__main__":
    main()
