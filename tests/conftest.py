"""Fixtures: every database test runs on SQLite and on PostgreSQL, each run on fresh databases.

PostgreSQL comes from $LEADSVC_TEST_POSTGRES_URL (default postgresql://postgres@127.0.0.1:5432/postgres,
the database every server has): each run connects there to create its own database, and drops it
afterwards. Without PostgreSQL the PostgreSQL half is skipped, and the run's summary says so and how
to point the tests at a server, except under CI=true, where that is a failure.
"""

from __future__ import annotations

import json
import os
import random
import re
import uuid
from datetime import datetime, timedelta
from dataclasses import dataclass, field
from typing import Any

import pytest

from leadsvc import create_app, pipeline
from leadsvc.auth import issue_token
from leadsvc.db import database, is_postgres, make_database, migrate
from leadsvc.delivery import Deliverer
from leadsvc.models import (NEVER, NO_TASK, Delivery, Intake, Lead, Member, Source, Status, Webhook, Workspace,
                            new_public_id, utcnow)
from leadsvc.provision import apply_setup, parse_setup
from receiver import Received, Receiver
from served import InProcessServer

POSTGRES_BASE_URL = os.environ.get("LEADSVC_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
ON_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
unreachable_postgres: list[str] = []   # why PostgreSQL could not be used, for the run's summary
backend_of: dict[str, str] = {}         # test node id -> the database it runs on, for the run's summary


def _postgres_admin_connection():
    import psycopg

    return psycopg.connect(POSTGRES_BASE_URL, autocommit=True, connect_timeout=3)


@pytest.fixture(scope="session")
def postgres_server() -> str:
    """The base URL of a reachable PostgreSQL server (skip, or fail on CI, when there is none)."""
    try:
        _postgres_admin_connection().close()
    except Exception as exc:  # any reason at all: the server is not usable
        message = f"PostgreSQL at {POSTGRES_BASE_URL} is unreachable: {exc}"
        if ON_CI:
            pytest.fail(message + " (CI=true requires it)", pytrace=False)
        unreachable_postgres.append(" ".join(str(exc).split()))
        pytest.skip(message)
    return POSTGRES_BASE_URL


def pytest_terminal_summary(terminalreporter):
    """Skips are easy to miss in a long run: say once whether the PostgreSQL half ran, with its counts."""
    counts = {name: {outcome: sum(1 for report in terminalreporter.stats.get(outcome, [])
                                  if backend_of.get(getattr(report, "nodeid", "")) == name)
                     for outcome in ("passed", "failed", "error", "skipped")}
              for name in ("sqlite", "postgresql")}
    if counts["postgresql"]["passed"] or counts["postgresql"]["failed"] or counts["postgresql"]["error"]:
        terminalreporter.write_sep("=", "PostgreSQL")
        terminalreporter.write_line(
            "The PostgreSQL half of the suite ran: " + _counted(counts["postgresql"])
            + "; the SQLite half: " + _counted(counts["sqlite"]) + ".")
    if unreachable_postgres:
        terminalreporter.write_sep("=", "PostgreSQL", yellow=True)
        terminalreporter.write_line(
            f"The PostgreSQL half of the suite did not run: {POSTGRES_BASE_URL} is unreachable "
            f"({unreachable_postgres[0]}).")
        terminalreporter.write_line(
            "Start PostgreSQL there, or point the tests at a server with "
            "LEADSVC_TEST_POSTGRES_URL=postgresql://USER@HOST:PORT/postgres (a user that may create databases).")


def _counted(outcomes: dict[str, int]) -> str:
    shown = {outcome: n for outcome, n in outcomes.items() if n or outcome in ("passed", "failed")}
    return ", ".join(f"{n} {outcome}" for outcome, n in shown.items())


def create_postgres_database(base_url: str) -> str:
    name = f"leadsvc_test_{uuid.uuid4().hex[:12]}"
    with _postgres_admin_connection() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return base_url.rsplit("/", 1)[0] + "/" + name


def drop_postgres_database(url: str) -> None:
    db = make_database(url)
    if hasattr(db, "close_all"):
        db.close_all()
    name = url.rsplit("/", 1)[1]
    with _postgres_admin_connection() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session", params=["sqlite", "postgresql"])
def backend(request) -> str:
    return request.param


def pytest_configure(config):
    config.addinivalue_line("markers", "only_on(backend): a rule of one database only (not collected for the other)")


def pytest_collection_modifyitems(config, items):
    """Leave out, rather than skip, the runs of an only_on test on the other backend."""
    elsewhere = [item for item in items if (marker := item.get_closest_marker("only_on"))
                 and getattr(item, "callspec", None) and item.callspec.params.get("backend") not in (None, *marker.args)]
    if elsewhere:
        config.hook.pytest_deselected(items=elsewhere)
        items[:] = [item for item in items if item not in elsewhere]
    for item in items:
        if getattr(item, "callspec", None) and "backend" in item.callspec.params:
            backend_of[item.nodeid] = item.callspec.params["backend"]


REDIS_URL = os.environ.get("LEADSVC_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture(scope="session")
def redis_url() -> str:
    """A reachable Redis (skip, or fail on CI, when there is none), as for PostgreSQL."""
    import redis

    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3).ping()
    except redis.RedisError as exc:
        message = f"Redis at {REDIS_URL} is unreachable: {exc}"
        if ON_CI:
            pytest.fail(message + " (CI=true requires it)", pytrace=False)
        pytest.skip(message)
    return REDIS_URL


@pytest.fixture(scope="session")
def database_url(backend, tmp_path_factory, request) -> str:
    """A migrated, empty database of the backend, for the whole run."""
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('sqlite')}/leadsvc.sqlite3"
    else:
        url = create_postgres_database(request.getfixturevalue("postgres_server"))
        request.addfinalizer(lambda: drop_postgres_database(url))
    migrate(make_database(url))
    return url


def fresh_database(backend, tmp_path, request):
    """A new, empty (unmigrated) database of the backend, dropped after the test."""
    if backend == "sqlite":
        return make_database(f"sqlite:///{tmp_path}/{uuid.uuid4().hex[:8]}.sqlite3")
    url = create_postgres_database(request.getfixturevalue("postgres_server"))
    request.addfinalizer(lambda: drop_postgres_database(url))
    return make_database(url)


# The key every test webhook secret derives from; receivers run on 127.0.0.1 over plain HTTP.
WEBHOOK_SECRET_KEY = "test-webhook-secret-key-0123456789abcdef"
WEBHOOK_TEST_SETTINGS = {"secret_key": WEBHOOK_SECRET_KEY, "allow_http": True, "allow_private_networks": True}
# Outside services no test reaches unless it runs its fake (graph_api, indiamart_api): a closed
# port on loopback, so that a fetch or pull left over from another test fails at once.
NOBODY = "http://127.0.0.1:9"
TEST_CONFIG: dict[str, dict[str, Any]] = {
    "rate_limits": {"enabled": False},
    "forms": {"answer_floor_ms": 0},   # the floor has its own test (test_forms.py); others need not wait it
    "webhooks": WEBHOOK_TEST_SETTINGS,
    "connectors": {"meta_graph_url": f"{NOBODY}/v21.0", "indiamart_url": f"{NOBODY}/wservce/crm/crmListing/v2/"},
}
# The same, for processes configured by the environment.
WEBHOOK_TEST_ENV = {f"LEADSVC_WEBHOOKS_{key.upper()}": str(value).lower() if isinstance(value, bool) else value
                    for key, value in WEBHOOK_TEST_SETTINGS.items()}


def config_for(database_url: str, **sections: dict[str, Any]) -> dict[str, dict[str, Any]]:
    config = {section: dict(values) for section, values in TEST_CONFIG.items()}
    config["database"] = {"url": database_url}
    for section, values in sections.items():
        config.setdefault(section, {}).update(values)
    return config


@pytest.fixture(scope="session")
def _session_app(database_url):
    return create_app(config_for(database_url), config_file=os.devnull)


@pytest.fixture
def app(_session_app, database_url):
    """The app on this run's database of the backend (the models' proxy re-pointed at it)."""
    database.initialize(make_database(database_url))
    yield _session_app
    if not database.is_closed():
        database.close()


@pytest.fixture
def make_app(database_url):
    """Build an app with extra settings, e.g. make_app(rate_limits={"enabled": True})."""
    def build(**sections):
        return create_app(config_for(database_url, **sections), config_file=os.devnull)
    return build


@pytest.fixture
def client(app):
    return app.test_client()


# --- data ------------------------------------------------------------------------------------

def standard_setup(name: str) -> dict[str, Any]:
    """A small workspace: two teams, an admin, a manager per team, three agents."""
    return {
        "workspace": {"name": name},
        "teams": [{"name": "North"}, {"name": "South"}],
        "members": [
            {"name": "Ada Admin", "email": "admin@t.test", "role": "admin"},
            {"name": "Nina North", "email": "nmgr@t.test", "role": "manager", "team": "North"},
            {"name": "Sam South", "email": "smgr@t.test", "role": "manager", "team": "South"},
            {"name": "Neel Agent", "email": "n1@t.test", "role": "agent", "team": "North"},
            {"name": "Nora Agent", "email": "n2@t.test", "role": "agent", "team": "North"},
            {"name": "Sid Agent", "email": "s1@t.test", "role": "agent", "team": "South"},
        ],
        "statuses": [
            {"name": "New", "kind": "open", "next": ["Contacted", "Lost"]},
            {"name": "Contacted", "kind": "open", "next": ["Qualified", "Lost"]},
            {"name": "Qualified", "kind": "open", "next": ["Proposal", "Lost"]},
            {"name": "Proposal", "kind": "open", "next": ["Won", "Lost"]},
            {"name": "Won", "kind": "won", "next": []},
            {"name": "Lost", "kind": "lost", "next": ["New"]},
        ],
        "sources": [{"name": "Website", "score": 10}, {"name": "Referral", "score": 20}],
        "custom_fields": [
            {"name": "product_interest", "type": "choice", "options": ["2bhk", "3bhk", "villa"],
             "score": {"villa": 15}},
            {"name": "budget_confirmed", "type": "boolean", "score": {"true": 10}},
            {"name": "family_size", "type": "number"},
            {"name": "site_visit_on", "type": "date"},
            {"name": "notes_from_call", "type": "text"},
        ],
    }


# A small workspace for processes started from a setup file: three agents on two teams.
PROCESS_SETUP_TOML = """\
[workspace]
name = "Process Test"

[[teams]]
name = "North"
[[teams]]
name = "South"

[[members]]
name = "Ada Admin"
email = "admin@t.test"
role = "admin"
[[members]]
name = "Neel Agent"
email = "n1@t.test"
role = "agent"
team = "North"
[[members]]
name = "Nora Agent"
email = "n2@t.test"
role = "agent"
team = "North"
[[members]]
name = "Sid Agent"
email = "s1@t.test"
role = "agent"
team = "South"

[[statuses]]
name = "New"
kind = "open"
[[statuses]]
name = "Won"
kind = "won"

[[sources]]
name = "Website"
score = 10
"""


FORM_ORIGIN = "https://acme.test"   # the site the test forms allow


def with_form(data):
    """A change for make_workspace: a web form on FORM_ORIGIN, and villas routed to the South team."""
    data["forms"] = [{"name": "Website enquiry", "source": "Website", "allowed_origins": [FORM_ORIGIN + "/"]}]
    data["rules"] = [{"name": "Villas go South", "when": {"custom_fields": {"product_interest": ["villa"]}},
                      "assign": {"team": "South", "strategy": "round_robin"}}]


def with_rules(*rules, **changes):
    """A change for make_workspace: these distribution rules, and other sections set or changed."""
    def change(data):
        data["rules"] = list(rules)
        for key, value in changes.items():
            data[key] = value(data[key]) if callable(value) else value
    return change


# --- connectors (DESIGN section 19) --------------------------------------------------------------

META_APP_SECRET_ENV = "ACME_META_APP_SECRET"   # named in the setup; the meta tests set it
INTAKE_FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "intake")


def with_connectors(data):
    """A change for make_workspace: one connector of each kind, as DESIGN section 19 shows them."""
    data["connectors"] = [
        {"name": "Google Ads - Villas", "kind": "google_ads", "source": "Website",
         "custom_fields": {"VILLA_TYPE": "product_interest"}},
        {"name": "Meta lead ads", "kind": "meta", "source": "Website", "app_secret_env": META_APP_SECRET_ENV,
         "page_token_env": "ACME_META_PAGE_TOKEN", "custom_fields": {"product_interest": "product_interest"}},
        {"name": "IndiaMART", "kind": "indiamart", "source": "Referral", "custom_fields": {"SENDER_CITY": "notes_from_call"}},
        {"name": "JustDial", "kind": "justdial", "source": "Referral", "notice_version": "jd-2026-01"},
        {"name": "Website hook", "kind": "generic", "source": "Website", "external_id": "/ref",
         "map": {"full_name": "/contact/name", "phone": "/contact/phone", "email": "/contact/email",
                 "estimated_value": "/deal/value", "custom_fields.family_size": "/extra/size",
                 "attribution.utm_campaign": "/utm/campaign", "attribution.utm_source": "/utm/source"}},
    ]


def intake_fixture(name: str) -> Any:
    """A sender's payload as its documentation shows it (tests/fixtures/intake/<name>.json)."""
    with open(os.path.join(INTAKE_FIXTURES, f"{name}.json"), encoding="utf-8") as fh:
        return json.load(fh)


# The secrets the senders give, in the environment variables setup names (the tests set them).
META_PAGE_TOKEN_ENV, META_PAGE_TOKEN = "ACME_META_PAGE_TOKEN", "EAAGm0PX4ZCpsBAtestpagetoken"
INDIAMART_CRM_KEY_ENV, INDIAMART_CRM_KEY = "ACME_INDIAMART_CRM_KEY", "mRyxEbBs4HfGTfeq4XaN7lmGp1XNnzI="


def json_answer(status: int, document: Any) -> tuple[int, dict[str, str], bytes]:
    return status, {"Content-Type": "application/json"}, json.dumps(document).encode()


class FakeGraphApi:
    """Meta's Graph API as its lead retrieval documentation shows it: GET /v21.0/{leadgen_id}
    ?fields=...&access_token=... answers the lead it holds (`leads`), with the fields asked for
    and its id; 400 OAuthException for another token, 400 GraphMethodException for an id it does
    not hold. What a test puts in `answers` is answered first, in turn (a 500, a body that is
    not JSON, a huge one)."""

    def __init__(self):
        self.leads: dict[str, dict[str, Any]] = {}
        self.answers: list[tuple[int, dict[str, str], bytes]] = []
        self.receiver = Receiver(self.respond)
        self.url = f"{self.receiver.base}/v21.0"

    def respond(self, request):
        if self.answers:
            return self.answers.pop(0)
        from urllib.parse import parse_qs, urlsplit

        parts = urlsplit(request.path)
        query = parse_qs(parts.query)
        if query.get("access_token") != [META_PAGE_TOKEN]:
            return json_answer(400, intake_fixture("graph_bad_token"))
        lead = self.leads.get(parts.path.rsplit("/", 1)[-1])
        if lead is None:
            return json_answer(400, intake_fixture("graph_unknown_id"))
        asked = {"id", *",".join(query.get("fields", [])).split(",")}
        return json_answer(200, {key: value for key, value in lead.items() if key in asked})

    def requests(self) -> list[Received]:
        with self.receiver.lock:
            return list(self.receiver.received)


class FakeIndiaMart:
    """IndiaMART's CRM listing API (v2) as its documentation shows it: every answer is HTTP 200
    with the outcome in CODE; a key it does not know is CODE 401, else it answers what a test put
    in `answers` in turn (a listing, 429), else CODE 204 (no leads in the window)."""

    def __init__(self):
        self.answers: list[tuple[int, dict[str, str], bytes]] = []
        self.receiver = Receiver(self.respond)
        self.url = f"{self.receiver.base}/wservce/crm/crmListing/v2/"

    def respond(self, request):
        from urllib.parse import parse_qs, urlsplit

        if parse_qs(urlsplit(request.path).query).get("glusr_crm_key") != [INDIAMART_CRM_KEY]:
            return json_answer(200, intake_fixture("indiamart_bad_key"))
        if self.answers:
            return self.answers.pop(0)
        return json_answer(200, intake_fixture("indiamart_no_leads"))

    def queries(self) -> list[dict[str, list[str]]]:
        """The query of each call, as parsed."""
        from urllib.parse import parse_qs, urlsplit

        with self.receiver.lock:
            return [parse_qs(urlsplit(request.path).query) for request in self.receiver.received]


@pytest.fixture
def graph_api():
    fake = FakeGraphApi()
    with fake.receiver:
        yield fake


@pytest.fixture
def indiamart_api():
    fake = FakeIndiaMart()
    with fake.receiver:
        yield fake


def bearer(token: str) -> dict[str, str]:
    """The Authorization header that carries this token."""
    return {"Authorization": f"Bearer {token}"}


@dataclass
class Tenant:
    """A workspace made for one test, with its ids and a way to get tokens."""

    ids: Any
    secrets: dict[str, str] = field(default_factory=dict)

    @property
    def public_id(self) -> str:
        return self.ids.workspace

    def member(self, email: str) -> Member:
        return Member.get(Member.public_id == self.ids.members[email])

    def token(self, email: str = "admin@t.test", abilities: tuple[str, ...] = ("*",)) -> str:
        key = f"{email}|{','.join(abilities)}"
        if key not in self.secrets:
            self.secrets[key] = issue_token(self.member(email), abilities, name="test")[1]
        return self.secrets[key]

    def headers(self, email: str = "admin@t.test", abilities: tuple[str, ...] = ("*",)) -> dict[str, str]:
        return bearer(self.token(email, abilities))


ROLE_EMAILS = {"admin": "admin@t.test", "manager": "nmgr@t.test", "agent": "n1@t.test"}


@pytest.fixture
def make_workspace(app):
    """Create a workspace from the standard setup, changed by `change(data)` if given."""
    def build(change=None) -> Tenant:
        data = standard_setup(f"Test {uuid.uuid4().hex[:10]}")
        if change:
            change(data)
        return Tenant(apply_setup(parse_setup(data), WEBHOOK_SECRET_KEY))
    return build


@pytest.fixture
def ws(make_workspace) -> Tenant:
    return make_workspace()


@pytest.fixture
def other_ws(make_workspace) -> Tenant:
    """Another tenant: nothing of it may ever show in `ws`."""
    return make_workspace()


# --- leads -----------------------------------------------------------------------------------

def new_phone() -> str:
    """A fresh valid Indian mobile (the 98 series is all mobile)."""
    return f"+9198{uuid.uuid4().int % 10**8:08d}"


def lead_body(ws: Tenant, **fields: Any) -> dict[str, Any]:
    body = {"first_name": "Asha", "last_name": "Rao", "phone": new_phone(), "source": ws.ids.sources["Website"]}
    body.update(fields)
    return {key: value for key, value in body.items() if value is not None}


def email_lead_body(**fields: Any) -> dict[str, Any]:
    """A lead's body with a first name and a fresh e-mail only: no phone, no source."""
    return {"first_name": "Asha", "email": f"asha.{uuid.uuid4().hex[:12]}@example.com", **fields}


def bulk_leads(ws, count: int, rng: random.Random, responses: bool = False) -> None:
    """Rows inserted directly (listing needs only the lead rows), with many ties on purpose.
    With `responses`, a tenth have no owner, a third no source, and most have a response
    due an hour after creation, most of those a first response within two hours.

    executemany on the driver: peewee builds SQL for each row of insert_many, which costs more
    than the database's own work here."""
    workspace = Workspace.get(Workspace.public_id == ws.public_id)
    status = Status.get(Status.public_id == ws.ids.statuses["New"])
    agents = [ws.member(e) for e in ("n1@t.test", "n2@t.test", "s1@t.test")]
    sources = [Source.get(Source.public_id == ws.ids.sources[name]).id for name in ("Website", "Referral")]
    base = datetime(2026, 1, 1)
    columns = ["workspace_id", "public_id", "first_name", "last_name", "phone", "status_id", "owner_id", "team_id",
               "score", "engagement", "version", "created_at", "updated_at", "status_changed_at",
               "last_activity_at", "activity_sort_at", "custom_fields", "score_reasons"]
    if responses:
        columns += ["source_id", "response_due_at", "first_response_at", "first_response_seconds", "response_sort_at"]
    rows = []
    for i in range(count):
        owner = agents[i % 3]
        owner_id, team_id = (None, None) if responses and i % 10 == 9 else (owner.id, owner.team_id)
        created = base + timedelta(minutes=rng.randrange(300))
        active = created + timedelta(hours=1) if rng.random() < 0.5 else None
        row = (workspace.id, new_public_id("ld_"), "", "", f"+9198{i:08d}", status.id, owner_id, team_id,
               rng.randrange(10), 0, 1, created, created, created, active, active or NEVER, "{}", "[]")
        if responses:
            due = created + timedelta(hours=1) if i % 20 else None
            seconds = rng.randrange(7200) if rng.random() < 0.9 else None
            responded = created + timedelta(seconds=seconds) if seconds is not None else None
            row += ((*sources, None)[i % 3], due, responded, seconds, due or NO_TASK)
        rows.append(row)
    db = Lead._meta.database
    marks = ", ".join([db.param] * len(columns))
    sql = f'INSERT INTO "lead" ({", ".join(columns)}) VALUES ({marks})'
    with db.atomic():
        db.cursor().executemany(sql, rows)


def plan(sql: str, params) -> str:
    """The database's plan for a statement: PostgreSQL's as JSON text, SQLite's steps joined by ` | `."""
    if is_postgres():
        rows = database.execute_sql("EXPLAIN (FORMAT JSON) " + sql, params).fetchone()[0]
        return json.dumps(rows if not isinstance(rows, str) else json.loads(rows))
    return " | ".join(row[3] for row in database.execute_sql("EXPLAIN QUERY PLAN " + sql, params).fetchall())


@pytest.fixture
def make_lead(client):
    """Create a lead through the API, optionally handed to an owner (by the admin); returns the lead
    document. The body is lead_body's with these fields (None leaves a field out); `as_member`
    sends it, `via` is another test client to send it through, and `expect` the status it gets."""
    def build(tenant: Tenant, owner: str | None = None, *, as_member: str = "admin@t.test", expect: int = 201,
              via=None, **fields: Any) -> dict[str, Any]:
        response = (via or client).post("/api/v1/leads", json=lead_body(tenant, **fields),
                                        headers=tenant.headers(as_member))
        assert response.status_code == expect, response.get_json()
        lead = response.json["data"]
        if owner is not None:
            moved = client.patch(f"/api/v1/leads/{lead['id']}", json={"owner": tenant.ids.members[owner]},
                                 headers=tenant.headers())
            assert moved.status_code == 200, moved.json
            lead = moved.json["data"]
        return lead
    return build


def owner_email(ws, lead) -> str:
    """The e-mail of the member who owns `lead` (a lead document)."""
    return next(email for email, mid in ws.ids.members.items() if mid == lead["owner"]["id"])


# --- a pipeline with a known history --------------------------------------------------------

PIPELINE_START = datetime(2026, 3, 1)
PIPELINE_PATHS = {
    "L1": ("n1@t.test", "Website", [(2, "Contacted"), (4, "Qualified"), (6, "Proposal"), (8, "Won")]),
    "L2": ("n1@t.test", "Website", [(4, "Contacted"), (8, "Lost")]),
    "L3": ("n2@t.test", "Referral", [(6, "Contacted"), (2, "Qualified"), (10, "Proposal"), (12, "Won")]),
    "L4": ("n2@t.test", "Referral", [(8, "Lost"), (3, "New"), (2, "Contacted")]),
    "L5": ("s1@t.test", "Website", [(10, "Contacted"), (6, "Qualified"), (4, "Lost")]),
    "L6": ("s1@t.test", "Referral", []),
    "L7": ("n1@t.test", "Referral", [(1, "Contacted")]),
}


@pytest.fixture
def pipeline_data(client, ws, make_lead, monkeypatch):
    """Seven leads moved through known stages at known times, in `ws`; returns their public ids by name.

    Times are frozen through pipeline.utcnow, so every created_at, transition time and time in stage
    is exact. Lead Ln starts on 2026-03-(2n-1) at 00:00 UTC and moves after the hours given:

        lead  owner  source    path (hours in the previous status)                     now
        L1    n1     Website   New -2- Contacted -4- Qualified -6- Proposal -8- Won     won
        L2    n1     Website   New -4- Contacted -8- Lost                               lost
        L3    n2     Referral  New -6- Contacted -2- Qualified -10- Proposal -12- Won   won
        L4    n2     Referral  New -8- Lost -3- New -2- Contacted                       open
        L5    s1     Website   New -10- Contacted -6- Qualified -4- Lost                lost
        L6    s1     Referral  New                                                      open
        L7    n1     Referral  New -1- Contacted                                        open

    n1 and n2 are in team North, s1 in South.
    """
    clock = {"now": PIPELINE_START}
    monkeypatch.setattr(pipeline, "utcnow", lambda: clock["now"])
    ids = {}
    for n, (name, (owner, source, path)) in enumerate(PIPELINE_PATHS.items()):
        clock["now"] = PIPELINE_START + timedelta(days=2 * n)
        ids[name] = make_lead(ws, owner=owner, source=ws.ids.sources[source])["id"]
        for hours, status in path:
            clock["now"] += timedelta(hours=hours)
            response = client.post(f"/api/v1/leads/{ids[name]}/status", json={"status": ws.ids.statuses[status]},
                                   headers=ws.headers())
            assert response.status_code == 200, response.json
    monkeypatch.undo()
    return ids


# --- webhooks --------------------------------------------------------------------------------

# An IPv4 address, or an IPv6 one (two groups and more), anywhere in a text.
ADDRESS = re.compile(r"\b\d{1,3}(\.\d{1,3}){3}\b|\b[0-9a-f]{0,4}(:[0-9a-f]{0,4}){2,}\b", re.IGNORECASE)


class Clock:
    """The deliverer's clock, moved by the test instead of waiting for minutes and days."""

    def __init__(self):
        # A minute ahead: what the requests of the test just wrote is due (and the signatures'
        # timestamps stay within a receiver's tolerance).
        self.now = utcnow() + timedelta(minutes=1)

    def __call__(self):
        return self.now

    def advance(self, **delta):
        self.now += timedelta(**delta)


@pytest.fixture
def receiver():
    with Receiver() as running:
        yield running


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def deliverer(app, clock):
    """A deliverer on the test's clock, without jitter (rng 0.5 is the middle of the +-20%)."""
    # The run's tests share a database: what earlier tests left scheduled is not this test's.
    Delivery.update(next_attempt_at=None).execute()
    Intake.update(next_attempt_at=None).where(Intake.next_attempt_at.is_null(False)).execute()
    return Deliverer(app.config["LEADSVC"], version="test", metrics=app.extensions["leadsvc.metrics"],
                     clock=clock, rng=lambda: 0.5)


def register_webhook(client, ws, url, events=("*",), expect=201, **fields):
    response = client.post("/api/v1/webhooks", json={"url": url, "events": list(events), **fields},
                           headers=ws.headers())
    assert response.status_code == expect, response.get_json()
    return response.json["data"] if expect == 201 else response.json


def deliveries_of(hook_id: str) -> list[Delivery]:
    return list(Delivery.select().join(Webhook).where(Webhook.public_id == hook_id).order_by(Delivery.id))


# --- a real server -----------------------------------------------------------------------------

@pytest.fixture
def live_server(app):
    """The app under waitress on a free port, in a thread; yields its base URL."""
    with InProcessServer(app, threads=16) as server:
        yield server.url


# --- the command line ------------------------------------------------------------------------

@pytest.fixture
def run_cli(app, database_url):
    """Run `leadsvc ARGS...` on this run's database, as a shell would; returns click's Result.

    An exception that escapes the command (a traceback instead of a message) fails the test.
    """
    from click.testing import CliRunner

    from leadsvc.cli import cli

    def run(*args: str, env: dict[str, str | None] | None = None):
        environment = {"LEADSVC_CONFIG": os.devnull, "LEADSVC_DATABASE_URL": database_url,
                       "LEADSVC_RATE_LIMITS_ENABLED": "false", **WEBHOOK_TEST_ENV, **(env or {})}
        try:
            return CliRunner().invoke(cli, list(args), obj={}, env=environment, catch_exceptions=False)
        finally:
            database.initialize(make_database(database_url))   # a command may point the models elsewhere
    return run


def run_import(database_url, path, workspace, *extra):
    """`leadsvc import` as a user runs it, on this run's database."""
    from click.testing import CliRunner

    from leadsvc.cli import cli

    result = CliRunner().invoke(cli, ["--config", os.devnull, "import", str(path), "--workspace", workspace, *extra],
                                env={"LEADSVC_DATABASE_URL": database_url}, catch_exceptions=False)
    return result
