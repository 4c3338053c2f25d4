"""The team by API (DESIGN section 20): the members list, members added and changed, each
member's availability, and tokens issued, listed and revoked.

Who may change what: any member its own availability (`PATCH /members/me`); a manager its own
team's members' availability (another team's member does not exist for it); an admin anyone's;
every other field, and adding members, needs `members:manage` (admins only). Tokens: issuing
needs `members:manage`; any token lists and revokes its own member's, `members:manage` the
whole workspace's.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Mapping

import marshmallow as ma
import peewee as pw
from flask import Response
from flask.views import MethodView

from . import cursor
from .auth import Caller, caller, check_grant, issue_token, may, requires, revoke_tokens
from .db import NO_KEY_UPDATE, for_update, transaction
from .documents import RefSchema, one, page_of, whole_page
from .extensions import Blueprint
from .fields import LowerEmail, PublicId, Text, UtcAwareDateTime, UtcDateTime, required_text
from .idempotency import shows_secret
from .listing import IdList, page_document
from .models import AVAILABILITIES, ROLES, Member, OpenLeadCount, Team, Token, public_id_pattern, utcnow
from .problems import Conflict, Forbidden, NotFound, ValidationFailed
from .refs import request_refs
from .routing import availability_of, until_of
from .schemas import NoQuery, PageQuery

blp = Blueprint("members", __name__, url_prefix="/api/v1",
                description="The workspace's members: availability, capacity, administration and tokens.")

MEMBER_ID, TOKEN_ID = public_id_pattern("mem_"), public_id_pattern("tok_")
TOKENS_ORDER = cursor.Order(Token.created_at, Token.public_id, descending=True)
AVAILABILITY_FIELDS = frozenset({"availability", "until"})
MAX_TOKEN_DAYS = 3650


# --- what goes in and out --------------------------------------------------------------------

def _cap(description: str) -> ma.fields.Integer:
    return ma.fields.Integer(strict=True, allow_none=True, validate=ma.validate.Range(min=0, max=1_000_000),
                             metadata={"description": description})


MAX_OPEN_HELP = "At most this many open-status leads from routing (0: none; null: no cap)."
DAILY_HELP = "At most this many leads from routing per day in the workspace's time zone (0: none; null: no cap)."


class AvailabilitySchema(ma.Schema):
    availability = ma.fields.String(validate=ma.validate.OneOf(AVAILABILITIES))
    until = UtcAwareDateTime(allow_none=True, metadata={
        "description": "When away or on_leave ends (in the future); null: until changed again."})


class MemberCreateSchema(ma.Schema):
    name = required_text(100, "Give the member's name.", {})
    email = LowerEmail(required=True)
    role = ma.fields.String(required=True, validate=ma.validate.OneOf(ROLES))
    team = PublicId("team_", allow_none=True, metadata={"description": "Required for managers and agents."})
    max_open_leads = _cap(MAX_OPEN_HELP)
    daily_leads = _cap(DAILY_HELP)


class MemberPatchSchema(AvailabilitySchema):
    name = Text(100, validate=(ma.validate.Length(min=1, error="Give the member's name."),))
    role = ma.fields.String(validate=ma.validate.OneOf(ROLES))
    team = PublicId("team_", allow_none=True)
    max_open_leads = _cap(MAX_OPEN_HELP)
    daily_leads = _cap(DAILY_HELP)


class MemberSchema(RefSchema):
    email = ma.fields.String(required=True)
    role = ma.fields.String(required=True, metadata={"enum": list(ROLES)})
    team = ma.fields.Nested(RefSchema, allow_none=True, required=True)
    active = ma.fields.Boolean(required=True)
    # Shown to managers and admins (and to a member about itself), not to agents about others.
    availability = ma.fields.String(metadata={"enum": list(AVAILABILITIES),
                                              "description": "As of now: after `until` it is available again."})
    until = UtcDateTime(allow_none=True)
    max_open_leads = ma.fields.Integer(allow_none=True, metadata={"description": MAX_OPEN_HELP})
    daily_leads = ma.fields.Integer(allow_none=True, metadata={"description": DAILY_HELP})
    open_leads = ma.fields.Integer(metadata={"description": "Open-status leads it owns."})


class TokenCreateSchema(ma.Schema):
    name = required_text(100, "Give the token a name.", {})
    abilities = ma.fields.List(ma.fields.String(validate=ma.validate.Length(max=64)), required=True,
                               validate=ma.validate.Length(min=1, max=32),
                               metadata={"description": "Abilities, or [\"*\"]; the member's role bounds them."})
    expires_in_days = ma.fields.Integer(strict=True, allow_none=True,
                                        validate=ma.validate.Range(min=1, max=MAX_TOKEN_DAYS),
                                        metadata={"description": "Null: it never expires."})


class TokenSchema(ma.Schema):
    id = ma.fields.String(attribute="public_id", required=True)
    name = ma.fields.String(required=True)
    member = ma.fields.Nested(RefSchema, required=True)
    abilities = ma.fields.List(ma.fields.String(), required=True)
    created_at = UtcDateTime(required=True)
    last_used_at = UtcDateTime(allow_none=True, required=True)
    expires_at = UtcDateTime(allow_none=True, required=True)
    revoked_at = UtcDateTime(allow_none=True, required=True)


class TokenWithSecretSchema(TokenSchema):
    secret = ma.fields.String(allow_none=True, required=True, metadata={
        "description": "lsk_...: shown this once (null in a replay of this answer)."})


class TokensQuery(PageQuery):
    member = IdList("mem_", data_key="filter[member]")


# --- what the API does -----------------------------------------------------------------------

def member_document(member: Member, teams: Mapping[int, Team], open_leads: Mapping[int, int] | None,
                    now: datetime) -> dict[str, Any]:
    """A member as the list and the changes show it; `open_leads` None: without what only managers
    and admins see (availability, until, caps, open leads)."""
    document = {"public_id": member.public_id, "name": member.name, "email": member.email, "role": member.role,
                "team": teams.get(member.team_id), "active": member.active}
    if open_leads is not None:
        document.update(availability=availability_of(member, now), until=until_of(member, now),
                        max_open_leads=member.max_open_leads, daily_leads=member.daily_leads,
                        open_leads=open_leads.get(member.id, 0))
    return document


def open_leads_of(member_ids: list[int]) -> dict[int, int]:
    return dict(OpenLeadCount.select(OpenLeadCount.member, OpenLeadCount.open_leads)
                .where(OpenLeadCount.member.in_(member_ids)).tuples())


def shown(member: Member) -> dict[str, Any]:
    """One member's full document (the answer to a change), teams read afresh."""
    return member_document(member, {t.id: t for t in Team.select().where(Team.id == member.team_id)},
                           open_leads_of([member.id]), utcnow())


def _team(workspace_id: int, public_id: str | None) -> Team | None:
    if public_id is None:
        return None
    team = Team.get_or_none((Team.workspace == workspace_id) & (Team.public_id == public_id))
    if team is None:
        raise ValidationFailed.field("team", "Unknown team; GET /api/v1/teams lists them.")
    return team


def _check_team_for_role(role: str, team: Team | None) -> None:
    if role in ("manager", "agent") and team is None:
        raise ValidationFailed.field("team", f"A{'n' if role == 'agent' else ''} {role} belongs to a team.")


def _locked_admins(workspace_id: int) -> set[int]:
    """The workspace's active admins, their rows locked in id order (before the changed member's):
    of two admins demoting each other at once, the second sees the first's change."""
    return {member_id for member_id, in for_update(
        Member.select(Member.id).where((Member.workspace == workspace_id) & (Member.role == "admin") & Member.active)
        .order_by(Member.id)).tuples()}


def _availability_changes(member: Member, sent: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """The availability columns a request sets: `until` must be in the future and goes with away
    or on_leave; available clears it."""
    availability = sent.get("availability", availability_of(member, now))
    until = sent["until"] if "until" in sent else (member.until if "availability" not in sent else None)
    if until is not None and until <= now and "until" in sent:
        raise ValidationFailed.field("until", "Give a time in the future.")
    if availability == "available":
        if sent.get("until") is not None:
            raise ValidationFailed.field("until", "Only away or on_leave lasts until a time; send availability too.")
        until = None
    return {"availability": availability, "until": until}


def create_member(workspace_id: int, data: Mapping[str, Any]) -> Member:
    """A new member of the workspace; 409 when its e-mail is taken there."""
    team = _team(workspace_id, data.get("team"))
    _check_team_for_role(data["role"], team)
    try:
        with transaction():
            return Member.create(workspace=workspace_id, name=data["name"], email=data["email"], role=data["role"],
                                 team=team, max_open_leads=data.get("max_open_leads"),
                                 daily_leads=data.get("daily_leads"))
    except pw.IntegrityError:
        raise Conflict(f"The workspace already has a member with the e-mail {data['email']}.") from None


def update_member(member: Member, changes: Mapping[str, Any]) -> Member:
    """Change the fields sent (the caller's right to change them is checked by the view)."""
    with transaction():
        admins = _locked_admins(member.workspace_id) if "role" in changes else set()
        current = for_update(Member.select().where(Member.id == member.id), NO_KEY_UPDATE).first()
        if current is None:
            raise NotFound(f"No member {member.public_id}.")
        values: dict[str, Any] = {}
        if AVAILABILITY_FIELDS & changes.keys():
            values.update(_availability_changes(current, changes, utcnow()))
        for name in ("name", "role", "max_open_leads", "daily_leads"):
            if name in changes:
                values[name] = changes[name]
        if current.role == "admin" and values.get("role", "admin") != "admin" and not admins - {current.id}:
            raise Conflict(f"Member {current.public_id} is the workspace's only admin: make another member an "
                           "admin first.")
        team = _team(current.workspace_id, changes["team"]) if "team" in changes else current.team_id
        if "team" in changes or "role" in changes:
            _check_team_for_role(values.get("role", current.role), team)
            values["team"] = team
        changed = {name: value for name, value in values.items()
                   if getattr(current, f"{name}_id" if name == "team" else name) != getattr(value, "id", value)}
        if changed:
            for name, value in changed.items():
                setattr(current, name, value)
            current.save(only=[getattr(Member, name) for name in changed])
    return current


def member_or_404(workspace_id: int, public_id: str) -> Member:
    """The workspace's member with this id (an id of the wrong form is not looked up, nor echoed)."""
    member = (Member.get_or_none((Member.workspace == workspace_id) & (Member.public_id == public_id))
              if MEMBER_ID.fullmatch(public_id) else None)
    if member is None:
        raise NotFound("There is no member with this id.")
    return member


def changeable_member(who: Caller, public_id: str, changes: Mapping[str, Any]) -> Member:
    """The member the caller may change this way: any field with members:manage; availability
    alone as an admin, as a manager of the member's team (another team's member is 404 to it), or
    as the member itself."""
    member = member_or_404(who.workspace.id, public_id)
    if who.role == "manager" and member.team_id != who.member.team_id:
        raise NotFound("There is no member with this id.")
    if may("members:manage", who):
        return member
    if changes.keys() <= AVAILABILITY_FIELDS and (who.role != "agent" or member.id == who.member.id):
        return member
    if who.role == "agent":
        raise Forbidden("Agents set their own availability through PATCH /api/v1/members/me.")
    raise Forbidden("Only availability and until may be changed without the members:manage ability.")


def issue_member_token(member: Member, data: Mapping[str, Any]) -> tuple[Token, str]:
    """A new token of the member, with its secret (shown once)."""
    if not member.active:
        raise Conflict(f"Member {member.public_id} is deactivated.")
    try:
        check_grant(member.role, data["abilities"])
    except ValueError as exc:
        raise ValidationFailed.field("abilities", str(exc)) from None
    with transaction():
        return issue_token(member, data["abilities"], name=data["name"], expires_in_days=data.get("expires_in_days"))


def token_scope(who: Caller) -> pw.Expression:
    """The tokens a caller may list and revoke: its workspace's with members:manage, else its member's."""
    if may("members:manage", who):
        return Token.workspace == who.workspace.id
    return Token.member == who.member.id


def tokens_page(who: Caller, params: Mapping[str, Any]) -> tuple[list[Token], str | None]:
    """A page of the tokens in the caller's reach, newest first (never a secret)."""
    query = Token.select(Token, Member).join(Member).where(token_scope(who))
    if params.get("member"):
        query = query.where(Member.public_id.in_(params["member"]))
    binding = cursor.fingerprint("tokens", sorted(params.get("member") or []))
    return cursor.page(query, TOKENS_ORDER, params["page_size"], binding, params.get("page_after"))


def revoke(who: Caller, public_id: str) -> None:
    """Revoke a token in the caller's reach (again: nothing changes); any other is 404."""
    with transaction():
        if not TOKEN_ID.fullmatch(public_id) or not Token.select().where(
                token_scope(who) & (Token.public_id == public_id)).exists():
            raise NotFound("There is no token with this id.")
        revoke_tokens(Token.public_id == public_id)


def token_document(token: Token) -> dict[str, Any]:
    return {"public_id": token.public_id, "name": token.name, "member": token.member,
            "abilities": token.abilities, "created_at": token.created_at, "last_used_at": token.last_used_at,
            "expires_at": token.expires_at, "revoked_at": token.revoked_at}


# --- views -----------------------------------------------------------------------------------

@blp.route("/members")
class Members(MethodView):
    @blp.doc(operationId="listMembers")
    @requires()
    @blp.arguments(NoQuery, location="query", as_kwargs=True)
    @blp.response(200, page_of(MemberSchema))
    def get(self):
        """List the workspace's members (availability, caps and open leads: to managers and admins)"""
        refs, who = request_refs(), caller()
        members = list(refs.members.values())
        counts = open_leads_of([m.id for m in members]) if who.role in ("admin", "manager") else None
        now = utcnow()
        # The team from the cached teams: a member row's own `team` would be read from the database.
        return whole_page(member_document(member, refs.teams, counts, now) for member in members)

    @blp.doc(operationId="createMember")
    @requires("members:manage")
    @blp.arguments(MemberCreateSchema())
    @blp.response(201, one(MemberSchema))
    @blp.alt_response(409, response="CONFLICT")
    def post(self, data):
        """Add a member to the workspace"""
        return {"data": shown(create_member(caller().workspace.id, data))}


@blp.route("/members/me")
class MemberMe(MethodView):
    @blp.doc(operationId="updateMyAvailability")
    @requires()
    @blp.arguments(AvailabilitySchema())
    @blp.response(200, one(MemberSchema))
    def patch(self, changes):
        """Set the caller's own availability (any token)"""
        return {"data": shown(update_member(caller().member, changes))}


@blp.route("/members/<member_id:public_id>")
class MemberResource(MethodView):
    @blp.doc(operationId="updateMember")
    @requires()
    @blp.arguments(MemberPatchSchema())
    @blp.response(200, one(MemberSchema))
    @blp.alt_response(409, response="CONFLICT")
    def patch(self, changes, public_id):
        """Change a member: availability (its team's manager, an admin) or anything (members:manage)"""
        return {"data": shown(update_member(changeable_member(caller(), public_id, changes), changes))}


@blp.route("/members/<member_id:public_id>/tokens")
class MemberTokens(MethodView):
    @blp.doc(operationId="createMemberToken")
    @requires("members:manage")
    @blp.arguments(TokenCreateSchema())
    @blp.response(201, one(TokenWithSecretSchema), description="Created; `secret` is shown this once.")
    @blp.alt_response(409, response="CONFLICT")
    def post(self, data, public_id):
        """Issue a token for a member; its secret is shown once"""
        token, secret = issue_member_token(member_or_404(caller().workspace.id, public_id), data)
        shows_secret()
        return {"data": {**token_document(token), "secret": secret}}


@blp.route("/tokens")
class Tokens(MethodView):
    @blp.doc(operationId="listTokens")
    @requires()
    @blp.arguments(TokensQuery(), location="query")
    @blp.response(200, page_of(TokenSchema))
    def get(self, params):
        """List tokens, newest first: the caller's member's, or the workspace's with members:manage"""
        rows, after = tokens_page(caller(), params)
        return page_document([token_document(token) for token in rows], after)


@blp.route("/tokens/<token_id:public_id>")
class TokenResource(MethodView):
    @blp.doc(operationId="revokeToken")
    @requires()
    @blp.response(204)
    def delete(self, public_id):
        """Revoke a token: the caller's member's, or any of the workspace's with members:manage"""
        revoke(caller(), public_id)
        return Response(status=204)
