"""Bearer tokens, abilities, and the caller's data scope: the one query root for leads."""

from __future__ import annotations

import functools
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable, Iterable

import flask_smorest
import peewee as pw
from flask import g, request

from .db import read_rows, statement
from .models import BASE62, Job, Lead, Member, Note, Task, Token, Workspace, public_id_pattern, utcnow
from .problems import Forbidden, NotFound, Unauthenticated
from .fields import phones_of

ABILITIES = ("leads:read", "leads:create", "leads:update", "leads:status", "leads:assign",
             "notes:write", "activities:write", "tasks:write", "reports:read", "audit:read", "webhooks:manage", "privacy:manage",
             "connectors:manage", "members:manage")
ALL = "*"
# Abilities only an admin can exercise, whatever its token says: they act on the whole workspace.
ADMIN_ONLY = frozenset({"webhooks:manage", "privacy:manage", "connectors:manage", "members:manage"})
# Abilities an agent can never exercise, whatever its token says.
AGENT_EXCLUDED = frozenset({"leads:assign", "reports:read", "audit:read"}) | ADMIN_ONLY


def excluded_for(role: str) -> frozenset[str]:
    """The abilities a member of this role can never exercise."""
    return frozenset() if role == "admin" else AGENT_EXCLUDED if role == "agent" else ADMIN_ONLY

TOKEN_PREFIX = "lsk_"
TOKEN_PATTERN = re.compile(r"^lsk_[0-9A-Za-z]{32,128}$")
_LAST_USED_RESOLUTION = timedelta(minutes=1)   # write last_used_at at most this often
LEAD_ID = public_id_pattern("ld_")
TASK_ID = public_id_pattern("task_")


@dataclass(frozen=True)
class Caller:
    """Who is asking: the token, its member and workspace, and what it may do."""

    token: Token
    member: Member
    workspace: Workspace
    abilities: frozenset[str]

    @property
    def role(self) -> str:
        return self.member.role


def hash_token(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def effective_abilities(role: str, granted: Iterable[str]) -> frozenset[str]:
    abilities = set(ABILITIES) if ALL in granted else set(granted) & set(ABILITIES)
    return frozenset(abilities - excluded_for(role))


def check_grant(role: str, abilities: Iterable[str]) -> list[str]:
    """The abilities list for a new token, or ValueError saying what is wrong with it."""
    wanted = sorted(set(abilities))
    if not wanted:
        raise ValueError("Give at least one ability, or * for all.")
    unknown = [a for a in wanted if a != ALL and a not in ABILITIES]
    if unknown:
        raise ValueError(f"Unknown abilities: {', '.join(unknown)}. Known: {', '.join(ABILITIES)}, or *.")
    if barred := excluded_for(role).intersection(wanted):
        raise ValueError(f"{role.capitalize()}s cannot hold {', '.join(sorted(barred))}.")
    return wanted


def issue_token(member: Member, abilities: Iterable[str], *, name: str = "api",
                expires_in_days: int | None = None) -> tuple[Token, str]:
    """Create a token for the member; the secret is returned once and only its hash is kept."""
    if not member.active:
        raise ValueError(f"Member {member.public_id} is deactivated.")
    granted = check_grant(member.role, abilities)
    secret = TOKEN_PREFIX + "".join(secrets.choice(BASE62) for _ in range(40))
    now = utcnow()
    expires_at = now + timedelta(days=expires_in_days) if expires_in_days else None
    token = Token.create(workspace=member.workspace_id, member=member, name=name, abilities=granted,
                         secret_hash=hash_token(secret), created_at=now, expires_at=expires_at)
    return token, secret


def revoke_tokens(which: pw.Expression) -> int:
    """Revoke the tokens `which` selects that still work; returns how many that was.

    One revocation time per token: revoking again keeps the first."""
    return Token.update(revoked_at=utcnow()).where(which & Token.revoked_at.is_null()).execute()


def bearer_secret(header: str) -> str | None:
    """The token in an Authorization header, or None when it is not a bearer header at all."""
    scheme, _, secret = header.partition(" ")
    return secret.strip() if scheme.lower() == "bearer" and secret.strip() else None


_NOT_LOOKED_UP = object()


def authenticate() -> Caller:
    """The request's caller, looked up once per request; Unauthenticated when there is none."""
    found = g.get("caller", _NOT_LOOKED_UP)
    if found is None:
        raise Unauthenticated(g.auth_failure)
    if found is not _NOT_LOOKED_UP:
        return found
    try:
        g.caller = found = _lookup_caller()
    except Unauthenticated as exc:
        g.caller, g.auth_failure = None, exc.detail
        raise
    return found


def current_caller() -> Caller | None:
    """The caller if the request has a valid token, else None (for rate-limit keys and logs)."""
    try:
        return authenticate()
    except Unauthenticated:
        return None


def _lookup_caller() -> Caller:
    header = request.headers.get("Authorization")
    if not header:
        raise Unauthenticated("Send Authorization: Bearer <token>.")
    secret = bearer_secret(header)
    if secret is None or not TOKEN_PATTERN.match(secret):
        raise Unauthenticated("The Authorization header must be 'Bearer lsk_...'.")
    digest = hash_token(secret)
    token = _token_with_member_and_workspace(digest)
    if token is None or not hmac.compare_digest(token.secret_hash, digest):
        raise Unauthenticated("The token is not known.")
    now = utcnow()
    if token.revoked_at is not None:
        raise Unauthenticated("The token was revoked.")
    if token.expires_at is not None and token.expires_at <= now:
        raise Unauthenticated("The token has expired.")
    if not token.member.active:
        raise Unauthenticated("The token's member is deactivated.")
    if token.last_used_at is None or now - token.last_used_at > _LAST_USED_RESOLUTION:
        Token.update(last_used_at=now).where(Token.id == token.id).execute()
    return Caller(token=token, member=token.member, workspace=token.workspace,
                  abilities=effective_abilities(token.member.role, token.abilities))


# What a request needs of its workspace (a caller's, a connector's), read with what it belongs to.
REQUEST_WORKSPACE_COLUMNS = (Workspace.id, Workspace.public_id, Workspace.name, Workspace.timezone, Workspace.currency,
                             Workspace.refs_version, Workspace.phone_regions, Workspace.working_hours,
                             Workspace.first_response_minutes)
# What a caller is made of, read by every request in one query.
_CALLER_COLUMNS = {
    Token: (Token.id, Token.public_id, Token.workspace, Token.member, Token.name, Token.abilities, Token.secret_hash,
            Token.last_used_at, Token.expires_at, Token.revoked_at),
    Member: (Member.id, Member.public_id, Member.workspace, Member.team, Member.name, Member.email, Member.role,
             Member.active),
    Workspace: REQUEST_WORKSPACE_COLUMNS,
}
_CALLER_COLUMN_LIST = tuple(column for columns in _CALLER_COLUMNS.values() for column in columns)


def _token_query() -> pw.Query:
    """The caller's token, member and workspace by the token's secret hash (its one parameter)."""
    return Token.select(*_CALLER_COLUMN_LIST).join(Member).switch(Token).join(Workspace).where(Token.secret_hash == "")


def _token_with_member_and_workspace(digest: str) -> Token | None:
    """The token with this secret hash, its member and workspace attached, or None."""
    rows = read_rows(_CALLER_COLUMN_LIST, statement(_token_query), [digest])
    if not rows:
        return None
    values = iter(rows[0])
    token, member, workspace = (model(**{column.name: next(values) for column in model_columns})
                                for model, model_columns in _CALLER_COLUMNS.items())
    token.member, token.workspace = member, workspace
    return token


# flask-smorest's documentation decorators are Blueprint methods: @requires, which serves every
# blueprint, takes them from this one, which is never registered.
_DOCS = flask_smorest.Blueprint("requires", __name__)


def requires(ability: str | None = None) -> Callable:
    """Authenticate the caller (401) and check one ability (403); None: any valid token."""
    if ability is not None and ability not in ABILITIES:
        raise ValueError(f"unknown ability {ability}")

    def decorator(view: Callable) -> Callable:
        @functools.wraps(view)
        def wrapper(*args, **kwargs):
            caller = authenticate()
            if ability is not None:
                require(ability, who=caller)
            with phones_of(caller.workspace):   # the request's phones are read as its workspace takes them
                return view(*args, **kwargs)

        # Document the outcomes every authenticated operation shares.
        documented = _DOCS.alt_response(401, response="UNAUTHORIZED")(wrapper)
        if ability is not None:
            documented = _DOCS.alt_response(403, response="FORBIDDEN")(documented)
            documented = _DOCS.doc(description=f"Requires the `{ability}` ability.")(documented)
        return _DOCS.alt_response(429, response="TOO_MANY_REQUESTS")(documented)

    return decorator


def caller() -> Caller:
    """The authenticated caller of the current request (after @requires)."""
    return authenticate()


def may(ability: str, who: Caller | None = None) -> bool:
    """Whether the caller (the current request's unless given) holds the ability: the one test
    behind @requires and every other decision taken by ability."""
    return ability in (who or caller()).abilities


def require(ability: str, why: str | None = None, who: Caller | None = None) -> None:
    """403, the answer @requires gives, unless the caller holds the ability; `why` says what needs it."""
    if not may(ability, who):
        raise Forbidden(why or f"This token lacks the {ability} ability.")


# --- data scope ------------------------------------------------------------------------------

def sees_whole_workspace(who: Caller) -> bool:
    """Whether the caller's scope is all of its workspace (admins), so that a query may take the
    workspace column of any row (a transition's, say) for the scope."""
    return who.role == "admin"


def _lead_bound(member: Member) -> tuple[pw.ForeignKeyField, int | None]:
    """The leads a member (and so its tokens) may see: its own (agent), its team's (manager), its
    workspace's (admin), as the lead column and the value it must hold (None: a manager without a
    team sees none)."""
    if member.role == "admin":
        return Lead.workspace, member.workspace_id
    if member.role == "manager":
        return Lead.team, member.team_id
    return Lead.owner, member.id


def lead_bound(who: Caller) -> tuple[pw.ForeignKeyField, int | None]:
    """The lead column that bounds a caller's scope and the value it must hold (None: no lead)."""
    return _lead_bound(who.member)


def lead_scope(who: Caller) -> pw.Expression:
    """The leads a caller may see, as a condition on the lead table: never a merged lead (a
    tombstone), which only its survivor stands for."""
    column, value = _lead_bound(who.member)
    return (column == value) & Lead.merged_into.is_null() if value is not None else pw.SQL("1 = 0")


def in_lead_scope(who: Caller, lead: Lead) -> bool:
    """Whether a lead row just read lies in the caller's scope: the same bound as lead_scope."""
    return member_sees_lead(who.member, lead)


def member_sees_lead(member: Member, lead: Lead) -> bool:
    """Whether the member's scope holds the lead (row just read): the bound of lead_scope."""
    column, value = _lead_bound(member)
    return value is not None and getattr(lead, column.object_id_name) == value


def visible_leads(*fields) -> pw.ModelSelect:
    """Where every lead query starts."""
    return Lead.select(*fields).where(lead_scope(caller()))


def visible_lead_or_404(public_id: str) -> Lead:
    # A string that cannot be a lead id is not sent to the database (NUL bytes, megabytes) nor
    # echoed back.
    if not LEAD_ID.fullmatch(public_id):
        raise NotFound("There is no lead with this id.")
    lead = visible_leads().where(Lead.public_id == public_id).first()
    if lead is None:
        raise lead_not_found(public_id, caller())
    return lead


MERGE_HOPS = 10   # a survivor merged again is followed to its own survivor, this far at most


def survivor_of(lead: Lead, lock: Callable[[pw.Select], pw.Select] | None = None) -> Lead | None:
    """The lead a merged lead (a tombstone) now lives on: its survivor, followed through later
    merges; the lead itself when it is no tombstone; None past MERGE_HOPS. `lock` (db.for_update)
    locks each one read."""
    for _ in range(MERGE_HOPS):
        if lead is None or lead.merged_into_id is None:
            return lead
        query = Lead.select().where(Lead.id == lead.merged_into_id)
        lead = (lock(query) if lock else query).first()
    return None


def lead_not_found(public_id: str, who: Caller) -> NotFound:
    """The 404 for a lead the caller cannot see: with `merged_into` when it is a merged lead
    whose survivor (followed through later merges) the caller sees, so that a client can follow it."""
    merged = Lead.select().where((Lead.public_id == public_id) & (Lead.workspace == who.workspace.id)
                                 & Lead.merged_into.is_null(False)).first()
    survivor = survivor_of(merged) if merged is not None else None
    if survivor is not None and in_lead_scope(who, survivor):
        return NotFound(f"Lead {public_id} was merged into {survivor.public_id}.",
                        members={"merged_into": survivor.public_id})
    return NotFound(f"No lead {public_id}.")


def visible_note_or_404(public_id: str) -> Note:
    """A note of a lead in the caller's scope: any other is 404, like a missing one."""
    note = Note.select().where((Note.public_id == public_id) & Note.lead.in_(visible_leads(Lead.id))).first()
    if note is None:
        raise NotFound(f"No note {public_id}.")
    return note


# A task carries its lead's scope columns (copied with every change of the lead's owner).
_TASK_SCOPE_COLUMNS = {"workspace": Task.workspace, "team": Task.lead_team, "owner": Task.lead_owner}


def task_scope(who: Caller) -> pw.Expression:
    """The tasks a caller may see: those on the leads it may see, whoever they are assigned to."""
    column, value = _lead_bound(who.member)
    return _TASK_SCOPE_COLUMNS[column.name] == value if value is not None else pw.SQL("1 = 0")


def visible_tasks(*fields) -> pw.ModelSelect:
    """Where every task query starts."""
    return Task.select(*fields).where(task_scope(caller()))


def visible_task_or_404(public_id: str) -> Task:
    """A task on a lead in the caller's scope: any other is 404, like a missing one."""
    task = visible_tasks().where(Task.public_id == public_id).first() if TASK_ID.fullmatch(public_id) else None
    if task is None:
        raise NotFound(f"No task {public_id}.")
    return task


def member_scope(who: Caller) -> pw.Expression:
    """The members a caller may hand leads to: anyone (admin), its team (manager), itself (agent)."""
    if sees_whole_workspace(who):
        return Member.workspace == who.workspace.id
    if who.role == "manager":
        return (Member.workspace == who.workspace.id) & (Member.team == who.member.team_id)
    return Member.id == who.member.id



def job_scope(who: Caller) -> pw.Expression:
    """The jobs a caller may see: those its member started, or (admins) its workspace's."""
    if sees_whole_workspace(who):
        return Job.workspace == who.workspace.id
    return (Job.workspace == who.workspace.id) & (Job.member == who.member.id)


def visible_job_or_404(public_id: str) -> Job:
    """A job the caller may see: any other is 404, like a missing one."""
    job = Job.select().where((Job.public_id == public_id) & job_scope(caller())).first()
    if job is None:
        raise NotFound(f"No job {public_id}.")
    return job
