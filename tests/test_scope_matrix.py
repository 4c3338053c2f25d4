"""Acceptance 1: every endpoint x every kind of caller gives the documented status and never shows
data outside the caller's scope (OWASP API1, object-level authorization).

One row per endpoint in ENDPOINTS; a new endpoint is one more line. Callers: the workspace's
admin, the North manager and the North agent n1 (all with every ability), a token of the admin
that lacks the row's ability, a revoked token, and another workspace's admin. Lead-addressed rows
run against a lead of n1 (North: visible to all three roles) and a lead of s1 (South: the admin
only; for the North manager and agent it does not exist).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Callable

import pytest

from conftest import WEBHOOK_SECRET_KEY, ROLE_EMAILS, Tenant, intake_fixture, standard_setup, with_connectors
from leadsvc.auth import ABILITIES, excluded_for, issue_token, revoke_tokens
from leadsvc.connectors import key_of, rotate_key
from leadsvc.db import database, make_database
from leadsvc.models import Connector, Intake, Lead, Member, Token, Workspace
from leadsvc.provision import apply_setup, parse_setup


def new_lead(tenant: Tenant) -> dict:
    return {"first_name": "Matrix", "email": f"matrix.{uuid.uuid4().hex}@example.com"}


@dataclass(frozen=True)
class Endpoint:
    method: str
    path: str                                   # "{lead}": the target lead's id; "{note}": a note of it by its
                                                # owner; "{task}": an open task on it, assigned to its owner;
                                                # "{merge}": a merge of another lead of its owner into it
                                                # ("{duplicate}" in a body: such a lead, not merged yet)
    ability: str | None                         # None: any valid token will do
    body: Callable[[Tenant], dict] | None = None
    success: int = 200
    # What a success shows, and so what is checked: "lead" (data is the addressed lead), "leads" (a
    # page of leads: exactly the caller's scope), "created" (a new lead, in the caller's workspace),
    # "reference" (one workspace's reference data), "other" (the status and that no lead outside
    # the scope leaks into the body: notes, history, reports, CSV), "batch" (each item's new lead, in the
    # caller's workspace).
    shows: str = "lead"
    # Statuses by caller where the rule is not the table's own (who may change a member, revoke a token).
    answers: tuple[tuple[str, int], ...] = ()
    # The answer to another workspace's admin, when the body names this workspace's records (its
    # ids are unknown there); None: as for the workspace's own admin.
    foreign: int | None = None

    def __str__(self) -> str:
        return f"{self.method} {self.path}"

    @property
    def addresses_a_lead(self) -> bool:
        return "{lead}" in self.path or self.addresses_a_note or self.addresses_a_task or self.addresses_a_merge

    @property
    def addresses_a_merge(self) -> bool:
        return "{merge}" in self.path

    @property
    def addresses_a_task(self) -> bool:
        return "{task}" in self.path

    @property
    def addresses_a_note(self) -> bool:
        return "{note}" in self.path

    @property
    def addresses_a_webhook(self) -> bool:
        return "{webhook}" in self.path

    @property
    def addresses_a_connector(self) -> bool:
        return "{connector}" in self.path

    @property
    def addresses_a_job(self) -> bool:
        return "{job}" in self.path

    @property
    def addresses_a_member(self) -> bool:
        return "{member}" in self.path


# Members and tokens (DESIGN section 20): "{member}" is a fresh North agent (the North manager's
# team); "{token}" a fresh token of n1, the agent caller's own member.
FOREIGN_404 = (("foreign", 404),)
ENDPOINTS = [
    Endpoint("GET", "/api/v1/leads", "leads:read", shows="leads"),
    Endpoint("POST", "/api/v1/leads", "leads:create", new_lead, success=201, shows="created"),
    Endpoint("POST", "/api/v1/leads/batch", "leads:create", lambda t: {"leads": [new_lead(t), new_lead(t)]},
             shows="batch"),
    Endpoint("GET", "/api/v1/leads/{lead}", "leads:read"),
    Endpoint("GET", "/api/v1/leads/{lead}?include=activities,notes", "leads:read"),
    Endpoint("PATCH", "/api/v1/leads/{lead}", "leads:update", lambda t: {"first_name": "Renamed"}),
    Endpoint("POST", "/api/v1/leads/{lead}/status", "leads:status", lambda t: {"status": t.ids.statuses["Contacted"]}),
    Endpoint("POST", "/api/v1/leads/{lead}/notes", "notes:write", lambda t: {"body": "Matrix note"},
             success=201, shows="other"),
    Endpoint("POST", "/api/v1/leads/{lead}/activities", "activities:write",
             lambda t: {"kind": "call", "summary": "Matrix call"}, success=201, shows="other"),
    Endpoint("GET", "/api/v1/leads/{lead}/notes", "leads:read", shows="other"),
    Endpoint("PATCH", "/api/v1/notes/{note}", "notes:write", lambda t: {"body": "Matrix edit"}, shows="other"),
    Endpoint("DELETE", "/api/v1/notes/{note}", "notes:write", success=204, shows="other"),
    Endpoint("GET", "/api/v1/leads/{lead}/transitions", "leads:read", shows="other"),
    Endpoint("GET", "/api/v1/leads/{lead}/audit", "audit:read", shows="other"),
    Endpoint("GET", "/api/v1/leads/export.csv", "leads:read", shows="other"),
    Endpoint("POST", "/api/v1/leads/{lead}/erase", "privacy:manage", lambda t: {"reason": "Matrix erasure"}),
    Endpoint("POST", "/api/v1/leads/{lead}/consent/withdraw", "leads:update"),
    Endpoint("POST", "/api/v1/privacy/erasures", "privacy:manage",
             lambda t: {"email": "nobody.matrix@example.com", "reason": "Matrix erasure"}, shows="other"),
    Endpoint("GET", "/api/v1/privacy/subject?email=nobody.matrix@example.com", "privacy:manage", shows="other"),
    Endpoint("GET", "/api/v1/reports/funnel", "reports:read", shows="other"),
    Endpoint("GET", "/api/v1/reports/velocity", "reports:read", shows="other"),
    Endpoint("GET", "/api/v1/reports/conversion", "reports:read", shows="other"),
    Endpoint("GET", "/api/v1/reports/response", "reports:read", shows="other"),
    Endpoint("GET", "/api/v1/statuses", None, shows="reference"),
    Endpoint("GET", "/api/v1/sources", None, shows="reference"),
    Endpoint("GET", "/api/v1/members", None, shows="reference"),
    Endpoint("GET", "/api/v1/teams", None, shows="reference"),
    Endpoint("GET", "/api/v1/custom-fields", None, shows="reference"),
    Endpoint("GET", "/api/v1/forms", None, shows="other"),   # the matrix world has no forms
    Endpoint("GET", "/api/v1/webhooks", "webhooks:manage", shows="other"),
    Endpoint("POST", "/api/v1/webhooks", "webhooks:manage", lambda t: {"url": MATRIX_HOOK, "events": ["*"]},
             success=201, shows="other"),
    Endpoint("GET", "/api/v1/webhooks/{webhook}", "webhooks:manage", shows="other"),
    Endpoint("PATCH", "/api/v1/webhooks/{webhook}", "webhooks:manage", lambda t: {"description": "Matrix"},
             shows="other"),
    Endpoint("DELETE", "/api/v1/webhooks/{webhook}", "webhooks:manage", success=204, shows="other"),
    Endpoint("POST", "/api/v1/webhooks/{webhook}/rotate-secret", "webhooks:manage", shows="other"),
    Endpoint("POST", "/api/v1/webhooks/{webhook}/test", "webhooks:manage", success=202, shows="other"),
    Endpoint("GET", "/api/v1/webhooks/{webhook}/deliveries", "webhooks:manage", shows="other"),
    Endpoint("POST", "/api/v1/webhooks/{webhook}/deliveries/{delivery}/replay", "webhooks:manage", success=202,
             shows="other"),
    Endpoint("GET", "/api/v1/lost-reasons", None, shows="reference"),
    Endpoint("GET", "/api/v1/leads/{lead}?include=tasks", "leads:read"),
    Endpoint("POST", "/api/v1/leads/{lead}/tasks", "tasks:write", lambda t: MATRIX_TASK, success=201, shows="other"),
    Endpoint("GET", "/api/v1/leads/{lead}/tasks", "leads:read", shows="other"),
    Endpoint("GET", "/api/v1/tasks", "leads:read", shows="other"),
    Endpoint("GET", "/api/v1/tasks?filter[assignee]=me&filter[due]=today", "leads:read", shows="other"),
    Endpoint("GET", "/api/v1/tasks/{task}", "leads:read", shows="other"),
    Endpoint("PATCH", "/api/v1/tasks/{task}", "tasks:write", lambda t: {"title": "Matrix follow-up"}, shows="other"),
    Endpoint("POST", "/api/v1/tasks/{task}/complete", "tasks:write", lambda t: {"outcome": "Matrix outcome"},
             shows="other"),
    Endpoint("POST", "/api/v1/tasks/{task}/cancel", "tasks:write", shows="other"),
    Endpoint("GET", "/api/v1/leads?filter[next_task]=overdue", "leads:read", shows="leads"),
    Endpoint("GET", "/api/v1/leads?filter[channel]=api", "leads:read", shows="leads"),
    Endpoint("GET", "/api/v1/connectors", "connectors:manage", shows="other"),
    Endpoint("GET", "/api/v1/connectors/{connector}", "connectors:manage", shows="other"),
    Endpoint("GET", "/api/v1/connectors/{connector}/intakes", "connectors:manage", shows="other"),
    Endpoint("POST", "/api/v1/connectors/{connector}/intakes/{intake}/retry", "connectors:manage", shows="other"),
    Endpoint("POST", "/api/v1/connectors/{connector}/rotate-key", "connectors:manage", shows="other"),
    Endpoint("POST", "/api/v1/members", "members:manage",
             lambda t: {"name": "Matrix Admin", "email": f"matrix.{uuid.uuid4().hex}@t.test", "role": "admin"},
             success=201, shows="other"),
    Endpoint("PATCH", "/api/v1/members/me", None, lambda t: {"availability": "available"}, shows="other"),
    Endpoint("PATCH", "/api/v1/members/{member}", "members:manage", lambda t: {"name": "Nora Agent"}, shows="other",
             answers=FOREIGN_404),
    Endpoint("PATCH", "/api/v1/members/{member}", None, lambda t: {"availability": "available"}, shows="other",
             answers=(("agent", 403), *FOREIGN_404)),
    Endpoint("POST", "/api/v1/members/{member}/tokens", "members:manage",
             lambda t: {"name": "matrix", "abilities": ["leads:read"]}, success=201, shows="other",
             answers=FOREIGN_404),
    Endpoint("GET", "/api/v1/tokens", None, shows="other"),
    Endpoint("DELETE", "/api/v1/tokens/{token}", None, success=204, shows="other",
             answers=(("manager", 404), ("lacking", 404), *FOREIGN_404)),
    Endpoint("POST", "/api/v1/leads/{lead}/merge", "leads:update", lambda t: {"duplicates": ["{duplicate}"]}),
    Endpoint("POST", "/api/v1/merges/{merge}/undo", "leads:update"),
    Endpoint("GET", "/api/v1/jobs/{job}", None, shows="other"),
    Endpoint("POST", "/api/v1/members/{member}/deactivate", "members:manage", lambda t: {"reassign_to": "routing"},
             success=202, shows="other"),
    Endpoint("POST", "/api/v1/leads/bulk", "leads:status", lambda t: {
        "action": "move", "filter": {}, "params": {"status": t.ids.statuses["Contacted"]}, "dry_run": True},
             shows="other", foreign=422),
    Endpoint("POST", "/api/v1/leads/bulk", "leads:status", lambda t: {
        "action": "move", "filter": {}, "params": {"status": t.ids.statuses["Contacted"]}}, success=202, shows="other",
             foreign=422),
    Endpoint("POST", "/api/v1/imports", "leads:create", lambda t: MATRIX_CSV, success=202, shows="other"),
]
MATRIX_CSV = "first_name,email\n"   # a header alone: a job of no rows
JOB_CREATOR = "agent"   # the matrix's job is the agent's: its manager does not see it, its admin does
MATRIX_TASK = {"kind": "call", "title": "Matrix follow-up", "due_at": "2020-01-01T10:00:00Z"}   # overdue
MATRIX_HOOK = "http://127.0.0.1:9/matrix"   # never called: nothing delivers in this module

CALLERS = ["admin", "manager", "agent", "lacking", "revoked", "foreign"]
TARGETS = {"team": "n1@t.test", "other_team": "s1@t.test"}   # who owns the lead a row addresses


def cases():
    for endpoint in ENDPOINTS:
        for caller in CALLERS:
            for target in (TARGETS if endpoint.addresses_a_lead else [None]):
                yield pytest.param(endpoint, caller, target, id=f"{endpoint}-{caller}" + (f"-{target}" if target else ""))


def expected_status(endpoint: Endpoint, caller: str, target: str | None) -> int:
    """The documented answer: 401, then 403, then 404 outside the scope."""
    if caller == "revoked":
        return 401
    if caller in dict(endpoint.answers):
        return dict(endpoint.answers)[caller]
    role = caller if caller in ROLE_EMAILS else "admin"   # lacking, revoked and foreign are admins' tokens
    if endpoint.ability and (caller == "lacking" or endpoint.ability in excluded_for(role)):
        return 403
    if endpoint.addresses_a_lead and (caller == "foreign" or (target == "other_team" and caller != "admin")):
        return 404
    if (endpoint.addresses_a_webhook or endpoint.addresses_a_connector or endpoint.addresses_a_member
            or endpoint.addresses_a_job) and caller == "foreign":
        return 404
    if caller == "foreign" and endpoint.foreign is not None:
        return endpoint.foreign
    if endpoint.addresses_a_job and caller in ROLE_EMAILS and caller not in ("admin", JOB_CREATOR):
        return 404
    if endpoint.addresses_a_note and caller == "manager":
        return 403   # the note is its lead's owner's (the agent's): only the author or an admin changes it
    return endpoint.success


@dataclass
class World:
    ws: Tenant
    other_ws: Tenant
    leads: dict[str, dict]           # target -> the lead document as its owner's admin sees it
    webhook: dict | None = None      # the webhook a row addresses, with a delivery of it
    connector: dict | None = None    # the connector a row addresses, with a rejected intake of it
    job: str | None = None           # the job a row addresses (the agent's)
    member: str | None = None        # the member a row addresses (a fresh agent of North)

    def headers(self, caller: str, endpoint: Endpoint) -> dict[str, str]:
        if caller in ROLE_EMAILS:
            return self.ws.headers(ROLE_EMAILS[caller])
        if caller == "foreign":
            return self.other_ws.headers()
        if caller == "lacking":
            others = tuple(a for a in ABILITIES if a != endpoint.ability) if endpoint.ability else ("leads:create",)
            return self.ws.headers("admin@t.test", others)
        token, secret = issue_token(self.ws.member("admin@t.test"), ["*"], name="revoked")
        revoke_tokens(Token.public_id == token.public_id)
        return {"Authorization": f"Bearer {secret}"}


@pytest.fixture(scope="module")
def tenants(database_url) -> tuple[Tenant, Tenant]:
    """Two workspaces for the whole module (their tokens are cached): the matrix has many rows."""
    database.initialize(make_database(database_url))
    return tuple(Tenant(apply_setup(parse_setup(with_lost_reasons(standard_setup(f"Matrix {uuid.uuid4().hex[:10]}"))),
                                    WEBHOOK_SECRET_KEY))
                 for _ in range(2))


def with_lost_reasons(data: dict) -> dict:
    """Reference data of every kind, lost reasons and connectors too (moves in the matrix never go to Lost)."""
    with_connectors(data)
    return {**data, "lost_reasons": [{"name": "Budget"}, {"name": "Timing"}]}


@pytest.fixture
def world(request, client, tenants) -> World:
    """Fresh target leads for each case (rows change them: a stage move succeeds only once), made
    only where the row looks at them: its one target lead, or both for lists and other reads."""
    ws, other_ws = tenants
    admin = ws.headers()
    endpoint, target = request.node.callspec.params.get("endpoint"), request.node.callspec.params.get("target")
    looks_at_all = endpoint is None or endpoint.shows in ("leads", "other")
    wanted = [target] if target else list(TARGETS) if looks_at_all else []
    leads = {}
    for target, owner in ((t, TARGETS[t]) for t in wanted):
        lead = client.post("/api/v1/leads", json=new_lead(ws), headers=admin).json["data"]
        moved = client.patch(f"/api/v1/leads/{lead['id']}", json={"owner": ws.ids.members[owner]}, headers=admin)
        assert moved.status_code == 200
        leads[target] = moved.json["data"]
        if endpoint is not None and (endpoint.addresses_a_task or endpoint.path.startswith("/api/v1/tasks")
                                     or "next_task" in endpoint.path):
            task = client.post(f"/api/v1/leads/{lead['id']}/tasks", json=MATRIX_TASK, headers=admin)
            assert task.status_code == 201, task.json
            leads[target]["task"] = task.json["data"]["id"]
        if endpoint is not None and endpoint.addresses_a_note:
            note = client.post(f"/api/v1/leads/{lead['id']}/notes", json={"body": "Matrix note"},
                               headers=ws.headers(owner))
            assert note.status_code == 201, note.json
            leads[target]["note"] = note.json["data"]["id"]
        if endpoint is not None and ("/merge" in endpoint.path):
            duplicate = client.post("/api/v1/leads", json=new_lead(ws), headers=admin).json["data"]
            assert client.patch(f"/api/v1/leads/{duplicate['id']}", json={"owner": ws.ids.members[owner]},
                                headers=admin).status_code == 200
            leads[target]["duplicate"] = duplicate["id"]
            if endpoint.addresses_a_merge:
                merged = client.post(f"/api/v1/leads/{lead['id']}/merge", json={"duplicates": [duplicate["id"]]},
                                     headers=admin)
                assert merged.status_code == 200, merged.json
                leads[target]["merge"] = merged.json["merge"]["id"]
    webhook = None
    if endpoint is not None and endpoint.addresses_a_webhook:
        webhook = client.post("/api/v1/webhooks", json={"url": MATRIX_HOOK, "events": ["webhook.test"]},
                              headers=admin).json["data"]
        webhook["delivery"] = client.post(f"/api/v1/webhooks/{webhook['id']}/test", headers=admin).json["data"]["id"]
    connector = None
    if endpoint is not None and endpoint.addresses_a_connector:
        # A fresh key each time (a row rotates it), and a rejected intake (a landline) to retry.
        connector = dict(ws.ids.connectors["IndiaMART"])
        _, key = rotate_key(Connector.get(Connector.public_id == connector["id"]), WEBHOOK_SECRET_KEY)
        body = intake_fixture("indiamart_push")
        body["RESPONSE"].update(UNIQUE_QUERY_ID=uuid.uuid4().hex, SENDER_MOBILE="+91-11-23456789")
        connector["intake"] = client.post(f"{connector['url']}/{key}", json=body).json["data"]["intakes"][0]
    job = member = None
    if endpoint is not None and endpoint.addresses_a_job:
        job = client.post("/api/v1/imports", data=MATRIX_CSV, content_type="text/csv",
                          headers=ws.headers(ROLE_EMAILS[JOB_CREATOR])).json["data"]["id"]
    if endpoint is not None and endpoint.addresses_a_member:
        north = ws.member(ROLE_EMAILS["agent"])
        member = Member.create(workspace=north.workspace_id, team=north.team_id, name="Matrix Agent", role="agent",
                               email=f"matrix.{uuid.uuid4().hex[:10]}@t.test").public_id
    return World(ws, other_ws, leads, webhook, connector, job, member)


@pytest.mark.parametrize("endpoint, caller, target", list(cases()))
def test_scope_matrix(client, world, endpoint, caller, target):
    lead = world.leads.get(target)
    path = (endpoint.path.replace("{lead}", lead["id"]).replace("{note}", lead.get("note", ""))
            .replace("{task}", lead.get("task", "")).replace("{merge}", lead.get("merge", "")) if lead
            else endpoint.path)
    if world.webhook:
        path = path.replace("{webhook}", world.webhook["id"]).replace("{delivery}", world.webhook["delivery"])
    if "{token}" in path:
        token, _ = issue_token(world.ws.member(ROLE_EMAILS["agent"]), ["leads:read"], name="matrix")
        path = path.replace("{token}", token.public_id)
    if world.connector:
        path = path.replace("{connector}", world.connector["id"]).replace("{intake}", world.connector["intake"])
    path = path.replace("{job}", world.job or "").replace("{member}", world.member or "")
    headers = world.headers(caller, endpoint)
    body = endpoint.body(world.ws) if endpoint.body else None
    if body is not None and lead and "duplicate" in lead:
        body = json.loads(json.dumps(body).replace("{duplicate}", lead["duplicate"]))
    if isinstance(body, str):   # a CSV file
        response = client.open(path, method=endpoint.method, data=body, content_type="text/csv", headers=headers)
    else:
        response = client.open(path, method=endpoint.method, json=body, headers=headers)

    status = expected_status(endpoint, caller, target)
    assert response.status_code == status, response.get_data(as_text=True)[:300]
    if status >= 400:
        assert response.content_type == "application/problem+json"
        assert_shows_no_lead(response, world, except_ids=())
        return
    assert_within_scope(response, endpoint, caller, world, lead)


def assert_within_scope(response, endpoint: Endpoint, caller: str, world: World, lead: dict | None) -> None:
    data = response.json["data"] if response.is_json else None
    if endpoint.shows == "lead":
        assert data["id"] == lead["id"]
    elif endpoint.shows == "leads":
        ids = {row["id"] for row in data}
        targets = {lead["id"] for lead in world.leads.values()}
        assert ids & targets == visible_ids(caller, world), f"{caller} sees the matrix leads of its scope"
        assert all(in_scope(caller, world, row) for row in Lead.select().where(Lead.public_id.in_(list(ids)))), \
            f"every lead {caller} lists is in its scope"
    elif endpoint.shows == "created":
        workspace = world.other_ws if caller == "foreign" else world.ws
        created = Lead.get(Lead.public_id == data["id"])
        assert created.workspace_id == Workspace.get(Workspace.public_id == workspace.public_id).id
    elif endpoint.shows == "batch":
        workspace = world.other_ws if caller == "foreign" else world.ws
        created = [item["lead"]["id"] for item in data]
        assert [item["status"] for item in data] == [201, 201]
        assert all(lead.workspace_id == Workspace.get(Workspace.public_id == workspace.public_id).id
                   for lead in Lead.select().where(Lead.public_id.in_(created)))
    elif endpoint.shows == "reference":
        ids = {row["id"] for row in data}
        theirs = world.ws if caller == "foreign" else world.other_ws
        assert ids and not ids & all_ids(theirs), "reference data of one workspace only"
    if caller == "foreign" or endpoint.shows in ("leads", "other"):
        allowed = visible_ids(caller, world) | ({data["id"]} if endpoint.shows == "created" else set())
        allowed |= {item["lead"]["id"] for item in data} if endpoint.shows == "batch" else set()
        assert_shows_no_lead(response, world, except_ids=allowed)


def visible_ids(caller: str, world: World) -> set[str]:
    """The ids of the case's target leads that a caller may see."""
    sees = {"admin": set(TARGETS), "manager": {"team"}, "agent": {"team"}}.get(caller, set())
    return {lead["id"] for target, lead in world.leads.items() if target in sees}


def in_scope(caller: str, world: World, lead: Lead) -> bool:
    workspace = Workspace.get(Workspace.public_id == world.ws.public_id).id
    if caller == "admin":
        return lead.workspace_id == workspace
    if caller == "foreign":   # another workspace's admin: the leads its own rows of the matrix created there
        return lead.workspace_id == Workspace.get(Workspace.public_id == world.other_ws.public_id).id
    member = Member.get(Member.public_id == world.ws.ids.members[ROLE_EMAILS[caller]])
    return lead.team_id == member.team_id if caller == "manager" else lead.owner_id == member.id


def assert_shows_no_lead(response, world: World, except_ids) -> None:
    """Neither the id nor the contact of a lead outside `except_ids` appears anywhere in the answer."""
    text = response.get_data(as_text=True)
    for lead in world.leads.values():
        if lead["id"] not in except_ids:
            assert lead["contact"]["email"] not in text
            if response.status_code < 400:
                assert lead["id"] not in text


def all_ids(tenant: Tenant) -> set[str]:
    ids = tenant.ids
    return {tenant.public_id, *ids.teams.values(), *ids.members.values(), *ids.statuses.values(),
            *ids.sources.values(), *ids.custom_fields.values(), *ids.lost_reasons.values()}


# Routes open to anyone, on purpose: a web form's submissions, the published contract, and what
# senders post to connectors (each checks its sender; foreign ids: tests/test_intake.py).
PUBLIC_ROUTES = {("POST", "/api/v1/forms/{}/submissions"), ("GET", "/api/v1/openapi.json"),
                 ("GET", "/api/v1/intake/{}"), ("POST", "/api/v1/intake/{}"), ("GET", "/api/v1/intake/{}/{}"),
                 ("POST", "/api/v1/intake/{}/{}")}


def test_every_api_route_is_in_the_matrix_or_public(app):
    import re

    def shape(path: str) -> str:
        return re.sub(r"<[^>]+>|\{[^}]+\}", "{}", path.split("?")[0])

    routes = {(method, shape(rule.rule)) for rule in app.url_map.iter_rules() if rule.rule.startswith("/api/v1/")
              for method in rule.methods - {"HEAD", "OPTIONS"}}
    covered = {(endpoint.method, shape(endpoint.path)) for endpoint in ENDPOINTS}
    assert routes - covered == PUBLIC_ROUTES


# The public intake routes, against every caller: a token of any role (or of the foreign
# workspace) opens none of them, and the foreign workspace's connector key opens none of this
# workspace's connectors. Each answers the one refusal and stores nothing.
INTAKE_ROUTES = {
    "google_ads": lambda url, key: ("POST", url, {"json": {**intake_fixture("google_ads"), "google_key": key,
                                                           "lead_id": uuid.uuid4().hex}}),
    "meta": lambda url, key: ("GET", f"{url}?hub.mode=subscribe&hub.verify_token={key}&hub.challenge=1", {}),
    "indiamart": lambda url, key: ("POST", f"{url}/{key}", {"json": intake_fixture("indiamart_push")}),
    "justdial": lambda url, key: ("GET", f"{url}/{key}?leadid={uuid.uuid4().hex}&name=Matrix&mobile=9812300009", {}),
}
CONNECTOR_OF_KIND = {"google_ads": "Google Ads - Villas", "meta": "Meta lead ads", "indiamart": "IndiaMART",
                     "justdial": "JustDial"}


@pytest.mark.parametrize("kind", list(INTAKE_ROUTES))
@pytest.mark.parametrize("caller", [*ROLE_EMAILS, "foreign"])
def test_intake_routes_refuse_tokens_and_a_foreign_workspaces_key(client, tenants, kind, caller):
    ws, other_ws = tenants
    mine = ws.ids.connectors[CONNECTOR_OF_KIND[kind]]
    theirs = Connector.get(Connector.public_id == other_ws.ids.connectors[CONNECTOR_OF_KIND[kind]]["id"])
    headers = ws.headers(ROLE_EMAILS[caller]) if caller in ROLE_EMAILS else other_ws.headers()
    stored = Intake.select().join(Connector).where(Connector.public_id == mine["id"]).count()
    method, path, body = INTAKE_ROUTES[kind](mine["url"], key_of(theirs, WEBHOOK_SECRET_KEY))
    response = client.open(path, method=method, headers=headers, **body)
    assert response.status_code == 403 and response.content_type == "application/problem+json"
    assert mine["id"] not in response.get_data(as_text=True)
    assert Intake.select().join(Connector).where(Connector.public_id == mine["id"]).count() == stored


# --- rules the matrix cannot show row by row -----------------------------------------------------

def test_a_duplicate_outside_the_scope_is_409_and_shows_nothing(client, world):
    theirs = world.leads["other_team"]
    response = client.post("/api/v1/leads", json={"email": theirs["contact"]["email"]},
                           headers=world.ws.headers(ROLE_EMAILS["agent"]))
    assert response.status_code == 409 and response.json["code"] == "conflict"
    assert theirs["id"] not in response.get_data(as_text=True)


def test_a_foreign_workspace_can_reuse_a_contact_without_seeing_the_lead(client, world):
    mine = world.leads["team"]
    response = client.post("/api/v1/leads", json={"email": mine["contact"]["email"]}, headers=world.other_ws.headers())
    assert response.status_code == 201 and response.json["duplicate"] is False
    assert response.json["data"]["id"] != mine["id"]


def test_filters_cannot_widen_the_scope(client, world):
    theirs = world.leads["other_team"]
    query = f"/api/v1/leads?filter[owner]={world.ws.ids.members['s1@t.test']}"
    response = client.get(query, headers=world.ws.headers(ROLE_EMAILS["manager"]))
    assert response.status_code == 200 and response.json["data"] == []
    assert theirs["contact"]["email"] not in response.get_data(as_text=True)


def test_an_agent_cannot_assign_a_lead_away_or_to_another_team(client, world):
    mine = world.leads["team"]
    response = client.patch(f"/api/v1/leads/{mine['id']}", json={"owner": world.ws.ids.members["s1@t.test"]},
                            headers=world.ws.headers(ROLE_EMAILS["agent"]))
    assert response.status_code == 403


def test_a_manager_cannot_assign_outside_its_team(client, world):
    mine = world.leads["team"]
    response = client.patch(f"/api/v1/leads/{mine['id']}", json={"owner": world.ws.ids.members["s1@t.test"]},
                            headers=world.ws.headers(ROLE_EMAILS["manager"]))
    assert response.status_code == 422 and "owner" in response.json["errors"]
