"""`make bench`: leadsvc against the thinnest baseline, on SQLite and PostgreSQL, at a million leads.

For each database: build (or reuse) a database of N synthetic leads in the demo workspace, start
leadsvc under waitress with production settings and the baseline (bench/baseline.py) in their
own processes, drive both with wrk from this one, and write the figures to bench/out/ and into
bench/RESULTS.md between its markers. Targets are ratios to the baseline measured in the same
run, so they hold on a noisy machine. Then webhooks, with a receiver in this process: the lag from
commit to delivery of single creates on an idle server, and the rate at which a served process
delivers a backlog of events (the API figures above are measured with no webhook registered).
Last, the clock: one tick with nothing due, in a process of its own on the same database.

    .venv/bin/python bench/run.py [--leads 1000000] [--duration 10] [--backends sqlite,postgresql]
    .venv/bin/python bench/run.py --leads 50000 --webhooks-only        # webhook figures alone
    .venv/bin/python bench/run.py --leads 20000 --batch-only           # a batch of 100 against 100 creates
    .venv/bin/python bench/run.py --leads 20000 --intake-only          # Google Ads intakes against API creates
    .venv/bin/python bench/run.py --leads 2000 --clock-only            # one clock tick with nothing due
    .venv/bin/python bench/run.py --leads 20000 --jobs-only            # deactivation, bulk move, import jobs
    .venv/bin/python bench/run.py --leads 20000 --jobs-only --jobs-worker   # the same, run by a `leadsvc worker`
    .venv/bin/python bench/run.py --compare --service-root ../other    # list, create and batch ratios of another checkout
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shutil
import socket
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
CACHE = BENCH / ".cache"
OUT = BENCH / "out"
WRK_DIR = BENCH / "wrk"
BIN = Path(sys.executable).parent
POSTGRES_URL = os.environ.get("LEADSVC_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/leadsvc_bench")
LEADSVC_PORT, BASELINE_PORT = 18080, 18090
BENCH_SECRET_KEY = "bench-secret-key-for-connector-keys-0123456789"   # what connector keys derive from
# The intake phase's limit, for this checkout only: an older one refuses a setting it does not know.
INTAKE_UNLIMITED = {"LEADSVC_RATE_LIMITS_INTAKE": "100000000/minute"}
ROLES = {"admin": "admin@demo.test", "manager": "asha@demo.test", "agent": "ravi@demo.test"}
REPORTS = ("funnel", "velocity", "conversion", "response")
DEEP_ROWS = 100_000
PAIRS = 3   # leadsvc/baseline throughput pairs per role; the ratio is the median of the pairs' ratios
TARGETS = {"list_ratio": 0.70, "deep_over_first_p50": 1.15, "report_seconds": 1.0, "create_ratio": 0.35,
           "rss_mb": 200, "search_over_first_p50": 2.0, "webhook_lag_p50_s": 1.0, "webhook_events_per_s": 200,
           "batch_over_singles": 0.7, "clock_tick_ms": 5.0, "follow_up_over_first_p50": 2.0,
           "intake_over_creates": 0.8, "intake_p99_ms": 100.0, "job_seconds": 60.0, "writes_during_job_p99_ms": 500.0,
           "pages_during_job_over_idle_p99": 2.0}
WEBHOOK_LAG_SAMPLES = 50      # single creates on an idle server, each waited for at the receiver
WEBHOOK_BACKLOG = 3000        # events queued while nothing delivers, then sent as fast as the service can
# Each item of a batch is still a create with its own transaction (the contract); what a batch saves
# is what a single create's request costs around it (HTTP, token, rate limit, parsing, reference data).
BATCH_SIZE = 100
CLOCK_TICKS = 100
# One process on the database, as `leadsvc worker` runs the clock: a first tick fires what fell due
# since the database was built (its open tasks' timers: the catch-up of a worker that was down) and
# warms the connection, then CLOCK_TICKS timed ones, with nothing due.
CLOCK_TICK = """
import json, os, statistics, sys, time
from leadsvc import create_app
from leadsvc.clock import Clock
from leadsvc.db import migrate
from leadsvc.models import Timer, utcnow
app = create_app(config_file=os.devnull)
migrate()
clock = Clock(app.config["LEADSVC"])
caught_up = clock.tick()
due = Timer.select().where(Timer.fire_at <= utcnow()).count()
times = []
for _ in range(int(sys.argv[1])):
    started = time.perf_counter()
    clock.tick()
    times.append((time.perf_counter() - started) * 1000)
print(json.dumps({"median_ms": round(statistics.median(times), 3), "max_ms": round(max(times), 3),
                  "ticks": len(times), "due": due, "caught_up": caught_up}))
"""
SEARCHES = ("phone suffix (5 digits)", "full e-mail", "name prefix (3 letters)", "rare name prefix (3 letters)",
            "first and last name")
# The searches the target holds for; the others are shown for what they cost.
TARGETED_SEARCHES = SEARCHES[:4]


def log(message: str) -> None:
    print(f"[bench {datetime.now().strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- the databases ---------------------------------------------------------------------------

def service_env(url: str, **extra: str) -> dict[str, str]:
    """Production settings, except limits high enough never to trip, and quiet logs."""
    env = {**os.environ, "LEADSVC_CONFIG": os.devnull, "LEADSVC_DATABASE_URL": url,
           "LEADSVC_WEBHOOKS_SECRET_KEY": BENCH_SECRET_KEY,
           "LEADSVC_RATE_LIMITS_PER_TOKEN": "100000000/minute", "LEADSVC_RATE_LIMITS_PER_IP": "100000000/minute",
           "LEADSVC_LOGGING_LEVEL": "WARNING"}
    env.update(extra)
    return env


def leadsvc_env(db_url: str, service_root: str | None, **extra: str) -> dict[str, str]:
    """service_env for `leadsvc serve`: with --service-root, the leadsvc package of another checkout
    (a before/after comparison)."""
    if service_root:
        return service_env(db_url, PYTHONPATH=service_root, **extra)
    return service_env(db_url, **INTAKE_UNLIMITED, **extra)


def demo(url: str, leads: int = 0) -> dict:
    """Run `leadsvc demo --json` (optionally adding leads); the workspace and a token per member."""
    args = [str(BIN / "leadsvc"), "demo", "--json"] + (["--leads", str(leads)] if leads else [])
    done = subprocess.run(args, env=service_env(url), capture_output=True, text=True, cwd=CACHE)
    if done.returncode:
        sys.exit(f"leadsvc demo failed:\n{done.stderr}")
    if leads:
        sys.stderr.write(done.stderr)
    return json.loads(done.stdout)


class Database:
    """A benchmark database: its URL, and direct SQL for counts and clean-up."""

    def __init__(self, backend: str, leads: int):
        self.backend, self.leads = backend, leads
        if backend == "sqlite":
            self.path = CACHE / f"leads-{leads}.sqlite3"
            self.url = f"sqlite:///{self.path}"
        else:
            self.url = POSTGRES_URL if leads == 1_000_000 else f"{POSTGRES_URL}_{leads}"
            self.name = self.url.rsplit("/", 1)[1]
        self.build_file = CACHE / f"{backend}-{leads}-build.json"

    def connect(self):
        if self.backend == "sqlite":
            conn = sqlite3.connect(self.path, isolation_level=None)
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute("PRAGMA busy_timeout = 10000")
            return conn
        import psycopg
        return psycopg.connect(self.url, autocommit=True)

    def _admin(self):
        import psycopg
        return psycopg.connect(self.url.rsplit("/", 1)[0] + "/postgres", autocommit=True)

    def exists(self) -> bool:
        if self.backend == "sqlite":
            return self.path.exists()
        with self._admin() as conn:
            return conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (self.name,)).fetchone() is not None

    def lead_count(self) -> int:
        try:
            with self.connect() as conn:
                return conn.execute("SELECT COUNT(*) FROM lead").fetchone()[0]
        except Exception:   # no table yet, or a half-built file: rebuild
            return -1

    def drop(self) -> None:
        if self.backend == "sqlite":
            for suffix in ("", "-wal", "-shm"):
                Path(f"{self.path}{suffix}").unlink(missing_ok=True)
        else:
            with self._admin() as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')

    def create(self) -> None:
        if self.backend == "postgresql":
            with self._admin() as conn:
                conn.execute(f'CREATE DATABASE "{self.name}"')

    def ensure(self) -> tuple[dict, dict]:
        """The demo tokens, and how the database was built (reused when its lead count matches)."""
        CACHE.mkdir(parents=True, exist_ok=True)
        if self.exists() and self.lead_count() == self.leads and self.build_file.exists():
            log(f"{self.backend}: reusing the {self.leads:,}-lead database")
            return demo(self.url), json.loads(self.build_file.read_text())
        log(f"{self.backend}: building a {self.leads:,}-lead database (leadsvc demo --leads {self.leads})")
        self.drop()
        self.create()
        started, cpu = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
        tokens = demo(self.url, self.leads)
        used = resource.getrusage(resource.RUSAGE_CHILDREN)
        build = {"seconds": round(time.monotonic() - started, 1), "leads": self.leads,
                 "cpu_seconds": round(used.ru_utime + used.ru_stime - cpu.ru_utime - cpu.ru_stime, 1),
                 "built_at": datetime.now(UTC).isoformat(timespec="seconds"), "load": os.getloadavg()[0]}
        with self.connect() as conn:
            build["transitions"] = conn.execute("SELECT COUNT(*) FROM transition").fetchone()[0]
            build["activities"] = conn.execute("SELECT COUNT(*) FROM activity").fetchone()[0]
        if self.backend == "sqlite":
            build["megabytes"] = round(self.path.stat().st_size / 2**20)
        self.build_file.write_text(json.dumps(build))
        return tokens, build

    def high_water(self) -> dict[str, int]:
        with self.connect() as conn:
            return {table: conn.execute(f"SELECT COALESCE(MAX(id), 0) FROM {table}").fetchone()[0]
                    for table in ("lead", "transition", "activity", "audit_entry", "token", "intake")}

    def restore(self, marks: dict[str, int]) -> None:
        """Delete what the create benchmark added, so the cached database keeps its lead count."""
        with self.connect() as conn:
            # Creates still queued in the server when wrk stopped land afterwards: wait them out.
            last, deadline = None, time.monotonic() + 120
            while time.monotonic() < deadline:
                now = conn.execute("SELECT COALESCE(MAX(id), 0) FROM activity").fetchone()[0]
                if now == last:
                    break
                last = now
                time.sleep(3)
            for table in ("intake", "activity", "transition", "audit_entry", "lead"):
                conn.execute(f"DELETE FROM {table} WHERE id > {int(marks[table])}")
            conn.execute(f"DELETE FROM timer WHERE kind LIKE 'lead.%' AND subject > {int(marks['lead'])}")
            for table in ("delivery", "event", "webhook"):   # the webhook phase's
                conn.execute(f"DELETE FROM {table}")
            if self.backend == "postgresql":
                # The creates landed on pages all over the tables: until a vacuum marks them
                # all-visible again, index-only scans visit the heap (a lead count slows down
                # run after run), and autovacuum waits for 20% of a table.
                conn.execute("VACUUM (ANALYZE) lead, transition, activity, audit_entry, open_lead_count, intake")


    def scratch(self) -> "Database":
        """A copy of this database to change freely (the jobs phase), dropped afterwards."""
        copy = Database(self.backend, self.leads)
        if self.backend == "sqlite":
            copy.path = CACHE / f"jobs-{self.leads}.sqlite3"
            copy.url = f"sqlite:///{copy.path}"
            copy.drop()
            with sqlite3.connect(self.path) as source, sqlite3.connect(copy.path) as target:
                source.backup(target)
        else:
            copy.name = f"{self.name}_jobs"
            copy.url = f"{self.url.rsplit('/', 1)[0]}/{copy.name}"
            copy.drop()
            with self._admin() as conn:
                conn.execute(f'CREATE DATABASE "{copy.name}" TEMPLATE "{self.name}"')
        return copy


# --- servers and load ------------------------------------------------------------------------

class Server:
    def __init__(self, name: str, args: list[str], env: dict[str, str], port: int):
        self.name, self.port = name, port
        self.log = open(OUT / f"{name}.log", "w")
        self.process = subprocess.Popen(args, env=env, cwd=CACHE, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                sys.exit(f"{name} exited at start; see {self.log.name}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.2)
        self.stop()
        sys.exit(f"{name} did not listen on {port} within 60 s")

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def peak_rss_mb(self) -> float:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) / 1024

    def cpu_seconds(self) -> float:
        """User and system CPU time the serving process has used so far."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


def wrk(url: str, token: str, *, connections: int, seconds: float, script: str = "report.lua",
        env: dict[str, str] | None = None) -> dict:
    threads = min(2, connections)
    done = subprocess.run(
        ["wrk", f"-t{threads}", f"-c{connections}", f"-d{int(seconds)}s", "--timeout", "10s",
         "-H", f"Authorization: Bearer {token}", "-s", str(WRK_DIR / script), url],
        capture_output=True, text=True, env={**os.environ, "BENCH_WRK_DIR": str(WRK_DIR), **(env or {})})
    line = next((l for l in done.stdout.splitlines() if l.startswith("BENCH ")), None)
    if done.returncode or line is None:
        sys.exit(f"wrk failed on {url}:\n{done.stdout}\n{done.stderr}")
    return json.loads(line[len("BENCH "):])


def get(url: str, token: str) -> tuple[int, dict | None, float]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            body = response.read()
            return response.status, json.loads(body), time.perf_counter() - started
    except urllib.error.HTTPError as exc:
        exc.read()
        return exc.code, None, time.perf_counter() - started


def same_pages(leadsvc: Server, baseline: Server, secret: dict[str, str]) -> None:
    """The baseline is a yardstick only while it does leadsvc's work: each role's first page of
    leads must be the same document from both (a new field of the lead goes into baseline.py too)."""
    for role, token in secret.items():
        (own_status, own, _), (base_status, base, _) = (get(server.url("/api/v1/leads"), token)
                                                         for server in (leadsvc, baseline))
        if own_status != 200 or base_status != 200:
            sys.exit(f"the first page of leads as {role}: leadsvc answered {own_status}, the baseline {base_status}")
        for mine, theirs in zip(own["data"], base["data"]):
            if mine != theirs:
                differ = sorted(key for key in mine.keys() | theirs.keys() if mine.get(key) != theirs.get(key))
                sys.exit(f"the baseline's lead {mine['id']} differs from leadsvc's in {', '.join(differ)}: "
                         "bench/baseline.py must build the lead document that leadsvc answers")
        if len(own["data"]) != len(base["data"]):
            sys.exit(f"the first page as {role}: {len(own['data'])} leads from leadsvc, {len(base['data'])} from the baseline")


def deep_cursor(server: Server, token: str) -> str:
    """A cursor DEEP_ROWS rows into the admin's default sort, by walking 200-row pages once."""
    path, walked = "/api/v1/leads?page%5Bsize%5D=200", 0
    while walked < DEEP_ROWS:
        status, body, _ = get(server.url(path), token)
        if status != 200:
            sys.exit(f"walking the list failed with {status} after {walked} rows")
        walked += len(body["data"])
        path = body["links"]["next"]
        if path is None:
            sys.exit(f"the list ended after {walked} rows, before {DEEP_ROWS}")
    return path.split("page%5Bafter%5D=")[1].split("&")[0]


def query_plans(db: Database) -> dict:
    """bench/explain.py: each list query reads its scope's index in order, the duplicate lookup the contact indexes."""
    done = subprocess.run([sys.executable, str(BENCH / "explain.py"), db.url], capture_output=True, text=True,
                          env=service_env(db.url), cwd=CACHE)
    lines = [line for line in done.stdout.splitlines() if line.startswith(("ok", "FAIL"))]
    (OUT / f"plans-{db.backend}.txt").write_text(done.stdout + done.stderr)
    return {"checked": len(lines), "failed": [line.split("|")[0].strip() for line in lines if line.startswith("FAIL")],
            "error": done.returncode not in (0, 1) or not lines}


def search_terms(server: Server, token: str) -> dict[str, str]:
    """A q of each kind that finds leads of the database: from a lead of the first page, and a
    3-letter name prefix that few leads have (the match index, not the sort index, must serve it)."""
    _, page, _ = get(server.url("/api/v1/leads?page%5Bsize%5D=200"), token)
    contacts = [lead["contact"] for lead in page["data"]]
    phone = next(c["phone"] for c in contacts if c["phone"])
    email = next(c["email"] for c in contacts if c["email"])
    named = next(c for c in contacts if len(c["first_name"]) >= 3 and c["last_name"])
    return dict(zip(SEARCHES, (phone[-5:], email, named["first_name"][:3].lower(), "zqx",
                               f"{named['first_name']} {named['last_name']}")))


def measure_search(server: Server, token: str, seconds: float) -> dict:
    """p50 of a first page for each kind of q against the plain first page, 1 connection."""
    paths = {"plain": "/api/v1/leads"}
    paths.update({kind: f"/api/v1/leads?{urllib.parse.urlencode({'q': q})}"
                  for kind, q in search_terms(server, token).items()})
    for path in paths.values():   # warm each query, and check it answers
        status, body, _ = get(server.url(path), token)
        if status != 200:
            sys.exit(f"{path} answered {status}")
        wrk(server.url(path), token, connections=1, seconds=2)
    runs: dict[str, list] = {kind: [] for kind in paths}
    for _ in range(3):   # interleaved, so noise hits every kind alike
        for kind, path in paths.items():
            runs[kind].append(wrk(server.url(path), token, connections=1, seconds=seconds))
    first = statistics.median(r["p50_ms"] for r in runs["plain"])
    found = {kind: len(get(server.url(path), token)[1]["data"]) for kind, path in paths.items()}
    return {"first_p50_ms": first, "queries": {kind: paths[kind] for kind in SEARCHES},
            "kinds": {kind: {"p50_ms": statistics.median(r["p50_ms"] for r in runs[kind]),
                             "ratio": round(statistics.median(r["p50_ms"] for r in runs[kind]) / first, 3),
                             "rows": found[kind],
                             "errors": sum(r["errors_status"] for r in runs[kind])} for kind in SEARCHES}}


# The follow-up lists of a salesperson's day (tasks, leads awaiting a first response, stale
# leads), each against the plain first page of the same role.
FOLLOW_UPS = {"tasks: mine, due today (agent)": ("agent", "/api/v1/tasks?filter%5Bassignee%5D=me&filter%5Bdue%5D=today"),
              "leads: next task overdue (agent)": ("agent", "/api/v1/leads?filter%5Bnext_task%5D=overdue"),
              "leads: next task overdue (admin)": ("admin", "/api/v1/leads?filter%5Bnext_task%5D=overdue"),
              "leads: response overdue (agent)": ("agent", "/api/v1/leads?filter%5Bsla%5D=overdue"),
              "leads: response overdue (admin)": ("admin", "/api/v1/leads?filter%5Bsla%5D=overdue"),
              "leads: stale (agent)": ("agent", "/api/v1/leads?filter%5Bstale%5D=true"),
              "leads: stale (admin)": ("admin", "/api/v1/leads?filter%5Bstale%5D=true")}


def measure_follow_ups(server: Server, tokens: dict[str, str], seconds: float) -> dict:
    """p50 of the first page of each follow-up list against its role's plain first page, 1 connection."""
    paths = {**{f"plain ({role})": (role, "/api/v1/leads") for role in ("agent", "admin")}, **FOLLOW_UPS}
    for role, path in paths.values():   # warm each query, and check it answers
        status, _, _ = get(server.url(path), tokens[role])
        if status != 200:
            sys.exit(f"{path} answered {status}")
        wrk(server.url(path), tokens[role], connections=1, seconds=2)
    runs: dict[str, list] = {kind: [] for kind in paths}
    for _ in range(3):   # interleaved, so noise hits every kind alike
        for kind, (role, path) in paths.items():
            runs[kind].append(wrk(server.url(path), tokens[role], connections=1, seconds=seconds))
    p50 = {kind: statistics.median(r["p50_ms"] for r in kind_runs) for kind, kind_runs in runs.items()}
    found = {kind: len(get(server.url(path), tokens[role])[1]["data"]) for kind, (role, path) in FOLLOW_UPS.items()}
    return {"queries": {kind: path for kind, (_, path) in FOLLOW_UPS.items()},
            "kinds": {kind: {"p50_ms": p50[kind], "first_p50_ms": p50[f"plain ({role})"],
                             "ratio": round(p50[kind] / p50[f"plain ({role})"], 3), "rows": found[kind],
                             "errors": sum(r["errors_status"] for r in runs[kind])}
                      for kind, (role, _) in FOLLOW_UPS.items()}}


def measure_search_only(db: Database, tokens: dict, seconds: float, service_root: str | None = None) -> dict:
    """--search-only: the search and follow-up figures alone, without the baseline and the other phases."""
    secret = tokens["tokens"][ROLES["admin"]]["token"]
    secrets = {role: tokens["tokens"][email]["token"] for role, email in ROLES.items()}
    leadsvc = Server("leadsvc-" + db.backend, [sys.executable, "-m", "leadsvc.cli", "serve", "--port", str(LEADSVC_PORT)],
                     leadsvc_env(db.url, service_root), LEADSVC_PORT)
    try:
        return {"backend": db.backend, "plans": query_plans(db), "search": measure_search(leadsvc, secret, seconds),
                "follow_ups": measure_follow_ups(leadsvc, secrets, seconds)}
    finally:
        leadsvc.stop()


def measure_batch(db: Database, server: Server, token: str, seconds: float) -> dict:
    """A batch of BATCH_SIZE new leads against as many single creates of new leads, one connection
    each: the time a client waits for a batch against the time it waits for BATCH_SIZE creates sent
    one after the other (mean times, from each run's requests per second: a client waits the sum,
    not BATCH_SIZE medians). What they write is deleted afterwards."""
    _, sources, _ = get(server.url("/api/v1/sources"), token)
    env = {"BENCH_SOURCES": ",".join(s["id"] for s in sources["data"]), "BENCH_DUPLICATE_SHARE": "0",
           "BENCH_BATCH_SIZE": str(BATCH_SIZE)}
    marks = db.high_water()
    try:
        single = lambda duration: wrk(server.url("/api/v1/leads"), token, connections=1,  # noqa: E731
                                      seconds=duration, script="create.lua", env=env)
        batch = lambda duration: wrk(server.url("/api/v1/leads/batch"), token, connections=1,  # noqa: E731
                                     seconds=duration, script="batch.lua", env=env)
        single(2), batch(2)   # warm both paths
        singles, batches = [], []
        for _ in range(3):   # interleaved, so noise hits both alike
            singles.append(single(seconds))
            batches.append(batch(seconds))
    finally:
        db.restore(marks)
    single_ms = statistics.median(1000 / r["rps"] for r in singles)
    batch_ms = statistics.median(1000 / r["rps"] for r in batches)
    return {"size": BATCH_SIZE, "single_ms": round(single_ms, 2), "batch_ms": round(batch_ms, 1),
            "singles_ms": round(BATCH_SIZE * single_ms, 1), "ratio": round(batch_ms / (BATCH_SIZE * single_ms), 3),
            "single_p50_ms": statistics.median(r["p50_ms"] for r in singles),
            "batch_p50_ms": statistics.median(r["p50_ms"] for r in batches),
            "batch_leads_per_s": round(BATCH_SIZE * 1000 / batch_ms, 1), "single_leads_per_s": round(1000 / single_ms, 1),
            "errors": sum(r["errors_status"] + r["errors_socket"] for r in singles + batches)}


def measure_alone(phase: str, db: Database, tokens: dict, seconds: float, service_root: str | None = None) -> dict:
    """--batch-only, --intake-only: that phase's figures alone, without the baseline and the other phases."""
    secret = tokens["tokens"][ROLES["admin"]]["token"]
    leadsvc = Server("leadsvc-" + db.backend, [sys.executable, "-m", "leadsvc.cli", "serve", "--port", str(LEADSVC_PORT)],
                     leadsvc_env(db.url, service_root), LEADSVC_PORT)
    measure_phase = {"batch": measure_batch, "intake": measure_intake}[phase]
    try:
        return {"backend": db.backend, phase: measure_phase(db, leadsvc, secret, seconds)}
    finally:
        leadsvc.stop()


# The phases of measure(); --compare runs only those whose ratios a change must not worsen.
PHASES = ("list", "pages", "search", "follow_ups", "create", "intake", "batch", "reports")
COMPARED = ("list", "create", "batch")


def measure(db: Database, tokens: dict, seconds: float, service_root: str | None = None,
            phases: tuple[str, ...] = PHASES) -> dict:
    secret = {role: tokens["tokens"][email]["token"] for role, email in ROLES.items()}
    env = leadsvc_env(db.url, service_root)
    leadsvc = Server("leadsvc-" + db.backend, [sys.executable, "-m", "leadsvc.cli", "serve", "--port", str(LEADSVC_PORT)],
                     env, LEADSVC_PORT)
    baseline = Server("baseline-" + db.backend, [sys.executable, str(BENCH / "baseline.py"), "--url", db.url,
                                                  "--port", str(BASELINE_PORT), "--threads", "8"],
                      os.environ.copy(), BASELINE_PORT)
    results: dict = {"backend": db.backend, "plans": query_plans(db)}
    try:
        list_path = "/api/v1/leads"
        for server in (leadsvc, baseline):   # warm caches and connections
            wrk(server.url(list_path), secret["admin"], connections=8, seconds=3)
        if service_root is None:   # an older checkout's lead has fewer fields
            same_pages(leadsvc, baseline, secret)

        if "list" in phases:
            log(f"{db.backend}: list throughput, 8 connections, per role")
            results["list"] = {}
        for role in ROLES if "list" in phases else ():
            runs = {"leadsvc": [], "baseline": []}
            for _ in range(PAIRS):   # back to back, so a burst of noise hits both of a pair
                runs["leadsvc"].append(wrk(leadsvc.url(list_path), secret[role], connections=8, seconds=seconds))
                runs["baseline"].append(wrk(baseline.url(list_path), secret[role], connections=8, seconds=seconds))
            ratios = [own["rps"] / base["rps"] for own, base in zip(runs["leadsvc"], runs["baseline"])]
            errors = sum(r["errors_status"] + r["errors_socket"] for rs in runs.values() for r in rs)
            results["list"][role] = {"rps": round(statistics.mean(r["rps"] for r in runs["leadsvc"]), 1),
                                     "baseline_rps": round(statistics.mean(r["rps"] for r in runs["baseline"]), 1),
                                     "ratio": round(statistics.median(ratios), 3),
                                     "ratios": [round(r, 3) for r in ratios],
                                     "p50_ms": statistics.median(r["p50_ms"] for r in runs["leadsvc"]),
                                     "errors": errors}

        if "pages" in phases:
            results.update(measure_pages(leadsvc, secret["admin"], seconds))
        if "search" in phases:
            log(f"{db.backend}: search (q) pages vs the plain first page, 1 connection")
            results["search"] = measure_search(leadsvc, secret["admin"], seconds)
        if "follow_ups" in phases:
            log(f"{db.backend}: follow-up lists (tasks, overdue and stale leads) vs the plain first page, 1 connection")
            results["follow_ups"] = measure_follow_ups(leadsvc, secret, seconds)
        if "create" in phases:
            log(f"{db.backend}: creates (new and duplicate leads), 8 connections")
            results["create"] = measure_creates(db, leadsvc, baseline, secret["admin"], seconds)
        if "intake" in phases:
            log(f"{db.backend}: Google Ads intakes against API creates, 8 connections")
            results["intake"] = measure_intake(db, leadsvc, secret["admin"], seconds)
        if "batch" in phases:
            log(f"{db.backend}: a batch of {BATCH_SIZE} new leads vs {BATCH_SIZE} single creates, 1 connection")
            results["batch"] = measure_batch(db, leadsvc, secret["admin"], seconds)
        if "reports" in phases:
            log(f"{db.backend}: reports, admin scope")
            results["reports"] = measure_reports(leadsvc, secret["admin"])
        results["rss_mb"] = round(leadsvc.peak_rss_mb(), 1)
        results["baseline_rss_mb"] = round(baseline.peak_rss_mb(), 1)
    finally:
        leadsvc.stop()
        baseline.stop()
    if service_root is None and phases == PHASES:   # another checkout may have no webhooks
        log(f"{db.backend}: webhooks, lag on an idle server and sustained delivery")
        results["webhooks"] = measure_webhooks(db, tokens)
        log(f"{db.backend}: one clock tick with nothing due")
        results["clock"] = measure_clock(db)
    return results


def measure_pages(leadsvc: Server, admin: str, seconds: float) -> dict:
    """The admin's first page against a page DEEP_ROWS rows deep, 1 connection."""
    list_path = "/api/v1/leads"
    log(f"{leadsvc.name}: first page vs a page {DEEP_ROWS:,} rows deep, 1 connection")
    cursor = deep_cursor(leadsvc, admin)
    deep_path = f"{list_path}?page%5Bafter%5D={cursor}"
    for path in (list_path, deep_path):   # warm both queries (prepared statements, pages) first
        wrk(leadsvc.url(path), admin, connections=1, seconds=2)
    first, deep = [], []
    for _ in range(3):
        first.append(wrk(leadsvc.url(list_path), admin, connections=1, seconds=seconds))
        deep.append(wrk(leadsvc.url(deep_path), admin, connections=1, seconds=seconds))
    p50 = lambda runs, key: statistics.median(r[key] for r in runs)   # noqa: E731
    pages = {"first_p50_ms": p50(first, "p50_ms"), "first_p99_ms": p50(first, "p99_ms"),
             "deep_p50_ms": p50(deep, "p50_ms"), "deep_p99_ms": p50(deep, "p99_ms"),
             "errors": sum(r["errors_status"] for r in first + deep)}
    pages["ratio"] = round(pages["deep_p50_ms"] / pages["first_p50_ms"], 3)
    return {"pages": pages}


def measure_creates(db: Database, leadsvc: Server, baseline: Server, admin: str, seconds: float) -> dict:
    """Creates of new and duplicate leads, 8 connections, leadsvc and the baseline in pairs; what
    they added is deleted afterwards."""
    list_path = "/api/v1/leads"
    _, sample, _ = get(leadsvc.url(f"{list_path}?page%5Bsize%5D=200"), admin)
    _, sources, _ = get(leadsvc.url("/api/v1/sources"), admin)
    create_env = {"BENCH_DUPLICATE_PHONES": ",".join(l["contact"]["phone"] for l in sample["data"]
                                                     if l["contact"]["phone"]),
                  "BENCH_SOURCES": ",".join(s["id"] for s in sources["data"])}
    marks = db.high_water()

    def creates(server: Server, duration: float) -> dict:
        # CPU per create says where the ratio comes from: one process, one GIL, two cores.
        cpu = server.cpu_seconds()
        run = wrk(server.url(list_path), admin, connections=8, seconds=duration, script="create.lua", env=create_env)
        return {**run, "cpu_ms": 1000 * (server.cpu_seconds() - cpu) / max(1, run["requests"])}

    try:
        for server in (leadsvc, baseline):   # warm the write path: statements, caches, pool
            creates(server, 3)
        runs = {"leadsvc": [], "baseline": []}
        for _ in range(PAIRS):   # back to back, as for lists: a burst of disk or CPU noise hits both
            runs["leadsvc"].append(creates(leadsvc, seconds))
            runs["baseline"].append(creates(baseline, seconds))
        with db.connect() as conn:
            created = conn.execute(f"SELECT COUNT(*) FROM lead WHERE id > {marks['lead']}").fetchone()[0]
    finally:
        db.restore(marks)
    own, base = runs["leadsvc"], runs["baseline"]
    ratios = [o["rps"] / b["rps"] for o, b in zip(own, base)]
    return {"rps": round(statistics.mean(r["rps"] for r in own), 1),
            "baseline_rps": round(statistics.mean(r["rps"] for r in base), 1),
            "ratio": round(statistics.median(ratios), 3), "ratios": [round(r, 3) for r in ratios],
            "p50_ms": statistics.median(r["p50_ms"] for r in own),
            "p99_ms": statistics.median(r["p99_ms"] for r in own),
            "errors": sum(r["errors_status"] for r in own),
            "baseline_errors": sum(r["errors_status"] for r in base), "leads_created": created,
            "cpu_ms": round(statistics.median(r["cpu_ms"] for r in own), 2),
            "baseline_cpu_ms": round(statistics.median(r["cpu_ms"] for r in base), 2)}


# The connector the intake phase posts to: setup adds it to the demo workspace (again: setup is
# idempotent), and a new key is issued for each run, as the key is never stored.
BENCH_CONNECTOR = """
[workspace]
name = "Demo Realty"

[[sources]]
name = "Google Ads"

[[connectors]]
name = "Bench Google Ads"
kind = "google_ads"
source = "Google Ads"
custom_fields = { "INTEREST" = "product_interest" }
"""


def bench_connector(url: str) -> tuple[str, str]:
    """The bench's Google Ads connector in the demo workspace of the database at `url`: its id and
    a new key."""
    setup_file = CACHE / "bench-connector.toml"
    setup_file.write_text(BENCH_CONNECTOR)
    env = service_env(url)
    done = subprocess.run([str(BIN / "leadsvc"), "setup", str(setup_file), "--json"], env=env,
                          capture_output=True, text=True, cwd=CACHE)
    if done.returncode:
        sys.exit(f"leadsvc setup of the bench connector failed:\n{done.stderr}")
    connector_id = json.loads(done.stdout)["connectors"]["Bench Google Ads"]["id"]
    done = subprocess.run([str(BIN / "leadsvc"), "connectors", "rotate-key", connector_id, "--json"], env=env,
                          capture_output=True, text=True, cwd=CACHE)
    if done.returncode:
        sys.exit(f"leadsvc connectors rotate-key failed:\n{done.stderr}")
    return connector_id, json.loads(done.stdout)["key"]


def measure_intake(db: Database, leadsvc: Server, admin: str, seconds: float) -> dict:
    """Google Ads lead form webhooks (bench/wrk/intake.lua) against API creates (create.lua), the
    same mix of new and duplicate phones, 8 connections each, in pairs on the same server: the
    intake's rate over the creates', and its latency as 8 senders see it. What they wrote is
    deleted afterwards."""
    connector_id, key = bench_connector(db.url)
    _, sample, _ = get(leadsvc.url("/api/v1/leads?page%5Bsize%5D=200"), admin)
    _, sources, _ = get(leadsvc.url("/api/v1/sources"), admin)
    env = {"BENCH_DUPLICATE_PHONES": ",".join(l["contact"]["phone"] for l in sample["data"] if l["contact"]["phone"]),
           "BENCH_SOURCES": ",".join(s["id"] for s in sources["data"]), "BENCH_GOOGLE_KEY": key}
    marks = db.high_water()
    run_number = iter(range(1_000_000))

    def intakes(duration: float) -> dict:
        return wrk(leadsvc.url(f"/api/v1/intake/{connector_id}"), admin, connections=8, seconds=duration,
                   script="intake.lua", env={**env, "BENCH_RUN": f"{int(time.time())}-{next(run_number)}"})

    def creates(duration: float) -> dict:
        return wrk(leadsvc.url("/api/v1/leads"), admin, connections=8, seconds=duration, script="create.lua", env=env)

    try:
        intakes(3), creates(3)   # warm both paths
        runs = {"intake": [], "create": []}
        for _ in range(PAIRS):
            runs["intake"].append(intakes(seconds))
            runs["create"].append(creates(seconds))
        with db.connect() as conn:
            outcomes = dict(conn.execute(f"SELECT outcome, COUNT(*) FROM intake WHERE id > {marks['intake']} "
                                         "GROUP BY outcome").fetchall())
    finally:
        db.restore(marks)
    ratios = [i["rps"] / c["rps"] for i, c in zip(runs["intake"], runs["create"])]
    own = runs["intake"]
    return {"rps": round(statistics.mean(r["rps"] for r in own), 1),
            "create_rps": round(statistics.mean(r["rps"] for r in runs["create"]), 1),
            "ratio": round(statistics.median(ratios), 3), "ratios": [round(r, 3) for r in ratios],
            "p50_ms": statistics.median(r["p50_ms"] for r in own),
            "p99_ms": statistics.median(r["p99_ms"] for r in own), "p99s_ms": [r["p99_ms"] for r in own],
            "errors": sum(r["errors_status"] + r["errors_socket"] for r in own), "outcomes": outcomes}


def measure_reports(leadsvc: Server, admin: str) -> dict:
    """Each report as the admin: 5 runs after a warm-up; None for one this build does not have."""
    reports: dict = {}
    for name in REPORTS:
        url = leadsvc.url(f"/api/v1/reports/{name}")
        status, _, _ = get(url, admin)
        if status == 404:
            reports[name] = None   # not on this build
            continue
        if status != 200:
            reports[name] = {"error": status}
            continue
        times = [get(url, admin)[2] for _ in range(5)]
        reports[name] = {"median_s": round(statistics.median(times), 3), "max_s": round(max(times), 3)}
    return reports


def measure_clock(db: Database, service_root: str | None = None) -> dict:
    """The median of CLOCK_TICKS clock ticks with nothing due, in a process of their own."""
    done = subprocess.run([sys.executable, "-c", CLOCK_TICK, str(CLOCK_TICKS)], env=leadsvc_env(db.url, service_root),
                          capture_output=True, text=True, cwd=CACHE)
    if done.returncode:
        sys.exit(f"{db.backend}: the clock ticks failed:\n{done.stderr}")
    return json.loads(done.stdout)


def clock_verdicts(r: dict) -> list[tuple[str, str, str, bool | None]]:
    c = r["clock"]
    return [("one clock tick with nothing due (median)", f"< {TARGETS['clock_tick_ms']:.0f} ms",
             f"{c['median_ms']:.2f} ms (max {c['max_ms']:.2f} ms, {c['ticks']} ticks; the first fired "
             f"{c.get('caught_up', 0)} timers due since the build)",
             c["median_ms"] < TARGETS["clock_tick_ms"] and not c["due"])]


# --- jobs ------------------------------------------------------------------------------------

JOB_DEACTIVATED_LEADS = 5_000   # open leads of the member deactivated
JOB_LEADS = 10_000              # leads of the bulk move, rows of the import
JOB_LOAD_THREADS = 2            # clients writing or listing while a job runs
# What a person reading the list leaves between pages; writes come back to back.
PAGE_PAUSE_SECONDS = 0.1


class Load:
    """Requests one after the other from a few threads until stopped (each waiting `pause`
    seconds after an answer): their latencies and errors."""

    def __init__(self, request, threads: int = JOB_LOAD_THREADS, pause: float = 0.0):
        self.pause = pause
        self.latencies: list[float] = []
        self.errors = 0
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(request, n)) for n in range(threads)]

    def run(self, request, worker: int) -> None:
        n = 0
        while not self.stopping.is_set():
            n += 1
            started = time.perf_counter()
            status = request(worker, n)
            self.latencies.append((time.perf_counter() - started) * 1000)
            self.errors += status >= 400
            self.stopping.wait(self.pause)

    def __enter__(self) -> "Load":
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join()

    def figures(self) -> dict:
        ordered = sorted(self.latencies)
        return {"requests": len(ordered), "errors": self.errors,
                "p50_ms": round(ordered[len(ordered) // 2], 1) if ordered else None,
                "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 1) if ordered else None}


def send(url: str, token: str, method: str, body: bytes | None, content_type: str = "application/json") -> tuple[int, dict | None]:
    request = urllib.request.Request(url, data=body, method=method,
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def wait_for_job(server: Server, token: str, job: dict, started: float) -> dict:
    """Poll the job until it finishes; its document, with the seconds from the request to the end."""
    while True:
        status, body = send(server.url(f"/api/v1/jobs/{job['id']}"), token, "GET", None)
        if status != 200:
            sys.exit(f"GET /api/v1/jobs/{job['id']}: {status} {body}")
        if body["data"]["state"] in ("succeeded", "failed"):
            return {**body["data"], "seconds": round(time.monotonic() - started, 1)}
        time.sleep(0.2)


def measure_jobs(db: Database, tokens: dict, seconds: float, service_root: str | None = None,
                 worker: bool = False) -> dict:
    """On a copy of the database, one serving process whose clock runs the jobs (with `worker`: a
    `leadsvc worker` beside it runs them, its clock ticking every second): a deactivation whose job
    reassigns JOB_DEACTIVATED_LEADS open leads while clients PATCH other leads, then a bulk move of
    JOB_LEADS leads and an import of JOB_LEADS rows while clients list leads, against the list
    pages of the idle server."""
    scratch = db.scratch()
    admin = tokens["tokens"][ROLES["admin"]]["token"]
    try:
        with scratch.connect() as conn:
            (workspace,) = conn.execute(f"SELECT workspace_id FROM member WHERE email = '{ROLES['admin']}'").fetchone()
            members = {email: (member_id, team_id, public_id) for email, member_id, team_id, public_id in conn.execute(
                "SELECT email, id, team_id, public_id FROM member WHERE workspace_id = %d" % workspace).fetchall()}
            open_ids = [row[0] for row in conn.execute(
                "SELECT id FROM status WHERE workspace_id = %d AND kind = 'open' ORDER BY position" % workspace)]
            statuses = dict(conn.execute("SELECT name, public_id FROM status WHERE workspace_id = %d" % workspace))
            reason = conn.execute("SELECT public_id FROM lost_reason WHERE workspace_id = %d ORDER BY position" %
                                  workspace).fetchone()[0]
            # Exactly JOB_DEACTIVATED_LEADS open leads for the agent to deactivate: its own go to its
            # teammate first.
            leaving, taking = members["ravi@demo.test"], members["meera@demo.test"]
            in_open = ",".join(map(str, open_ids))
            conn.execute(f"UPDATE lead SET owner_id = {taking[0]}, team_id = {taking[1]} WHERE owner_id = {leaving[0]}")
            conn.execute(f"UPDATE lead SET owner_id = {leaving[0]}, team_id = {leaving[1]} WHERE id IN (SELECT id FROM "
                         f"lead WHERE workspace_id = {workspace} AND status_id IN ({in_open}) ORDER BY id DESC "
                         f"LIMIT {JOB_DEACTIVATED_LEADS})")
            patched = [row[0] for row in conn.execute(
                f"SELECT public_id FROM lead WHERE owner_id = {taking[0]} ORDER BY id LIMIT 200")]
            # Open leads can all move to Lost; the deactivated agent's too, reassigned by then.
            moved = [row[0] for row in conn.execute(
                f"SELECT public_id FROM lead WHERE workspace_id = {workspace} AND status_id IN ({in_open}) "
                f"ORDER BY id LIMIT {JOB_LEADS}")]
        clock_env = {"LEADSVC_CLOCK_IN_SERVE": "false"} if worker else {}
        leadsvc = Server("leadsvc-jobs-" + db.backend, [sys.executable, "-m", "leadsvc.cli", "serve", "--port",
                                                        str(LEADSVC_PORT)],
                         leadsvc_env(scratch.url, service_root, **clock_env), LEADSVC_PORT)
        clock = subprocess.Popen([sys.executable, "-m", "leadsvc.cli", "worker"], cwd=CACHE,
                                 env=leadsvc_env(scratch.url, service_root, LEADSVC_CLOCK_INTERVAL="1"),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT) if worker else None
        try:
            page = leadsvc.url("/api/v1/leads")
            list_page = lambda worker, n: get(page, admin)[0]
            patch = lambda worker, n: send(leadsvc.url(f"/api/v1/leads/{patched[(n * 2 + worker) % len(patched)]}"),
                                           admin, "PATCH", json.dumps({"first_name": f"Load {n}"}).encode())[0]
            with Load(list_page, pause=PAGE_PAUSE_SECONDS) as idle:
                time.sleep(seconds)
            with Load(patch) as idle_writes:
                time.sleep(seconds)
            results = {"idle_pages": idle.figures(), "idle_writes": idle_writes.figures()}

            log(f"{db.backend}: deactivating an agent with {JOB_DEACTIVATED_LEADS:,} open leads, PATCHes alongside")
            with Load(patch) as writes:
                started = time.monotonic()
                status, body = send(leadsvc.url(f"/api/v1/members/{leaving[2]}/deactivate"), admin, "POST",
                                    json.dumps({"reassign_to": taking[2]}).encode())
                if status != 202:
                    sys.exit(f"deactivate: {status} {body}")
                results["deactivate"] = wait_for_job(leadsvc, admin, body["data"], started)
            results["deactivate"]["writes"] = writes.figures()

            log(f"{db.backend}: a bulk move of {len(moved):,} leads to Lost, list pages alongside")
            with Load(list_page, pause=PAGE_PAUSE_SECONDS) as pages:
                started = time.monotonic()
                status, body = send(leadsvc.url("/api/v1/leads/bulk"), admin, "POST", json.dumps(
                    {"action": "move", "ids": moved, "params": {"status": statuses["Lost"], "reason": reason}}).encode())
                if status != 202:
                    sys.exit(f"bulk move: {status} {body}")
                results["move"] = wait_for_job(leadsvc, admin, body["data"], started)
            results["move"]["pages"] = pages.figures()

            log(f"{db.backend}: an import of {JOB_LEADS:,} rows, list pages alongside")
            run = int(time.time()) % 1000
            rows = ["first_name,last_name,phone,email,source"] + [
                f"Import,Row {i},+9197{run:03d}{i:05d},import.{run}.{i}@bench.test,Website" for i in range(JOB_LEADS)]
            with Load(list_page, pause=PAGE_PAUSE_SECONDS) as pages:
                started = time.monotonic()
                status, body = send(leadsvc.url("/api/v1/imports"), admin, "POST", ("\n".join(rows) + "\n").encode(),
                                    "text/csv")
                if status != 202:
                    sys.exit(f"import: {status} {body}")
                results["import"] = wait_for_job(leadsvc, admin, body["data"], started)
            results["import"]["pages"] = pages.figures()
            return {"backend": db.backend, "jobs": {**results, "runner": "worker" if worker else "serve"}}
        finally:
            leadsvc.stop()
            if clock is not None:
                clock.terminate()
                clock.wait(30)
    finally:
        scratch.drop()


def job_verdicts(r: dict) -> list[tuple[str, str, str, bool | None]]:
    j = r["jobs"]
    rows = [("jobs run by", "", "a `leadsvc worker` beside the server" if j["runner"] == "worker"
             else "the serving process's clock", None)]
    d = j["deactivate"]
    rows.append((f"API writes (PATCH, {JOB_LOAD_THREADS} clients) while a deactivation reassigns {d['total']:,} leads",
                 f"p99 < {TARGETS['writes_during_job_p99_ms']:.0f} ms",
                 f"p99 {d['writes']['p99_ms']} ms (p50 {d['writes']['p50_ms']} ms, {d['writes']['requests']:,} requests, "
                 f"{d['writes']['errors']} errors; idle p99 {j['idle_writes']['p99_ms']} ms); the job took "
                 f"{d['seconds']} s, {d['failed']} failed",
                 d["writes"]["p99_ms"] < TARGETS["writes_during_job_p99_ms"] and not d["writes"]["errors"]
                 and d["state"] == "succeeded"))
    for name, what in (("move", "bulk move"), ("import", "import")):
        job = j[name]
        rows.append((f"{what} of {job['total']:,} {'rows' if name == 'import' else 'leads'}, request to end",
                     f"< {TARGETS['job_seconds']:.0f} s", f"{job['seconds']} s ({job['done']:,} done, "
                                                          f"{job['failed']:,} failed)",
                     job["seconds"] < TARGETS["job_seconds"] and job["state"] == "succeeded"))
        ratio = job["pages"]["p99_ms"] / j["idle_pages"]["p99_ms"]
        rows.append((f"list pages ({JOB_LOAD_THREADS} clients, {PAGE_PAUSE_SECONDS:g} s between pages) during the "
                     f"{what} / idle, p99",
                     f"< {TARGETS['pages_during_job_over_idle_p99']}",
                     f"{ratio:.2f} ({job['pages']['p99_ms']} / {j['idle_pages']['p99_ms']} ms; "
                     f"{job['pages']['errors']} errors)",
                     ratio < TARGETS["pages_during_job_over_idle_p99"] and not job["pages"]["errors"]))
    return rows


# --- webhooks ----------------------------------------------------------------------------------

class Receiver:
    """A webhook receiver in this process: when each event arrived, and the time its body says it
    was written (in the transaction of its change, just before the commit)."""

    def __init__(self):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.arrivals: dict[str, tuple[float, float]] = {}   # webhook-id -> (arrived, written)
        self.duplicates = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                written = datetime.fromisoformat(body["timestamp"].replace("Z", "+00:00")).timestamp()
                key = self.headers["webhook-id"]
                receiver.duplicates += key in receiver.arrivals
                receiver.arrivals[key] = (time.time(), written)
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_for(self, count: int, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while len(self.arrivals) < count and time.monotonic() < deadline:
            time.sleep(0.005)
        return len(self.arrivals) >= count


def post_json(url: str, token: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return response.status, json.loads(response.read() or b"null")


def measure_webhooks(db: Database, tokens: dict, service_root: str | None = None) -> dict:
    """Commit-to-delivery lag on an idle server, and sustained delivery of a backlog, to a local receiver."""
    admin = tokens["tokens"][ROLES["admin"]]["token"]
    receiver = Receiver()
    env = leadsvc_env(db.url, service_root, LEADSVC_WEBHOOKS_SECRET_KEY="bench-webhook-secret-key-0123456789abcdef",
                      LEADSVC_WEBHOOKS_ALLOW_HTTP="true", LEADSVC_WEBHOOKS_ALLOW_PRIVATE_NETWORKS="true")
    serve = [sys.executable, "-m", "leadsvc.cli", "serve", "--port", str(LEADSVC_PORT)]
    marks = db.high_water()
    phones = (f"+9196{n:08d}" for n in range(10**8))
    try:
        leadsvc = Server(f"leadsvc-{db.backend}-webhooks", serve, env, LEADSVC_PORT)
        try:
            post_json(leadsvc.url("/api/v1/webhooks"), admin, {"url": receiver.url, "events": ["lead.created"]})
            lags = []
            for _ in range(WEBHOOK_LAG_SAMPLES):
                expected = len(receiver.arrivals) + 1   # counted first: the event may arrive before the 201
                post_json(leadsvc.url("/api/v1/leads"), admin, {"first_name": "Hook", "phone": next(phones)})
                if not receiver.wait_for(expected, 30):
                    sys.exit(f"{db.backend}: event {len(lags) + 1} was not delivered within 30 s; "
                             f"see {leadsvc.log.name}")
                arrived, written = max(receiver.arrivals.values())
                lags.append(arrived - written)
                time.sleep(0.1)   # idle between changes
        finally:
            leadsvc.stop()

        # The backlog: written by a server that does not deliver, then sent by one that does.
        quiet = Server(f"leadsvc-{db.backend}-queue", serve, {**env, "LEADSVC_WEBHOOKS_DELIVER_IN_SERVE": "false"},
                       LEADSVC_PORT)
        try:
            with ThreadPoolExecutor(4) as pool:
                list(pool.map(lambda phone: post_json(quiet.url("/api/v1/leads"), admin, {"phone": phone}),
                              [next(phones) for _ in range(WEBHOOK_BACKLOG)]))
        finally:
            quiet.stop()
        already = len(receiver.arrivals)
        sending = Server(f"leadsvc-{db.backend}-deliver", serve, env, LEADSVC_PORT)
        try:
            if not receiver.wait_for(already + WEBHOOK_BACKLOG, 300):
                sys.exit(f"{db.backend}: the backlog was not delivered within 300 s; see {sending.log.name}")
        finally:
            sending.stop()
        backlog = sorted(arrived for arrived, _ in list(receiver.arrivals.values())[already:])
        per_second = (len(backlog) - 1) / (backlog[-1] - backlog[0])
    finally:
        receiver.server.shutdown()
        db.restore(marks)
    return {"lag_p50_s": round(statistics.median(lags), 4), "lag_p90_s": round(statistics.quantiles(lags, n=10)[-1], 4),
            "lag_samples": len(lags), "backlog": WEBHOOK_BACKLOG, "events_per_s": round(per_second, 1),
            "duplicates": receiver.duplicates}


def webhook_verdicts(r: dict) -> list[tuple[str, str, str, bool | None]]:
    w = r["webhooks"]
    return [("webhook lag, commit to delivery, idle server (p50)", f"< {TARGETS['webhook_lag_p50_s']} s",
             f"{w['lag_p50_s'] * 1000:.0f} ms (p90 {w['lag_p90_s'] * 1000:.0f} ms, {w['lag_samples']} events)",
             w["lag_p50_s"] < TARGETS["webhook_lag_p50_s"]),
            ("webhook delivery, sustained", f">= {TARGETS['webhook_events_per_s']} events/s",
             f"{w['events_per_s']:.0f} events/s ({w['backlog']:,} queued events, {w['duplicates']} sent twice)",
             w["events_per_s"] >= TARGETS["webhook_events_per_s"] and not w["duplicates"])]


# --- the report ------------------------------------------------------------------------------

def machine(backends: list[str]) -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    mem_kb = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1))
    info = {"cpu": cpu, "cores": os.cpu_count(), "ram_gb": round(mem_kb / 2**20, 1),
            "python": platform.python_version(), "sqlite": sqlite3.sqlite_version,
            "wrk": subprocess.run(["wrk", "--version"], capture_output=True, text=True).stdout.split("\n")[0].strip()}
    if "postgresql" in backends:
        import psycopg
        with psycopg.connect(POSTGRES_URL.rsplit("/", 1)[0] + "/postgres") as conn:
            info["postgresql"] = conn.execute("SHOW server_version").fetchone()[0]
    return info


def search_verdicts(r: dict) -> list[tuple[str, str, str, bool | None]]:
    search = r["search"]
    return [(f"search page p50 / first page p50: {kind}",
             f"<= {TARGETS['search_over_first_p50']}" if kind in TARGETED_SEARCHES else "(no target)",
             f"{v['ratio']:.2f} ({v['p50_ms']:.1f} / {search['first_p50_ms']:.1f} ms, {v['rows']} rows)",
             (v["ratio"] <= TARGETS["search_over_first_p50"] and not v["errors"]) if kind in TARGETED_SEARCHES
             else None)
            for kind, v in search["kinds"].items()]


def follow_up_verdicts(r: dict) -> list[tuple[str, str, str, bool | None]]:
    return [(f"follow-up page p50 / first page p50: {kind}", f"<= {TARGETS['follow_up_over_first_p50']}",
             f"{v['ratio']:.2f} ({v['p50_ms']:.1f} / {v['first_p50_ms']:.1f} ms, {v['rows']} rows)",
             v["ratio"] <= TARGETS["follow_up_over_first_p50"] and not v["errors"])
            for kind, v in r.get("follow_ups", {}).get("kinds", {}).items()]


def batch_verdicts(r: dict) -> list[tuple[str, str, str, bool | None]]:
    b = r["batch"]
    return [(f"batch of {b['size']} new leads / {b['size']} single creates, one after the other (1 connection)",
             f"<= {TARGETS['batch_over_singles']}",
             f"{b['ratio']:.2f} ({b['batch_ms']:.0f} / {b['singles_ms']:.0f} ms)",
             b["ratio"] <= TARGETS["batch_over_singles"] and not b["errors"])]


def intake_verdicts(r: dict) -> list[tuple[str, str, str, bool | None]]:
    i = r["intake"]
    return [("Google Ads intakes / API creates, same mix (8 connections)", f">= {TARGETS['intake_over_creates']}",
             f"{i['ratio']:.2f} (pairs {', '.join(f'{x:.2f}' for x in i['ratios'])}; "
             f"{i['rps']:.0f} / {i['create_rps']:.0f} req/s)",
             i["ratio"] >= TARGETS["intake_over_creates"] and not i["errors"]),
            ("intake p99 at 8 concurrent senders (median of the runs, as for creates)", f"< {TARGETS['intake_p99_ms']:.0f} ms",
             f"{i['p99_ms']:.1f} ms (runs {', '.join(f'{x:.0f}' for x in i['p99s_ms'])}; p50 {i['p50_ms']:.1f} ms; outcomes "
             f"{', '.join(f'{k} {v:,}' for k, v in sorted(i['outcomes'].items()))})",
             i["p99_ms"] < TARGETS["intake_p99_ms"] and not i["errors"])]


def verdicts(r: dict) -> list[tuple[str, str, str, bool | None]]:
    """(target, goal, measured, passed) rows for one database."""
    if "list" not in r:   # --search-only, --webhooks-only, --batch-only, --clock-only
        return ((search_verdicts(r) if "search" in r else []) + follow_up_verdicts(r)
                + (webhook_verdicts(r) if "webhooks" in r else [])
                + (batch_verdicts(r) if "batch" in r else []) + (intake_verdicts(r) if "intake" in r else [])
                + (clock_verdicts(r) if "clock" in r else []) + (job_verdicts(r) if "jobs" in r else []))
    rows = [(f"list throughput, {role}", f">= {TARGETS['list_ratio']} x baseline",
             f"{r['list'][role]['ratio']:.2f} (pairs {', '.join(f'{x:.2f}' for x in r['list'][role]['ratios'])}; "
             f"{r['list'][role]['rps']:.0f} / {r['list'][role]['baseline_rps']:.0f} req/s)",
             r["list"][role]["ratio"] >= TARGETS["list_ratio"]) for role in ROLES]
    pages = r["pages"]
    rows.append(("deep page p50 / first page p50", f"<= {TARGETS['deep_over_first_p50']}",
                 f"{pages['ratio']:.2f} ({pages['deep_p50_ms']:.1f} / {pages['first_p50_ms']:.1f} ms)",
                 pages["ratio"] <= TARGETS["deep_over_first_p50"]))
    rows += search_verdicts(r) + follow_up_verdicts(r)
    for name in REPORTS:
        report = r["reports"].get(name)
        if report is None:
            rows.append((f"report {name} (admin)", "< 1 s", "not available on this build", None))
        elif "error" in report:
            rows.append((f"report {name} (admin)", "< 1 s", f"HTTP {report['error']}", False))
        else:
            rows.append((f"report {name} (admin)", "< 1 s", f"{report['median_s']:.3f} s (max {report['max_s']:.3f})",
                         report["max_s"] < TARGETS["report_seconds"]))
    rows += batch_verdicts(r)
    c = r["create"]
    rows.append(("create throughput", f">= {TARGETS['create_ratio']} x baseline",
                 f"{c['ratio']:.2f} (pairs {', '.join(f'{x:.2f}' for x in c['ratios'])}; "
                 f"{c['rps']:.0f} / {c['baseline_rps']:.0f} req/s)",
                 c["ratio"] >= TARGETS["create_ratio"]))
    rows += intake_verdicts(r) if "intake" in r else []
    rows.append(("peak RSS of one serving process", f"< {TARGETS['rss_mb']} MB", f"{r['rss_mb']:.0f} MB",
                 r["rss_mb"] < TARGETS["rss_mb"]))
    plans = r["plans"]
    rows.append(("query plans: lists (3 sorts x 3 roles x first/deep page), duplicate lookup", "indexes, no sort step",
                 "explain failed" if plans["error"] else
                 f"{plans['checked'] - len(plans['failed'])} of {plans['checked']} ok"
                 + (f"; failed: {', '.join(plans['failed'])}" if plans["failed"] else ""),
                 not plans["error"] and not plans["failed"]))
    return rows + (webhook_verdicts(r) if "webhooks" in r else []) + (clock_verdicts(r) if "clock" in r else [])


def batch_details(r: dict) -> list[str]:
    b = r["batch"]
    return [f"| batch of {b['size']} new leads, 1 connection | mean {b['batch_ms']:.1f} ms, p50 {b['batch_p50_ms']:.1f} ms "
            f"({b['batch_leads_per_s']:.0f} leads/s) |",
            f"| single create of a new lead, 1 connection | mean {b['single_ms']:.2f} ms, p50 {b['single_p50_ms']:.2f} ms "
            f"({b['single_leads_per_s']:.0f} leads/s) |"]


def comparison(results: list[dict]) -> list[str]:
    """--compare: the ratios to the baseline of the phases COMPARED, a line each."""
    lines = []
    for r in results:
        lines += [f"{r['backend']}: list {role} {v['ratio']:.3f} (pairs {v['ratios']})" for role, v in r["list"].items()]
        c, b = r["create"], r["batch"]
        lines += [f"{r['backend']}: create {c['ratio']:.3f} (pairs {c['ratios']}; {c['rps']:.0f} req/s, "
                  f"{c['cpu_ms']:.2f} ms CPU per create)",
                  f"{r['backend']}: batch / singles {b['ratio']:.3f} ({b['batch_ms']:.0f} / {b['singles_ms']:.0f} ms)"]
    return lines


def markdown(info: dict, results: list[dict], builds: dict, started: str, load: tuple) -> str:
    mark = {True: "pass", False: "**FAIL**", None: "n/a"}
    lines = [f"Run {started} on {info['cpu']}, {info['cores']} cores, {info['ram_gb']} GB RAM; Python "
             f"{info['python']}, SQLite {info['sqlite']}"
             + (f", PostgreSQL {info['postgresql']}" if "postgresql" in info else "")
             + f"; {info['wrk']}. Load average at start / end: {load[0]:.1f} / {load[1]:.1f}.", ""]
    for r in results:
        b = builds[r["backend"]]
        lines += [f"### {r['backend']}", "",
                  f"Database: {b['leads']:,} leads, {b['transitions']:,} transitions, {b['activities']:,} activities; "
                  f"`leadsvc demo --leads {b['leads']}` took {b['seconds']:.0f} s"
                  + (f" ({b['cpu_seconds']:.0f} s of CPU in its processes)" if "cpu_seconds" in b else "")
                  + f" (built {b['built_at']}, load average {b['load']:.1f} when it ended).", "",
                  "| target | goal | measured | result |", "|---|---|---|---|"]
        lines += [f"| {name} | {goal} | {value} | {mark[ok]} |" for name, goal, value, ok in verdicts(r)]
        if "list" not in r:   # --search-only, --webhooks-only, --batch-only, --clock-only
            lines += ["", "| detail | leadsvc |", "|---|---|", *batch_details(r), ""] if "batch" in r else [""]
            continue
        pages, c = r["pages"], r["create"]
        lines += ["", "| detail | leadsvc | baseline |", "|---|---|---|"]
        lines += [f"| list, {role}, 8 connections | {v['rps']:.0f} req/s (p50 {v['p50_ms']:.1f} ms) | "
                  f"{v['baseline_rps']:.0f} req/s |" for role, v in r["list"].items()]
        lines += [f"| first page, 1 connection | p50 {pages['first_p50_ms']:.2f} ms, p99 {pages['first_p99_ms']:.2f} ms | |",
                  f"| page {DEEP_ROWS:,} rows deep, 1 connection | p50 {pages['deep_p50_ms']:.2f} ms, "
                  f"p99 {pages['deep_p99_ms']:.2f} ms | |",
                  f"| create, 8 connections | {c['rps']:.0f} req/s (p50 {c['p50_ms']:.1f} ms, p99 {c['p99_ms']:.1f} ms, "
                  f"{c['leads_created']:,} leads created, {c['errors']} errors) | {c['baseline_rps']:.0f} req/s |",
                  f"| CPU of the serving process per create | {c['cpu_ms']:.2f} ms | {c['baseline_cpu_ms']:.2f} ms |",
                  *(f"{row} |" for row in batch_details(r)),
                  f"| peak RSS | {r['rss_mb']:.0f} MB | {r['baseline_rss_mb']:.0f} MB |", ""]
    return "\n".join(lines)


def write_results(text: str) -> None:
    path = BENCH / "RESULTS.md"
    begin, end = "<!-- bench:begin -->", "<!-- bench:end -->"
    current = path.read_text() if path.exists() else f"# Benchmark results\n\n{begin}\n{end}\n"
    if begin not in current:
        current += f"\n{begin}\n{end}\n"
    head, rest = current.split(begin, 1)
    path.write_text(f"{head}{begin}\n{text}\n{end}{rest.split(end, 1)[1]}")


def main() -> None:
    global LEADSVC_PORT, BASELINE_PORT
    parser = argparse.ArgumentParser(description="leadsvc benchmarks against the baseline")
    parser.add_argument("--leads", type=int, default=1_000_000)
    parser.add_argument("--duration", type=int, default=10, help="seconds per wrk run")
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--no-write", action="store_true", help="leave bench/RESULTS.md as it is")
    parser.add_argument("--build-only", action="store_true", help="build (or check) the databases and stop")
    parser.add_argument("--service-root", help="serve leadsvc from this checkout instead (implies --no-write)")
    parser.add_argument("--port", type=int, default=LEADSVC_PORT,
                        help="leadsvc's port (the baseline's is 10 above): another run may hold the default")
    parser.add_argument("--webhooks-only", action="store_true",
                        help="measure only webhook delivery, lag and throughput (implies --no-write)")
    parser.add_argument("--search-only", action="store_true",
                        help="measure only the search and follow-up pages against the first page (implies --no-write)")
    parser.add_argument("--batch-only", action="store_true",
                        help="measure only a batch of 100 new leads against 100 single creates (implies --no-write)")
    parser.add_argument("--intake-only", action="store_true",
                        help="measure only Google Ads intakes against API creates (implies --no-write)")
    parser.add_argument("--compare", action="store_true",
                        help="measure only list, create and batch ratios, to compare two checkouts with "
                             "--service-root (implies --no-write)")
    parser.add_argument("--clock-only", action="store_true",
                        help="measure only a clock tick with nothing due (implies --no-write)")
    parser.add_argument("--jobs-only", action="store_true",
                        help="measure only jobs: a deactivation, a bulk move and an import, on a copy of the "
                             "database (implies --no-write)")
    parser.add_argument("--jobs-worker", action="store_true",
                        help="with --jobs-only: a `leadsvc worker` runs the jobs, not the serving process")
    args = parser.parse_args()
    LEADSVC_PORT, BASELINE_PORT = args.port, args.port + 10
    if shutil.which("wrk") is None:
        sys.exit("wrk is missing: apt-get install wrk (make bench does this)")
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    OUT.mkdir(parents=True, exist_ok=True)
    CACHE.mkdir(parents=True, exist_ok=True)
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    load_start = os.getloadavg()[0]
    info = machine(backends)
    results, builds = [], {}
    for backend in backends:
        db = Database(backend, args.leads)
        tokens, builds[backend] = db.ensure()
        if args.build_only:
            log(f"{backend}: {json.dumps(builds[backend])}")
            continue
        if args.webhooks_only:
            results.append({"backend": backend, "webhooks": measure_webhooks(db, tokens, args.service_root)})
        elif args.search_only:
            results.append(measure_search_only(db, tokens, args.duration, args.service_root))
        elif args.batch_only:
            results.append(measure_alone("batch", db, tokens, args.duration, args.service_root))
        elif args.intake_only:
            results.append(measure_alone("intake", db, tokens, args.duration, args.service_root))
        elif args.clock_only:
            results.append({"backend": backend, "clock": measure_clock(db, args.service_root)})
        elif args.jobs_only:
            results.append(measure_jobs(db, tokens, args.duration, args.service_root, worker=args.jobs_worker))
        elif args.compare:
            results.append(measure(db, tokens, args.duration, args.service_root, phases=COMPARED))
        else:
            results.append(measure(db, tokens, args.duration, args.service_root))
        (OUT / f"results-{backend}.json").write_text(json.dumps({"machine": info, "build": builds[backend],
                                                                 **results[-1]}, indent=2))
    if args.build_only:
        return
    if args.compare:
        print("\n".join(comparison(results)))
        return
    text = markdown(info, results, builds, started, (load_start, os.getloadavg()[0]))
    (OUT / "latest.md").write_text(text)
    if not (args.no_write or args.service_root or args.search_only or args.webhooks_only or args.batch_only
            or args.intake_only or args.clock_only or args.jobs_only):
        write_results(text)
    print(text)
    failed = [name for r in results for name, _, _, ok in verdicts(r) if ok is False]
    if failed:
        log(f"{len(failed)} target(s) missed: " + "; ".join(failed))


if __name__ == "__main__":
    main()
