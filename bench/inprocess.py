"""leadsvc (or the baseline) as a WSGI app called in a loop: the cost of a request without a server.

Served figures on a shared VM move by a third between identical runs; the app called in a loop,
one thread, no sockets, moves far less, and under valgrind it gives instruction counts that
repeat to 0.1%. Creates are what bench/wrk/create.lua sends (a quarter of them duplicates of
existing phones, over every source of the demo workspace); any other path is a GET as the demo
admin.

    .venv/bin/python bench/inprocess.py sqlite:///bench/.cache/small.sqlite3 -n 3000
    .venv/bin/python bench/inprocess.py sqlite:///... --path /healthz
    .venv/bin/python bench/inprocess.py sqlite:///... --path merge -n 20 --warm 0
    .venv/bin/python bench/inprocess.py sqlite:///... --profile out.prof     # cProfile of the loop

Instructions per request: run under `valgrind --tool=callgrind --callgrind-out-file=/dev/null`
with `-n 0` and with `-n 200` (the same --warm), and divide the difference of the two totals by
200. A SQLite database is copied first (--no-copy writes into it), a PostgreSQL one is written
to (use a scratch one); make one with
`LEADSVC_DATABASE_URL=sqlite:///bench/.cache/small.sqlite3 .venv/bin/leadsvc demo --leads 50000`.
Another checkout's leadsvc: PYTHONPATH=/path/to/checkout.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from run import CACHE, INTAKE_UNLIMITED, bench_connector, demo, service_env

INTERESTS = ("2bhk", "3bhk", "villa", "plot")
MERGE_ACTIVITIES = 1000   # the duplicate's history in --path merge (DESIGN section 21: a merge of it under 1 s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="sqlite:///path or postgresql://... of a database with the demo workspace")
    parser.add_argument("--path", default="create",
                        help="create (POST /api/v1/leads), batch (POST /api/v1/leads/batch, 100 new leads), intake "
                             "(a Google Ads lead form webhook, as bench/wrk/intake.lua sends), merge (POST "
                             "/api/v1/leads/{id}/merge of a lead with MERGE_ACTIVITIES activities into a new one; "
                             "only the merges are measured), or a path to GET")
    parser.add_argument("-n", type=int, default=2000, help="requests measured")
    parser.add_argument("--warm", type=int, default=50, help="requests before measuring")
    parser.add_argument("--app", choices=("leadsvc", "baseline"), default="leadsvc")
    parser.add_argument("--no-copy", action="store_true", help="run on the SQLite file itself")
    parser.add_argument("--profile", help="write a cProfile of the measured requests to this file")
    args = parser.parse_args()

    url = args.url
    if url.startswith("sqlite:///") and not args.no_copy:
        copy = Path(tempfile.mkdtemp()) / "inprocess.sqlite3"
        shutil.copy(url[len("sqlite:///"):], copy)
        url = f"sqlite:///{copy}"
    env = service_env(url, **(INTAKE_UNLIMITED if args.path == "intake" else {}))
    CACHE.mkdir(parents=True, exist_ok=True)   # where demo runs
    token = demo(url)["tokens"]["admin@demo.test"]["token"]
    app = _app(args.app, url, env)
    send = Requests(url, token)
    if args.path == "intake":
        send.connector_id, send.google_key = bench_connector(url)

    statuses: dict[str, int] = {}

    def start_response(status: str, headers: list, exc_info=None) -> None:
        statuses[status[:3]] = statuses.get(status[:3], 0) + 1

    def one() -> None:
        environ = {"create": send.create, "batch": send.batch, "intake": send.intake, "merge": send.merge}.get(
            args.path, lambda: send.get(args.path))()
        body = app(environ, start_response)
        b"".join(body)
        getattr(body, "close", lambda: None)()

    if args.path == "merge":
        send.prepare_merge = lambda: send.merge_pair(app)
        send.prepare_merge()

    for _ in range(args.warm):
        one()
        if args.path == "merge":
            send.prepare_merge()
    statuses.clear()
    profile = None
    if args.profile:
        import cProfile

        profile = cProfile.Profile()
        profile.enable()
    times = []
    server = ServerCpu(url)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(args.n):
        started = time.perf_counter()
        one()
        times.append(time.perf_counter() - started)
        if args.path == "merge":   # the next pair, not measured
            paused, paused_cpu = time.perf_counter(), time.process_time()
            send.prepare_merge()
            wall += time.perf_counter() - paused
            cpu += time.process_time() - paused_cpu
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    server_cpu = server.seconds()
    server_blocks = server.blocks_since() if server_cpu is not None else None
    if profile is not None:
        profile.disable()
        profile.dump_stats(args.profile)
    p50 = 1000 * statistics.median(times) if times else 0.0
    print(f"{args.app} {args.path}: {args.n} requests, {1000 * wall / max(1, args.n):.3f} ms wall "
          f"(p50 {p50:.3f} ms) and {1000 * cpu / max(1, args.n):.3f} ms CPU each; "
          f"statuses {dict(sorted(statuses.items()))}"
          + (f"; database server {1000 * server_cpu / max(1, args.n):.3f} ms CPU and "
             f"{server_blocks / max(1, args.n):.1f} buffer reads each" if server_cpu is not None else ""))


def _app(which: str, url: str, env: dict[str, str]):
    if which == "baseline":
        import baseline

        return baseline.create_app(url)
    os.environ.update(env)   # production settings, limits that never trip (as make bench serves)
    from leadsvc import create_app

    return create_app()


class Requests:
    """WSGI environs as wrk sends them: creates like bench/wrk/create.lua, GETs as the admin."""

    def __init__(self, url: str, token: str):
        self.token = token
        self.random = random.Random(7)
        with _connect(url) as conn:
            self.duplicates = [row[0] for row in conn.execute(
                "SELECT phone FROM lead WHERE phone IS NOT NULL ORDER BY id DESC LIMIT 200")]
            self.sources = [row[0] for row in conn.execute("SELECT public_id FROM source")]

    def create(self) -> dict:
        body = self._lead(duplicate_share=0.25)
        return self._environ("POST", "/api/v1/leads", json.dumps(body, separators=(",", ":")).encode())

    def batch(self) -> dict:
        """What bench/wrk/batch.lua sends: 100 new leads."""
        body = {"leads": [self._lead(duplicate_share=0) for _ in range(100)]}
        return self._environ("POST", "/api/v1/leads/batch", json.dumps(body, separators=(",", ":")).encode())

    def intake(self) -> dict:
        """What bench/wrk/intake.lua sends: Google's lead form webhook, a lead id of its own each."""
        self.sent = getattr(self, "sent", 0) + 1
        lead = self._lead(duplicate_share=0.25)
        body = {"lead_id": f"inprocess-{id(self)}-{self.sent}", "api_version": "1.0", "form_id": 40000000000,
                "campaign_id": 50000000000, "adgroup_id": 60000000000, "creative_id": 70000000000,
                "gcl_id": "bench-gclid", "google_key": self.google_key, "is_test": False,
                "user_column_data": [
                    {"column_name": "Full Name", "string_value": "Bench Lead", "column_id": "FULL_NAME"},
                    {"column_name": "User Phone", "string_value": lead["phone"], "column_id": "PHONE_NUMBER"},
                    {"column_name": "Interest", "string_value": lead["custom_fields"]["product_interest"],
                     "column_id": "INTEREST"}]}
        return self._environ("POST", f"/api/v1/intake/{self.connector_id}",
                             json.dumps(body, separators=(",", ":")).encode())

    def _lead(self, duplicate_share: float) -> dict:
        pick = self.random
        if self.duplicates and pick.random() < duplicate_share:
            phone = pick.choice(self.duplicates)
        else:
            phone = f"+9197{pick.randrange(10**8):08d}"
        return {"first_name": "Bench", "last_name": "Lead", "phone": phone, "source": pick.choice(self.sources),
                "estimated_value": pick.randint(20, 300) * 100000,
                "custom_fields": {"product_interest": pick.choice(INTERESTS)}}

    def merge_pair(self, app) -> None:
        """A new survivor and a new duplicate with MERGE_ACTIVITIES activities, for the next merge."""
        from leadsvc.models import Activity, Lead

        ids = []
        for _ in range(2):
            environ = self._environ("POST", "/api/v1/leads", json.dumps(self._lead(duplicate_share=0)).encode())
            ids.append(json.loads(b"".join(app(environ, lambda *args: None)))["data"]["id"])
        duplicate = Lead.get(Lead.public_id == ids[1])
        rows = [{"workspace": duplicate.workspace_id, "lead": duplicate.id, "kind": "call", "summary": f"Call {n}",
                 "data": {}} for n in range(MERGE_ACTIVITIES)]
        for start in range(0, len(rows), 200):
            Activity.insert_many(rows[start:start + 200]).execute()
        self.pair = ids

    def merge(self) -> dict:
        survivor, duplicate = self.pair
        return self._environ("POST", f"/api/v1/leads/{survivor}/merge",
                             json.dumps({"duplicates": [duplicate]}).encode())

    def get(self, path: str) -> dict:
        path, _, query = path.partition("?")
        return self._environ("GET", path, b"", query)

    def _environ(self, method: str, path: str, body: bytes, query: str = "") -> dict:
        return {"REQUEST_METHOD": method, "SCRIPT_NAME": "", "PATH_INFO": path, "QUERY_STRING": query,
                "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "8080", "SERVER_PROTOCOL": "HTTP/1.1",
                "REMOTE_ADDR": "127.0.0.1", "wsgi.url_scheme": "http", "wsgi.input": io.BytesIO(body),
                "wsgi.errors": sys.stderr, "wsgi.multithread": True, "wsgi.multiprocess": False,
                "wsgi.run_once": False, "wsgi.version": (1, 0), "CONTENT_TYPE": "application/json",
                "CONTENT_LENGTH": str(len(body)), "HTTP_HOST": "127.0.0.1:8080",
                "HTTP_AUTHORIZATION": f"Bearer {self.token}", "HTTP_USER_AGENT": "wrk", "HTTP_ACCEPT": "*/*"}


class ServerCpu:
    """The CPU time PostgreSQL's backends of this database spent from here on (None on SQLite,
    which runs in this process): the other half of a request's cost, read from /proc, so it
    counts work rather than waiting, whatever else the machine runs."""

    def __init__(self, url: str):
        self.url = url if url.startswith("postgresql") else None
        self.start = self._ticks() if self.url else {}
        self.start_blocks = self.blocks() if self.url else 0

    def blocks(self) -> int:
        """Shared buffers this database's backends read or found, as its statistics count them: a
        count of work that load does not move (a backend reports it within a second of idling)."""
        with _connect(self.url) as conn:
            return conn.execute("SELECT blks_hit + blks_read FROM pg_stat_database "
                                "WHERE datname = current_database()").fetchone()[0]

    def blocks_since(self) -> int:
        time.sleep(1.5)
        with _connect(self.url) as conn:
            conn.execute("SELECT pg_stat_clear_snapshot()")
        return self.blocks() - self.start_blocks

    def _ticks(self) -> dict[int, int]:
        with _connect(self.url) as conn:
            pids = [row[0] for row in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")]
        ticks = {}
        for pid in pids:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue   # not on this machine, or gone
            ticks[pid] = int(fields[11]) + int(fields[12])   # utime + stime
        return ticks

    def seconds(self) -> float | None:
        if self.url is None:
            return None
        end = self._ticks()
        spent = sum(t - self.start.get(pid, 0) for pid, t in end.items())
        return spent / os.sysconf("SC_CLK_TCK")


def _connect(url: str):
    if url.startswith("sqlite:///"):
        import sqlite3

        return sqlite3.connect(url[len("sqlite:///"):])
    import psycopg

    return psycopg.connect(url)


if __name__ == "__main__":
    main()
