"""The Peewee models and public id generation.

Every table has an integer primary key that never leaves the database layer and, where the
outside world refers to a row, a `public_id`: a type prefix plus 20 random base62 characters.
Times are naive UTC datetimes.
"""

from __future__ import annotations

import re
import secrets
import string
import time
from datetime import UTC, datetime

import peewee as pw

from .db import database

BASE62 = string.digits + string.ascii_letters
ID_TIME_DIGITS, ID_RANDOM_DIGITS = 6, 16   # the contract: at least 16 random base-62 digits
PUBLIC_ID_LENGTH = ID_TIME_DIGITS + ID_RANDOM_DIGITS

ROLES = ("admin", "manager", "agent")
AVAILABILITIES = ("available", "away", "on_leave")
STATUS_KINDS = ("open", "won", "lost")
FIELD_TYPES = ("text", "number", "boolean", "date", "choice")
CONTACT_KINDS = ("call", "email", "meeting", "whatsapp", "sms", "visit")   # what a person logs by hand
TASK_KINDS = ("call", "whatsapp", "email", "sms", "meeting", "visit", "todo")
TASK_STATES = ("open", "done", "cancelled")

# The earliest time a lead can sort by when it has never had a logged activity: the keyset
# order on `activity_sort_at` then puts it last without any NULL handling.
NEVER = datetime(1970, 1, 1)
# The latest time a lead can sort by when it has no open task: under `next_task_due_at` (earliest
# first) it then comes last without any NULL handling.
NO_TASK = datetime(9999, 12, 31)


def utcnow() -> datetime:
    """The time in UTC, naive, as every column holds it."""
    return datetime.now(UTC).replace(tzinfo=None)


def _base62(number: int, digits: int) -> str:
    """The number's last `digits` base-62 digits, most significant first."""
    out = []
    for _ in range(digits):
        number, digit = divmod(number, len(BASE62))
        out.append(BASE62[digit])
    return "".join(reversed(out))


def new_public_id(prefix: str) -> str:
    """prefix + the Unix second in ID_TIME_DIGITS base-62 digits + ID_RANDOM_DIGITS random ones.
    Ids made in the same second sort next to each other, so a busy table's unique index takes
    its new entries on a page or two already in memory instead of each on a random page."""
    return (prefix + _base62(int(time.time()), ID_TIME_DIGITS)
            + _base62(secrets.randbelow(len(BASE62) ** ID_RANDOM_DIGITS), ID_RANDOM_DIGITS))


def public_id_regex(prefix: str) -> str:
    """The regular expression of one kind's public ids, unanchored (URL rules, OpenAPI patterns)."""
    return rf"{re.escape(prefix)}[0-9A-Za-z]{{16,40}}"


def public_id_pattern(prefix: str) -> re.Pattern[str]:
    """Well-formed public ids of one kind (\\Z, not $: a trailing newline is not part of an id)."""
    return re.compile(rf"^{public_id_regex(prefix)}\Z")


class PublicIdField(pw.CharField):
    """A unique, prefixed id, random but for its creation second: the only id a client ever sees."""

    def __init__(self, prefix: str, **kwargs):
        self.prefix = prefix
        super().__init__(max_length=48, unique=True, default=lambda: new_public_id(prefix), **kwargs)


class BaseModel(pw.Model):
    class Meta:
        database = database
        legacy_table_names = False


class RegionsField(pw.CharField):
    """A tuple of region codes (setup's phone_regions), stored comma-separated."""

    def db_value(self, value):
        return None if value is None else ",".join(value)

    def python_value(self, value):
        return None if value is None else tuple(value.split(","))


class Workspace(BaseModel):
    public_id = PublicIdField("ws_")
    name = pw.CharField(max_length=100, unique=True)
    timezone = pw.CharField(max_length=64, default="Asia/Kolkata")
    currency = pw.CharField(max_length=3, default="INR")
    # The regions whose mobiles its leads' phones may be (fields.normalize_mobile).
    phone_regions = RegionsField(max_length=1000, default=("IN",))
    # Round-robin position of the fallback rotation (the last member it gave a lead to).
    rotation_last_member_id = pw.IntegerField(null=True)
    created_at = pw.DateTimeField(default=utcnow)
    # Bumped by database triggers whenever the workspace's statuses, sources, members, teams or
    # custom fields change (migration 0004): refs.Refs caches them per process until it moves.
    refs_version = pw.IntegerField(default=0)
    # Setup's [working_hours] as checked (working_hours.WorkingHours.of reads it; null: around the
    # clock) and [sla] first_response_minutes (null: leads get no response due time), 0018.
    working_hours = pw.JSONField(null=True)
    first_response_minutes = pw.IntegerField(null=True)


class Team(BaseModel):
    workspace = pw.ForeignKeyField(Workspace, backref="teams", on_delete="CASCADE", index=False)
    public_id = PublicIdField("team_")
    name = pw.CharField(max_length=100)

    class Meta:
        indexes = ((("workspace", "name"), True),)


class Member(BaseModel):
    workspace = pw.ForeignKeyField(Workspace, backref="members", on_delete="CASCADE", index=False)
    public_id = PublicIdField("mem_")
    team = pw.ForeignKeyField(Team, backref="members", null=True)
    name = pw.CharField(max_length=100)
    email = pw.CharField(max_length=254)
    role = pw.CharField(max_length=16)
    active = pw.BooleanField(default=True)
    # DESIGN section 20 (0022): availability as set, and until when (null: until changed again);
    # routing.availability_of reads it as of now. The caps: null is no cap.
    availability = pw.CharField(max_length=16, default="available", constraints=[pw.SQL("DEFAULT 'available'")])
    until = pw.DateTimeField(null=True)
    max_open_leads = pw.IntegerField(null=True)
    daily_leads = pw.IntegerField(null=True)

    class Meta:
        indexes = ((("workspace", "email"), True),)


class Token(BaseModel):
    # Indexed by the list's indexes below, which start with each of these.
    workspace = pw.ForeignKeyField(Workspace, on_delete="CASCADE", index=False)
    member = pw.ForeignKeyField(Member, backref="tokens", on_delete="CASCADE", index=False)
    public_id = PublicIdField("tok_")
    name = pw.CharField(max_length=100)
    abilities = pw.JSONField(default=list)
    secret_hash = pw.CharField(max_length=64, unique=True)   # sha256 hex of the secret
    created_at = pw.DateTimeField(default=utcnow)
    last_used_at = pw.DateTimeField(null=True)
    expires_at = pw.DateTimeField(null=True)
    revoked_at = pw.DateTimeField(null=True)

    class Meta:
        # The token list's keyset pages (0022): a workspace's, and a member's.
        indexes = ((("workspace", "created_at", "public_id"), False), (("member", "created_at", "public_id"), False))


class Status(BaseModel):
    workspace = pw.ForeignKeyField(Workspace, backref="statuses", on_delete="CASCADE", index=False)
    public_id = PublicIdField("st_")
    name = pw.CharField(max_length=100)
    position = pw.IntegerField()
    kind = pw.CharField(max_length=8)
    # Public ids of the statuses this one may move to; NULL means any other status.
    allowed_next = pw.JSONField(null=True)
    # An open status's leads go stale after this many days without a move or a logged activity (0018).
    stale_after_days = pw.IntegerField(null=True)

    class Meta:
        indexes = ((("workspace", "name"), True), (("workspace", "position"), False))

    def next_ids(self, pipeline: list[Status]) -> list[str]:
        """Public ids of the statuses this one may move to, in pipeline order."""
        if self.allowed_next is not None:
            allowed = set(self.allowed_next)
            return [s.public_id for s in pipeline if s.public_id in allowed]
        return [s.public_id for s in pipeline if s.id != self.id]


class Source(BaseModel):
    workspace = pw.ForeignKeyField(Workspace, backref="sources", on_delete="CASCADE", index=False)
    public_id = PublicIdField("src_")
    name = pw.CharField(max_length=100)
    score = pw.IntegerField(default=0)
    first_response_minutes = pw.IntegerField(null=True)   # wins over the workspace's for its leads (0018)

    class Meta:
        indexes = ((("workspace", "name"), True),)


class CustomField(BaseModel):
    workspace = pw.ForeignKeyField(Workspace, backref="custom_fields", on_delete="CASCADE", index=False)
    public_id = PublicIdField("cf_")
    name = pw.CharField(max_length=64)
    label = pw.CharField(max_length=100)
    type = pw.CharField(max_length=8)
    options = pw.JSONField(null=True)          # the allowed values of a `choice`
    score = pw.JSONField(null=True)            # {value: points} added to a lead's score
    position = pw.IntegerField(default=0)
    # Holds personal data: an erasure clears its values (setup's `personal`; text fields by default).
    personal = pw.BooleanField(default=False, constraints=[pw.SQL("DEFAULT FALSE")])

    class Meta:
        indexes = ((("workspace", "name"), True),)


class Form(BaseModel):
    workspace = pw.ForeignKeyField(Workspace, backref="forms", on_delete="CASCADE", index=False)
    public_id = PublicIdField("form_")
    name = pw.CharField(max_length=100)
    source = pw.ForeignKeyField(Source, null=True)
    allowed_origins = pw.JSONField(default=list)
    # The privacy notice the page shows (DPDP Act), its version as consents record it, and
    # whether a submission must consent to it.
    notice = pw.TextField(null=True)
    notice_version = pw.CharField(max_length=64, null=True)
    consent_required = pw.BooleanField(default=False, constraints=[pw.SQL("DEFAULT FALSE")])

    class Meta:
        indexes = ((("workspace", "name"), True),)


CONNECTOR_KINDS = ("google_ads", "meta", "indiamart", "justdial", "generic")
# How a lead came in (its attribution's channel): the API, a web form, a CSV import or a connector.
CHANNELS = ("api", "form", "import", *CONNECTOR_KINDS)
# A lead's attribution besides channel and connector, in the order its document shows them:
# the sender's own id (connectors set it), campaign and ad ids, click ids, UTM parameters.
ATTRIBUTION_KEYS = ("external_id", "campaign_id", "adgroup_id", "ad_id", "form_id", "gclid", "fbclid",
                    "utm_source", "utm_medium", "utm_campaign", "utm_term", "utm_content")


class Connector(BaseModel):
    """An inbound lead feed (DESIGN section 19, migration 0020). Its key is never stored: it
    derives from `webhooks.secret_key` and `key_salt`, as a webhook's secret does."""

    workspace = pw.ForeignKeyField(Workspace, on_delete="CASCADE", index=False, backref="+")
    public_id = PublicIdField("conn_")
    name = pw.CharField(max_length=100)
    kind = pw.CharField(max_length=16)
    source = pw.ForeignKeyField(Source, null=True, index=False, backref="+")
    key_salt = pw.CharField(max_length=64)
    # What setup says beyond the columns: custom_fields (sender column -> custom field), map and
    # external_id (generic), the names of the environment variables holding a sender's secrets
    # (app_secret_env, page_token_env, crm_key_env), notice_version.
    settings = pw.JSONField(default=dict)
    last_error = pw.CharField(max_length=500, null=True)   # null once the sender's next payload is used
    last_error_at = pw.DateTimeField(null=True)
    # A pulling connector (IndiaMART): the end of the last window read in full, and no pull
    # before pull_after (its interval, or the wait a sender asked for).
    pulled_until = pw.DateTimeField(null=True)
    pull_after = pw.DateTimeField(null=True)
    created_at = pw.DateTimeField(default=utcnow)

    class Meta:
        indexes = ((("workspace", "name"), True),)


class Rule(BaseModel):
    workspace = pw.ForeignKeyField(Workspace, backref="rules", on_delete="CASCADE", index=False)
    public_id = PublicIdField("rule_")
    name = pw.CharField(max_length=100)
    position = pw.IntegerField()
    conditions = pw.JSONField(default=dict)   # {"source": [src ids], "custom_fields": {...}, ...}
    strategy = pw.CharField(max_length=16)
    team = pw.ForeignKeyField(Team, null=True)
    member = pw.ForeignKeyField(Member, null=True)
    rotation_last_member_id = pw.IntegerField(null=True)

    class Meta:
        indexes = ((("workspace", "name"), True), (("workspace", "position"), False))


class LostReason(BaseModel):
    """Why a lead was lost: chosen on a move to a lost status, when the workspace defines any."""

    workspace = pw.ForeignKeyField(Workspace, backref="lost_reasons", on_delete="CASCADE", index=False)
    public_id = PublicIdField("lr_")
    name = pw.CharField(max_length=100)
    position = pw.IntegerField(default=0)

    class Meta:
        table_name = "lost_reason"
        indexes = ((("workspace", "name"), True),)


class Lead(BaseModel):
    workspace = pw.ForeignKeyField(Workspace, on_delete="CASCADE", index=False)
    public_id = PublicIdField("ld_")
    first_name = pw.CharField(max_length=100, default="")
    last_name = pw.CharField(max_length=100, default="")
    phone = pw.CharField(max_length=16, null=True)        # E.164
    # Searched as prefix ranges, so on PostgreSQL these two and LeadNamePart.part are COLLATE "C" (0013).
    email = pw.CharField(max_length=254, null=True)       # lower case
    # The phone's digits back to front (search.phone_reversed): a suffix search is a prefix range.
    phone_reversed = pw.CharField(max_length=16, null=True)
    # The name parts of search.name_key: a common name word is checked here (0012).
    name_key = pw.TextField(null=True)
    # No index of their own (0006): the report index leads with workspace, status and source, and
    # statuses and sources are never deleted while leads use them.
    source = pw.ForeignKeyField(Source, null=True, index=False)
    status = pw.ForeignKeyField(Status, index=False)
    owner = pw.ForeignKeyField(Member, null=True, index=False)
    team = pw.ForeignKeyField(Team, null=True, index=False)
    estimated_value = pw.DecimalField(max_digits=15, decimal_places=2, null=True)
    custom_fields = pw.JSONField(default=dict)
    score = pw.SmallIntegerField(default=0)
    score_reasons = pw.JSONField(default=list)
    engagement = pw.IntegerField(default=0)   # points from logged calls, meetings and messages
    version = pw.IntegerField(default=1)      # bumped by every change; the ETag derives from it
    created_at = pw.DateTimeField(default=utcnow)
    updated_at = pw.DateTimeField(default=utcnow)
    status_changed_at = pw.DateTimeField(default=utcnow)
    last_activity_at = pw.DateTimeField(null=True)
    activity_sort_at = pw.DateTimeField(default=NEVER)
    # The reason of the lost status the lead is in; None in any other status (0010).
    lost_reason = pw.ForeignKeyField(LostReason, null=True, index=False, backref="+")
    # Privacy (0011). DB defaults too: bulk loaders insert leads without naming these columns.
    do_not_contact = pw.BooleanField(default=False, constraints=[pw.SQL("DEFAULT FALSE")])
    erased_at = pw.DateTimeField(null=True)
    # The latest consent record as the lead document shows it (documents.consent_document), kept
    # with the lead so that reading a page of leads needs no query per lead.
    consent = pw.JSONField(null=True)
    # Its open tasks (0017): the earliest due time and how many, kept by every task change.
    next_task_due_at = pw.DateTimeField(null=True)
    open_tasks = pw.IntegerField(default=0, constraints=[pw.SQL("DEFAULT 0")])
    # next_task_due_at, or NO_TASK without one: the column `sort=next_task_due_at` reads.
    task_sort_at = pw.DateTimeField(default=NO_TASK, constraints=[pw.SQL("DEFAULT '9999-12-31 00:00:00'")])
    # Speed to lead (0018): when its first response is due (null: created without an SLA), when
    # it came and how many working seconds after creation; response_due_at or NO_TASK, the column
    # `sort=response_due_at` reads. stale_since: when it went (or will go) stale; null when its
    # status has no stale_after_days.
    response_due_at = pw.DateTimeField(null=True)
    first_response_at = pw.DateTimeField(null=True)
    first_response_seconds = pw.IntegerField(null=True)
    response_sort_at = pw.DateTimeField(default=NO_TASK, constraints=[pw.SQL("DEFAULT '9999-12-31 00:00:00'")])
    stale_since = pw.DateTimeField(null=True)
    # Attribution (0020): how it came in (api, form, import, or a connector's kind), the
    # connector, and the rest of DESIGN section 19's keys (external_id, campaign and ad ids,
    # click ids, utm_*) as sent; `campaign` is attribution's campaign_id, else its utm_campaign,
    # the key the conversion report groups by.
    channel = pw.CharField(max_length=16, default="api", constraints=[pw.SQL("DEFAULT 'api'")])
    connector = pw.ForeignKeyField(Connector, null=True, index=False, backref="+")
    attribution = pw.JSONField(null=True)
    campaign = pw.CharField(max_length=200, null=True)
    # A tombstone (0024): the survivor this lead was merged into. It keeps its phone and e-mail,
    # so the contact indexes match them still, and auth.lead_scope leaves it out of every lead query.
    merged_into = pw.ForeignKeyField("self", null=True, index=False, backref="+")

    class Meta:
        # A write names only the columns it changed: an UPDATE of owner or status fires the
        # open-lead counter triggers, and every other column is work for nothing.
        only_save_dirty = True
        # Each sort has an index per scope root (workspace for admins, team for managers,
        # owner for agents) ending in the public id, so keyset pages are index range scans.
        indexes = (
            (("workspace", "created_at", "public_id"), False),
            (("workspace", "score", "public_id"), False),
            (("workspace", "activity_sort_at", "public_id"), False),
            (("team", "created_at", "public_id"), False),
            (("team", "score", "public_id"), False),
            (("team", "activity_sort_at", "public_id"), False),
            (("owner", "created_at", "public_id"), False),
            (("owner", "score", "public_id"), False),
            (("owner", "activity_sort_at", "public_id"), False),
            (("workspace", "task_sort_at", "public_id"), False),
            (("team", "task_sort_at", "public_id"), False),
            (("owner", "task_sort_at", "public_id"), False),
            (("workspace", "response_sort_at", "public_id"), False),
            (("team", "response_sort_at", "public_id"), False),
            (("owner", "response_sort_at", "public_id"), False),
            # Reports (0003, 0021): conversion by status, source, owner, channel and campaign, and time
            # to won, from the index alone.
            # The merged_into column last (0024): the report leaves tombstones out from the index too.
            (("workspace", "status", "source", "owner", "channel", "campaign", "created_at", "status_changed_at",
              "merged_into"), False),
        )


# A phone or an e-mail is unique in its workspace (0007): partial indexes, without the leads that
# have none. With those NULLs in, ANALYZE counted them as one value shared by thousands of leads,
# and the planner then read the whole workspace for a create's duplicate lookup.
Lead.add_index(Lead.index(Lead.workspace, Lead.phone, unique=True, where=Lead.phone.is_null(False),
                          name="lead_workspace_id_phone"))
Lead.add_index(Lead.index(Lead.workspace, Lead.email, unique=True, where=Lead.email.is_null(False),
                          name="lead_workspace_id_email"))
# Lost leads by reason, for the conversion report (0010): only the leads that have one.
Lead.add_index(Lead.index(Lead.workspace, Lead.lost_reason, Lead.status, Lead.merged_into,
                          where=Lead.lost_reason.is_null(False), name="lead_workspace_id_lost_reason_id_status_id"))
# The tombstones by their survivor (0026): what deleting a lead checks of the self-reference.
Lead.add_index(Lead.index(Lead.merged_into, where=Lead.merged_into.is_null(False), name="lead_merged_into_id"))
# Search by the end of a phone (0008).
Lead.add_index(Lead.index(Lead.workspace, Lead.phone_reversed, where=Lead.phone_reversed.is_null(False),
                          name="lead_workspace_id_phone_reversed"))
# The response report for a whole workspace (0019): its counts by owner and source read the first
# index in its order, and each percentile walks the seconds of one owner, one source or all leads
# in order. The seconds' indexes hold only responded leads, so a create writes none of them. Each
# ends with merged_into (0024), as the conversion report's does: the scope's condition on it is read
# from the index too.
Lead.add_index(Lead.index(Lead.workspace, Lead.owner, Lead.source, Lead.response_due_at, Lead.first_response_at,
                          Lead.merged_into, where=Lead.response_due_at.is_null(False),
                          name="lead_workspace_id_owner_id_source_id_response"))
for _group in ((Lead.owner,), (Lead.source,), ()):
    Lead.add_index(Lead.index(Lead.workspace, *_group, Lead.first_response_seconds, Lead.merged_into,
                              where=Lead.response_due_at.is_null(False) & Lead.first_response_seconds.is_null(False),
                              name="_".join(["lead_workspace_id", *(f.column_name for f in _group),
                                             "first_response_seconds"])))


class LeadNamePart(BaseModel):
    """A lead's first and last names and their parts, folded, for search by name words (0008).
    Written with the lead's names by pipeline (create, update) and the demo loader."""

    lead = pw.ForeignKeyField(Lead, on_delete="CASCADE", index=False, backref="+")
    workspace = pw.ForeignKeyField(Workspace, on_delete="CASCADE", index=False, backref="+")
    part = pw.CharField(max_length=100)

    class Meta:
        table_name = "lead_name_part"
        # A word is a range of parts in the workspace, the lead id from the index alone; and a
        # lead's parts, found to replace them when its names change or to delete them.
        indexes = ((("workspace", "part", "lead"), False), (("lead", "part"), False))


class OpenLeadCount(BaseModel):
    """How many open leads a member owns, for least-open routing and max_open_leads. Kept by
    database triggers on lead and status (migration 0004), so every way a lead is written keeps it
    right. Routing also counts here the leads it gave the member on its workspace's day routed_on
    (0022): the row a cap is checked on is the row the count moves on (routing.DatabaseGate)."""

    member = pw.ForeignKeyField(Member, primary_key=True, on_delete="CASCADE", backref="+")
    open_leads = pw.IntegerField(default=0)
    routed_on = pw.DateField(null=True)
    routed_today = pw.IntegerField(default=0, constraints=[pw.SQL("DEFAULT 0")])


class Attributed(BaseModel):
    """Who did something: a token with its member, or a web form."""

    # Not indexed: nothing looks history up by its actor, and every index is written by every
    # change of a lead (migration 0004 dropped them).
    actor_token = pw.ForeignKeyField(Token, null=True, backref="+", index=False)
    actor_member = pw.ForeignKeyField(Member, null=True, backref="+", index=False)
    actor_form = pw.ForeignKeyField(Form, null=True, backref="+", index=False)
    actor_connector = pw.ForeignKeyField(Connector, null=True, backref="+", index=False)   # 0020


class Transition(Attributed):
    workspace = pw.ForeignKeyField(Workspace, on_delete="CASCADE", index=False, backref="+")
    public_id = PublicIdField("tr_")
    lead = pw.ForeignKeyField(Lead, backref="transitions", on_delete="CASCADE", index=False)
    from_status = pw.ForeignKeyField(Status, null=True, backref="+", index=False)   # indexed in the report
    to_status = pw.ForeignKeyField(Status, backref="+", index=False)                # indexes below (0006)
    note = pw.TextField(null=True)
    at = pw.DateTimeField(default=utcnow)
    seconds_in_from = pw.IntegerField(null=True)
    lost_reason = pw.ForeignKeyField(LostReason, null=True, backref="+", index=False)   # a move to a lost status

    class Meta:
        indexes = (
            (("lead", "at", "public_id"), False),
            # Reports (0003): the funnel and time in status of a whole workspace, from the index alone.
            (("workspace", "to_status", "lead"), False),
            (("workspace", "from_status", "seconds_in_from"), False),
        )


class Activity(Attributed):
    workspace = pw.ForeignKeyField(Workspace, on_delete="CASCADE", index=False, backref="+")
    public_id = PublicIdField("act_")
    lead = pw.ForeignKeyField(Lead, backref="activities", on_delete="CASCADE", index=False)
    kind = pw.CharField(max_length=24)
    summary = pw.TextField(default="", null=True)   # null (like data) once the lead is erased
    data = pw.JSONField(default=dict, null=True)
    occurred_at = pw.DateTimeField(default=utcnow)
    created_at = pw.DateTimeField(default=utcnow)

    class Meta:
        indexes = ((("lead", "created_at", "public_id"), False),)


class Note(Attributed):
    workspace = pw.ForeignKeyField(Workspace, on_delete="CASCADE", index=False, backref="+")
    public_id = PublicIdField("note_")
    lead = pw.ForeignKeyField(Lead, backref="notes", on_delete="CASCADE", index=False)
    body = pw.TextField(null=True)   # null once the lead is erased
    created_at = pw.DateTimeField(default=utcnow)

    class Meta:
        indexes = ((("lead", "created_at", "public_id"), False),)


class AuditEntry(Attributed):
    """Append-only: rows are inserted, never deleted, and updated only by an erasure, which
    replaces the personal values in `changes` (privacy.py)."""

    workspace = pw.ForeignKeyField(Workspace, on_delete="CASCADE", index=False, backref="+")
    public_id = PublicIdField("aud_")
    lead = pw.ForeignKeyField(Lead, null=True, backref="audit", on_delete="CASCADE", index=False)
    action = pw.CharField(max_length=32)
    changes = pw.JSONField(default=dict)      # {field: {"old": ..., "new": ...}}
    request_id = pw.CharField(max_length=128, null=True)
    at = pw.DateTimeField(default=utcnow)

    class Meta:
        indexes = ((("lead", "at", "public_id"), False),)


class Consent(BaseModel):
    """A lead's consent to a notice (DPDP Act): given through a form, a connector (0020) or by
    an API client, and withdrawn. Kept when the lead is erased, without the client IP."""

    workspace = pw.ForeignKeyField(Workspace, on_delete="CASCADE", index=False, backref="+")
    public_id = PublicIdField("cons_")
    lead = pw.ForeignKeyField(Lead, backref="consents", on_delete="CASCADE", index=False)
    purpose = pw.CharField(max_length=200, null=True)
    notice_version = pw.CharField(max_length=64, null=True)
    form = pw.ForeignKeyField(Form, null=True, backref="+", index=False)
    token = pw.ForeignKeyField(Token, null=True, backref="+", index=False)
    connector = pw.ForeignKeyField(Connector, null=True, backref="+", index=False)   # 0020
    given_at = pw.DateTimeField(null=True)     # null: a withdrawal recorded without an earlier consent
    ip = pw.CharField(max_length=64, null=True)
    withdrawn_at = pw.DateTimeField(null=True)

    class Meta:
        indexes = ((("lead", "id"), False),)


class Task(Attributed):
    """A follow-up on a lead (0017). The actor columns say who created it."""

    workspace = pw.ForeignKeyField(Workspace, on_delete="CASCADE", index=False, backref="+")
    public_id = PublicIdField("task_")
    lead = pw.ForeignKeyField(Lead, backref="tasks", on_delete="CASCADE", index=False)
    # The lead's owner and team, copied in the transaction of every change of them: the task
    # list's scope is its lead's, and its indexes start with these columns as the lead list's do.
    lead_owner = pw.ForeignKeyField(Member, null=True, backref="+", index=False)
    lead_team = pw.ForeignKeyField(Team, null=True, backref="+", index=False)
    kind = pw.CharField(max_length=16)
    title = pw.CharField(max_length=200, null=True)   # null (like notes and outcome) once the lead is erased
    notes = pw.TextField(null=True)
    due_at = pw.DateTimeField()
    remind_at = pw.DateTimeField(null=True)
    assignee = pw.ForeignKeyField(Member, backref="+", index=False)
    state = pw.CharField(max_length=16, default="open")
    done_at = pw.DateTimeField(null=True)
    # When it was closed (done or cancelled); NEVER while open, so `-done_at` needs no NULL handling.
    closed_at = pw.DateTimeField(default=NEVER)
    outcome = pw.TextField(null=True)
    version = pw.IntegerField(default=1)   # bumped by every change; the ETag derives from it
    created_at = pw.DateTimeField(default=utcnow)
    updated_at = pw.DateTimeField(default=utcnow)

    class Meta:
        # Each sort per scope root, as the lead list's; then an assignee's list, and a lead's
        # open tasks (its list, and the lead's next_task_due_at and open_tasks).
        indexes = (
            (("workspace", "state", "due_at", "public_id"), False),
            (("lead_team", "state", "due_at", "public_id"), False),
            (("lead_owner", "state", "due_at", "public_id"), False),
            (("workspace", "state", "closed_at", "public_id"), False),
            (("lead_team", "state", "closed_at", "public_id"), False),
            (("lead_owner", "state", "closed_at", "public_id"), False),
            (("workspace", "assignee", "state", "due_at", "public_id"), False),
            (("lead", "state", "due_at", "public_id"), False),
        )


class Merge(BaseModel):
    """Leads merged into a survivor (DESIGN section 21, 0024), with what undoing it needs: the
    survivor's merged fields before and after (`before`, `after`: {field: value} as the lead holds
    them, foreign keys as ids), what the merge changed of each duplicate (`tombstones`: {lead id:
    {"phone", "email", "response_due_at"}}) and the open tasks given to the survivor's owner (`reassigned`: {task id:
    assignee id}). An erasure of any of its leads clears those (privacy.py): it cannot be undone then."""

    workspace = pw.ForeignKeyField(Workspace, on_delete="CASCADE", index=False, backref="+")
    public_id = PublicIdField("mrg_")
    survivor = pw.ForeignKeyField(Lead, on_delete="CASCADE", index=False, backref="+")
    duplicates = pw.JSONField()                 # lead ids, in the order sent
    before = pw.JSONField(null=True)
    after = pw.JSONField(null=True)
    tombstones = pw.JSONField(null=True)
    reassigned = pw.JSONField(null=True)
    actor_token = pw.ForeignKeyField(Token, null=True, backref="+", index=False)
    actor_member = pw.ForeignKeyField(Member, null=True, backref="+", index=False)
    created_at = pw.DateTimeField(default=utcnow)
    undone_at = pw.DateTimeField(null=True)

    class Meta:
        indexes = ((("survivor", "created_at"), False),)


class MergeMove(BaseModel):
    """One history row a merge moved to its survivor, and the duplicate it came from (0024)."""

    merge = pw.ForeignKeyField(Merge, on_delete="CASCADE", index=False, backref="+")
    kind = pw.CharField(max_length=16)          # the table: activity, note, task, transition, consent, audit_entry
    row_id = pw.IntegerField()
    lead = pw.ForeignKeyField(Lead, on_delete="CASCADE", index=False, backref="+")

    class Meta:
        table_name = "merge_move"
        indexes = ((("merge", "kind", "lead"), False),)


class IdempotencyKey(BaseModel):
    """The recorded response of a POST that carried an Idempotency-Key, replayed to its retries."""

    scope = pw.CharField(max_length=64)           # who sent it: "tok:<token id>" or "ip:<client address>"
    key = pw.CharField(max_length=255)
    request_hash = pw.CharField(max_length=64)    # sha256 of method, path and body
    status = pw.SmallIntegerField()
    headers = pw.JSONField(default=dict)
    body = pw.BlobField()
    created_at = pw.DateTimeField(default=utcnow)
    expires_at = pw.DateTimeField(index=True)
    # The lead the request's path names (/leads/{id}/...): an erasure of it deletes the record.
    lead_public_id = pw.CharField(max_length=48, null=True)

    class Meta:
        # The unique index is the lock: of two requests with one key, only one inserts the row.
        indexes = ((("scope", "key"), True),)


IdempotencyKey.add_index(IdempotencyKey.index(IdempotencyKey.lead_public_id,
                                              where=IdempotencyKey.lead_public_id.is_null(False),
                                              name="idempotency_key_lead"))


class Webhook(BaseModel):
    """An endpoint that receives a workspace's events (migration 0009). Its signing secrets are
    never stored: each is derived from `webhooks.secret_key` and a random salt (events.secret)."""

    workspace = pw.ForeignKeyField(Workspace, on_delete="CASCADE", index=False, backref="+")
    public_id = PublicIdField("wh_")
    url = pw.CharField(max_length=2048)
    events = pw.JSONField(default=list)        # event types, or ["*"]
    description = pw.CharField(max_length=500, default="")
    active = pw.BooleanField(default=True)
    disabled_reason = pw.CharField(max_length=500, null=True)
    secret_salt = pw.CharField(max_length=64)
    # After a rotation the previous secret signs too, until previous_expires_at.
    previous_salt = pw.CharField(max_length=64, null=True)
    previous_expires_at = pw.DateTimeField(null=True)
    failing_since = pw.DateTimeField(null=True)   # first failed attempt since the last success
    created_at = pw.DateTimeField(default=utcnow)

    class Meta:
        indexes = ((("workspace", "created_at", "public_id"), False),)


class Event(BaseModel):
    """Something that happened, written in the transaction of the change it reports."""

    workspace = pw.ForeignKeyField(Workspace, on_delete="CASCADE", index=False, backref="+")
    public_id = PublicIdField("evt_")
    # The lead it is about (null for webhook.test): what an erasure finds to scrub.
    lead = pw.ForeignKeyField(Lead, null=True, on_delete="CASCADE", backref="+")
    type = pw.CharField(max_length=48)
    body = pw.TextField()   # the JSON body every attempt sends, byte for byte
    created_at = pw.DateTimeField(default=utcnow)


DELIVERY_STATES = ("pending", "failed", "succeeded", "dead")


class Delivery(BaseModel):
    """One event to one webhook: its attempts and what is due next."""

    webhook = pw.ForeignKeyField(Webhook, on_delete="CASCADE", index=False, backref="+")
    event = pw.ForeignKeyField(Event, on_delete="CASCADE", index=False, backref="+")
    public_id = PublicIdField("dlv_")
    state = pw.CharField(max_length=16, default="pending")
    attempts = pw.IntegerField(default=0)    # also the claim's fence: an outcome is recorded for its attempt only
    failures = pw.IntegerField(default=0)    # failed attempts since created or replayed: the place in the schedule
    last_status = pw.SmallIntegerField(null=True)
    last_error = pw.CharField(max_length=500, null=True)
    last_response = pw.TextField(null=True)
    last_attempt_at = pw.DateTimeField(null=True)
    # When the next attempt is due; while an attempt runs, when its claim lapses; NULL: none.
    next_attempt_at = pw.DateTimeField(null=True)
    duration_ms = pw.IntegerField(null=True)
    created_at = pw.DateTimeField(default=utcnow)

    class Meta:
        indexes = ((("webhook", "created_at", "public_id"), False),)


# What is due, found without reading finished deliveries (0009).
Delivery.add_index(Delivery.index(Delivery.next_attempt_at, where=Delivery.next_attempt_at.is_null(False),
                                  name="delivery_due"))


INTAKE_OUTCOMES = ("created", "duplicate", "rejected", "test", "pending")


class Intake(BaseModel):
    """One payload a connector received (DESIGN section 19, migration 0020): kept with its
    outcome, whatever became of it. A queued fetch (Meta's Graph API) is due at next_attempt_at,
    claimed and retried as a webhook delivery is."""

    workspace = pw.ForeignKeyField(Workspace, on_delete="CASCADE", index=False, backref="+")
    connector = pw.ForeignKeyField(Connector, on_delete="CASCADE", index=False, backref="+")
    public_id = PublicIdField("in_")
    external_id = pw.CharField(max_length=200, null=True)   # the sender's own id: unique per connector
    outcome = pw.CharField(max_length=16, default="pending")
    lead = pw.ForeignKeyField(Lead, null=True, on_delete="SET NULL", index=False, backref="+")
    errors = pw.JSONField(null=True)           # a rejected one's problems, by field, as a 422's
    payload = pw.JSONField(null=True)          # as received; null once cut (30 days) or erased
    received_at = pw.DateTimeField(default=utcnow)
    updated_at = pw.DateTimeField(default=utcnow)
    attempts = pw.IntegerField(default=0)      # a queued fetch's, as a delivery's (the claim's fence)
    failures = pw.IntegerField(default=0)
    last_error = pw.CharField(max_length=500, null=True)
    next_attempt_at = pw.DateTimeField(null=True)

    class Meta:
        only_save_dirty = True   # settling one writes its outcome, not its payload again
        indexes = (
            (("connector", "received_at", "public_id"), False),
            (("connector", "outcome", "received_at", "public_id"), False),
        )


Intake.add_index(Intake.index(Intake.connector, Intake.external_id, unique=True,
                              where=Intake.external_id.is_null(False), name="intake_connector_id_external_id"))
Intake.add_index(Intake.index(Intake.lead, where=Intake.lead.is_null(False), name="intake_lead_id"))
Intake.add_index(Intake.index(Intake.next_attempt_at, where=Intake.next_attempt_at.is_null(False),
                              name="intake_due"))
# What the 30-day cut reads (intake.cut_payloads): the kept payloads of created and duplicate
# intakes, oldest first per connector; rejected, test and pending ones keep theirs and stay out.
Intake.add_index(Intake.index(Intake.connector, Intake.received_at,
                              where=Intake.payload.is_null(False) & Intake.outcome.in_(["created", "duplicate"]),
                              name="intake_payload_kept"))


class Timer(BaseModel):
    """A time at which something is due, for the clock (clock.py, migration 0016): one per kind
    and subject, the integer id of the row it is about."""

    workspace = pw.ForeignKeyField(Workspace, on_delete="CASCADE", index=False, backref="+")
    kind = pw.CharField(max_length=48)
    subject = pw.IntegerField()
    due_at = pw.DateTimeField()                 # the time it was armed for, as its handler is told
    fire_at = pw.DateTimeField(index=True)      # when a tick takes it: due_at, or later after a failure

    class Meta:
        indexes = ((("kind", "subject"), True),)


JOB_STATES = ("queued", "running", "succeeded", "failed")
JOB_KINDS = ("deactivate", "assign", "move", "add_task", "import")
JOB_ERRORS_KEPT = 100   # a job's errors list holds the first this many


class Job(BaseModel):
    """A long change run in batches by the clock (jobs.py, migration 0023): its progress and what
    it needs to resume, the creator's token and member being the actor of every change it makes."""

    workspace = pw.ForeignKeyField(Workspace, on_delete="CASCADE", index=False, backref="+")
    public_id = PublicIdField("job_")
    kind = pw.CharField(max_length=32)
    state = pw.CharField(max_length=16, default="queued")
    member = pw.ForeignKeyField(Member, on_delete="CASCADE", index=False, backref="+")
    token = pw.ForeignKeyField(Token, on_delete="CASCADE", index=False, backref="+")
    request_id = pw.CharField(max_length=200, null=True)
    params = pw.JSONField(default=dict)
    total = pw.IntegerField(default=0)
    position = pw.IntegerField(default=0)   # the next item to do: every item before it is done
    done = pw.IntegerField(default=0)
    failed = pw.IntegerField(default=0)
    errors = pw.JSONField(default=list)
    created_at = pw.DateTimeField(default=utcnow)
    finished_at = pw.DateTimeField(null=True)

    class Meta:
        # What an erasure reads: the workspace's unfinished imports.
        indexes = ((("workspace", "state"), False),)


class JobItem(BaseModel):
    """One item of a job, by its place in the job: a lead (by internal id) or, for an import, a
    CSV row (its number and cells). Deleted when the job finishes: rows hold personal data."""

    job = pw.ForeignKeyField(Job, on_delete="CASCADE", index=False, backref="+")
    position = pw.IntegerField()
    # A lead deleted meanwhile leaves its item, which then fails as not found.
    lead = pw.ForeignKeyField(Lead, null=True, on_delete="SET NULL", index=False, backref="+")
    data = pw.JSONField(null=True)

    class Meta:
        primary_key = pw.CompositeKey("job", "position")


MODELS: list[type[BaseModel]] = [
    Workspace, Team, Member, Token, Status, Source, CustomField, Form, Rule, LostReason, Lead,
    Transition, Activity, Note, AuditEntry, IdempotencyKey, OpenLeadCount, LeadNamePart, Consent,
    Webhook, Event, Delivery, Timer, Task, Connector, Intake, Merge, MergeMove, Job, JobItem,
]
