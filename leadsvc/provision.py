"""`leadsvc setup FILE`: create or update a workspace from a TOML file, all or nothing.

The workspace is identified by its name and everything in it by name (members by e-mail), so
running the same file twice changes nothing and keeps every id. Setup never deletes: an item
left out of the file stays as it was (deactivate a member with `active = false`).
"""

from __future__ import annotations

import re
import tomllib
import zoneinfo
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Any

import marshmallow as ma
import peewee as pw
from marshmallow import validate

from . import connectors, events, intake, lead_timers
from .db import transaction
from .export import COLUMNS as CSV_COLUMNS
from .intake import generic, pull
from .intake.mapping import PointerError, parse_pointer
from .models import (CONNECTOR_KINDS, FIELD_TYPES, ROLES, STATUS_KINDS, Connector, CustomField, Form, LostReason,
                     Member, Rule, Source, Status, Team, Workspace)
from .working_hours import WEEKDAYS, parse_window

SNAKE_CASE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


class SetupError(Exception):
    """A setup file that cannot be applied; `problems` lists each key and what is wrong with it."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


# --- the file's shape ------------------------------------------------------------------------

def _name(**kwargs):
    return ma.fields.String(required=True, validate=validate.Length(1, 100), **kwargs)


class WorkspaceSection(ma.Schema):
    name = _name()
    timezone = ma.fields.String(load_default="Asia/Kolkata")
    currency = ma.fields.String(load_default="INR", validate=validate.Regexp(r"^[A-Z]{3}$",
                                                                             error="Use a 3-letter ISO 4217 code."))

    phone_regions = ma.fields.List(ma.fields.String(), load_default=["IN"])

    @ma.validates("phone_regions")
    def _known_regions(self, value, **kwargs):
        import phonenumbers

        unknown = [region for region in value if region not in phonenumbers.SUPPORTED_REGIONS]
        if unknown:
            raise ma.ValidationError(f"Unknown region {', '.join(map(repr, unknown))}; use ISO 3166 codes like "
                                     "\"IN\", \"AE\", \"GB\", \"US\".")
        if "IN" not in value:   # a number written without + is read as Indian, so India is always taken
            raise ma.ValidationError('List "IN" too: a number written without + is read as Indian.')
        if len(set(value)) < len(value):
            raise ma.ValidationError("A region appears twice.")

    @ma.validates("timezone")
    def _known_zone(self, value, **kwargs):
        try:
            zoneinfo.ZoneInfo(value)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise ma.ValidationError(f"Unknown time zone {value!r}; use an IANA name like Asia/Kolkata.") from None


class Window(ma.fields.String):
    """A day's working window, "09:30-18:30" (working_hours.parse_window)."""

    def _deserialize(self, value, attr, data, **kwargs):
        text = super()._deserialize(value, attr, data, **kwargs)
        try:
            parse_window(text)
        except ValueError as exc:
            raise ma.ValidationError(str(exc)) from None
        return text


class Holiday(ma.fields.Field):
    """A date, written as a TOML date (2027-01-26) or an ISO string ("2027-01-26")."""

    def _deserialize(self, value, attr, data, **kwargs):
        if isinstance(value, date) and not isinstance(value, datetime):
            return value.isoformat()
        try:
            return date.fromisoformat(value).isoformat()
        except (TypeError, ValueError):
            raise ma.ValidationError(f"{value!r} is not a date; write it as \"2027-01-26\".") from None


MAX_RESPONSE_MINUTES = 10_080   # a week
FIRST_RESPONSE_MINUTES = validate.Range(1, MAX_RESPONSE_MINUTES)


class WorkingHoursSection(ma.Schema):
    """[working_hours]: a window per open weekday, in the workspace's time zone, and holidays."""

    mon, tue, wed, thu, fri, sat, sun = (Window() for _ in WEEKDAYS)
    holidays = ma.fields.List(Holiday(), load_default=list)

    @ma.validates_schema
    def _some_day_open(self, data, **kwargs):
        if not any(day in data for day in WEEKDAYS):
            raise ma.ValidationError("Give at least one weekday's window, e.g. mon = \"09:30-18:30\"; without "
                                     "[working_hours] the clock runs around the clock.")


class SlaSection(ma.Schema):
    first_response_minutes = ma.fields.Integer(required=True, strict=True, validate=FIRST_RESPONSE_MINUTES)


class TeamItem(ma.Schema):
    name = _name()


class MemberItem(ma.Schema):
    name = _name()
    email = ma.fields.Email(required=True)
    role = ma.fields.String(required=True, validate=validate.OneOf(ROLES))
    team = ma.fields.String()
    active = ma.fields.Boolean(load_default=True)
    # DESIGN section 20; left out, a cap stays as it was (TOML has no null: the API clears one).
    max_open_leads = ma.fields.Integer(strict=True, validate=validate.Range(min=0))
    daily_leads = ma.fields.Integer(strict=True, validate=validate.Range(min=0))

    @ma.validates_schema
    def _team_for_non_admins(self, data, **kwargs):
        if data.get("role") in ("manager", "agent") and not data.get("team"):
            raise ma.ValidationError("Required for managers and agents.", "team")


class StatusItem(ma.Schema):
    name = _name()
    kind = ma.fields.String(required=True, validate=validate.OneOf(STATUS_KINDS))
    next = ma.fields.List(ma.fields.String())
    stale_after_days = ma.fields.Integer(strict=True, validate=validate.Range(1, 3650))

    @ma.validates_schema
    def _stale_when_open(self, data, **kwargs):
        if "stale_after_days" in data and data.get("kind") != "open":
            raise ma.ValidationError("Only an open status's leads go stale; won and lost leads are done.",
                                     "stale_after_days")


class SourceItem(ma.Schema):
    name = _name()
    score = ma.fields.Integer(load_default=0, validate=validate.Range(-100, 100))
    first_response_minutes = ma.fields.Integer(strict=True, validate=FIRST_RESPONSE_MINUTES)


class CustomFieldItem(ma.Schema):
    name = ma.fields.String(required=True, validate=validate.Regexp(
        SNAKE_CASE, error="Use a snake_case key such as product_interest."))
    label = ma.fields.String(validate=validate.Length(1, 100))
    type = ma.fields.String(required=True, validate=validate.OneOf(FIELD_TYPES))
    options = ma.fields.List(ma.fields.String(validate=validate.Length(1, 100)))
    score = ma.fields.Dict(keys=ma.fields.String(), values=ma.fields.Integer(validate=validate.Range(-100, 100)))
    personal = ma.fields.Boolean()   # default: text fields hold personal data, other types do not

    @ma.validates_schema
    def _options_for_choices(self, data, **kwargs):
        if data.get("type") == "choice" and not data.get("options"):
            raise ma.ValidationError("A choice field needs its options.", "options")
        if data.get("type") != "choice" and "options" in data:
            raise ma.ValidationError("Only choice fields take options.", "options")


class RuleWhen(ma.Schema):
    source = ma.fields.List(ma.fields.String())
    custom_fields = ma.fields.Dict(keys=ma.fields.String(), values=ma.fields.List(ma.fields.Raw()))
    estimated_value_gte = ma.fields.Float()
    estimated_value_lt = ma.fields.Float()


class RuleAssign(ma.Schema):
    team = ma.fields.String()
    strategy = ma.fields.String(validate=validate.OneOf(["round_robin", "least_open"]))
    member = ma.fields.Email()

    @ma.validates_schema
    def _team_or_member(self, data, **kwargs):
        if ("team" in data) == ("member" in data):
            raise ma.ValidationError("Give either team (with a strategy) or member.")
        if "team" in data and "strategy" not in data:
            raise ma.ValidationError("Required with team: round_robin or least_open.", "strategy")


class RuleItem(ma.Schema):
    name = _name()
    when = ma.fields.Nested(RuleWhen, load_default=dict)
    assign = ma.fields.Nested(RuleAssign, required=True)


class FormItem(ma.Schema):
    name = _name()
    source = ma.fields.String()
    allowed_origins = ma.fields.List(ma.fields.Url(schemes={"http", "https"}, require_tld=False),
                                     load_default=list)
    notice = ma.fields.String(validate=validate.Length(1, 5000))
    notice_version = ma.fields.String(validate=validate.Length(1, 64))
    consent_required = ma.fields.Boolean(load_default=False)

    @ma.validates_schema
    def _notice_with_its_version(self, data, **kwargs):
        if "notice" in data and "notice_version" not in data:
            raise ma.ValidationError("A notice needs its version (consents record which one was shown).",
                                     "notice_version")
        if "notice_version" in data and "notice" not in data:
            raise ma.ValidationError("Only a form with a notice takes a notice_version.", "notice_version")
        if data.get("consent_required") and "notice" not in data:
            raise ma.ValidationError("Consent is given to a notice: add the notice the form shows.", "notice")


class LostReasonItem(ma.Schema):
    name = _name()


ENV_NAME = validate.Regexp(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$", error="Name an environment variable, as "
                                                                  "ACME_META_APP_SECRET; its value is read when needed.")
# The keys each kind takes beyond those every connector has.
CONNECTOR_KEYS = {"google_ads": {"custom_fields"}, "meta": {"custom_fields", "app_secret_env", "page_token_env"},
                  "indiamart": {"custom_fields", "crm_key_env"}, "justdial": {"custom_fields"},
                  "generic": {"map", "external_id"}}
REQUIRED_CONNECTOR_KEYS = {"meta": ("app_secret_env", "page_token_env"), "generic": ("map",)}


class JsonPointer(ma.fields.String):
    """An RFC 6901 JSON pointer ("/contact/phone")."""

    def _deserialize(self, value, attr, data, **kwargs):
        text = super()._deserialize(value, attr, data, **kwargs)
        try:
            parse_pointer(text)
        except PointerError as exc:
            raise ma.ValidationError(str(exc)) from None
        return text


class ConnectorItem(ma.Schema):
    """[[connectors]]: an inbound lead feed (DESIGN section 19). The environment variables are
    named here; their values (a sender's secrets) are never stored."""

    name = _name()
    kind = ma.fields.String(required=True, validate=validate.OneOf(CONNECTOR_KINDS))
    source = ma.fields.String(required=True)
    custom_fields = ma.fields.Dict(keys=ma.fields.String(validate=validate.Length(1, 200)), values=ma.fields.String())
    notice_version = ma.fields.String(validate=validate.Length(1, 64))
    app_secret_env = ma.fields.String(validate=ENV_NAME)
    page_token_env = ma.fields.String(validate=ENV_NAME)
    crm_key_env = ma.fields.String(validate=ENV_NAME)
    map = ma.fields.Dict(keys=ma.fields.String(), values=JsonPointer())
    external_id = JsonPointer()

    @ma.validates_schema
    def _keys_of_its_kind(self, data, **kwargs):
        kind = data.get("kind")
        if kind not in CONNECTOR_KEYS:
            return
        errors = {key: [f"Only {', '.join(k for k, keys in CONNECTOR_KEYS.items() if key in keys)} connectors "
                        f"take {key}."] for key in data if key in ALL_CONNECTOR_KEYS - CONNECTOR_KEYS[kind]}
        errors.update({key: [f"Required for {kind} connectors."] for key in REQUIRED_CONNECTOR_KEYS.get(kind, ())
                       if key not in data})
        for target in (data.get("map") or {}) if kind == "generic" else ():
            if problem := generic.target_problem(target):
                errors.setdefault("map", []).append(f"{target}: {problem}.")
        if kind == "generic" and "map" in data and not any(
                target in ("phone", "email") for target in data["map"]):
            errors.setdefault("map", []).append("Map phone or email (or both): a lead needs one.")
        if errors:
            raise ma.ValidationError(errors)


ALL_CONNECTOR_KEYS = frozenset().union(*CONNECTOR_KEYS.values())


class SetupFile(ma.Schema):
    workspace = ma.fields.Nested(WorkspaceSection, required=True)
    working_hours = ma.fields.Nested(WorkingHoursSection, load_default=None)
    sla = ma.fields.Nested(SlaSection, load_default=None)
    teams = ma.fields.List(ma.fields.Nested(TeamItem), load_default=list)
    members = ma.fields.List(ma.fields.Nested(MemberItem), load_default=list)
    statuses = ma.fields.List(ma.fields.Nested(StatusItem), load_default=list)
    sources = ma.fields.List(ma.fields.Nested(SourceItem), load_default=list)
    custom_fields = ma.fields.List(ma.fields.Nested(CustomFieldItem), load_default=list)
    rules = ma.fields.List(ma.fields.Nested(RuleItem), load_default=list)
    forms = ma.fields.List(ma.fields.Nested(FormItem), load_default=list)
    lost_reasons = ma.fields.List(ma.fields.Nested(LostReasonItem), load_default=list)
    connectors = ma.fields.List(ma.fields.Nested(ConnectorItem), load_default=list)


# --- reading and checking --------------------------------------------------------------------

def read_setup_file(path: str | Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            raw = tomllib.load(fh)
    except FileNotFoundError:
        raise SetupError([f"{path}: no such file."]) from None
    except tomllib.TOMLDecodeError as exc:
        raise SetupError([f"{path}: not valid TOML: {exc}."]) from None
    return parse_setup(raw)


def parse_setup(raw: dict[str, Any]) -> dict[str, Any]:
    """The file's data, checked for shape and for every name it refers to."""
    try:
        data = SetupFile().load(raw)
    except ma.ValidationError as exc:
        raise SetupError(_messages(exc.messages)) from None
    problems = _check_references(data)
    if problems:
        raise SetupError(problems)
    return data


def _messages(messages: Any, path: str = "") -> list[str]:
    """marshmallow's nested messages as `members[2].team: ...` lines."""
    lines = []
    if isinstance(messages, dict):
        for key, value in messages.items():
            if key == "_schema":
                here = path or "file"
            elif isinstance(key, int):
                here = f"{path}[{key}]"
            else:
                here = f"{path}.{key}" if path else str(key)
            lines.extend(_messages(value, here))
    else:
        for message in messages if isinstance(messages, list) else [messages]:
            text = "unknown key; check its spelling" if message == "Unknown field." else str(message).rstrip(".")
            lines.append(f"{path}: {text}.")
    return lines


def _duplicates(items: list[dict], key: str, section: str) -> list[str]:
    seen, problems = set(), []
    for i, item in enumerate(items):
        value = item[key].lower() if key == "email" else item[key]
        if value in seen:
            problems.append(f"{section}[{i}].{key}: {item[key]!r} appears twice.")
        seen.add(value)
    return problems


def _check_references(data: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    for section, key in (("teams", "name"), ("members", "email"), ("statuses", "name"),
                         ("sources", "name"), ("custom_fields", "name"), ("rules", "name"), ("forms", "name"),
                         ("lost_reasons", "name"), ("connectors", "name")):
        problems += _duplicates(data[section], key, section)

    existing = Workspace.get_or_none(Workspace.name == data["workspace"]["name"])

    def known(model, column, section_items, key="name"):
        names = {item[key] for item in section_items}
        if existing is not None:
            names |= {getattr(row, column) for row in model.select().where(model.workspace == existing.id)}
        return names

    teams = known(Team, "name", data["teams"])
    statuses = known(Status, "name", data["statuses"])
    sources = known(Source, "name", data["sources"])
    members = {m["email"].lower(): m for m in data["members"]}
    if existing is not None:
        for row in Member.select().where(Member.workspace == existing.id):
            members.setdefault(row.email, {"role": row.role, "active": row.active})
    fields = {f["name"]: f for f in data["custom_fields"]}
    if existing is not None:
        for row in CustomField.select().where(CustomField.workspace == existing.id):
            fields.setdefault(row.name, {"type": row.type, "options": row.options})

    def must_exist(value, names, where, what):
        if value not in names:
            hint = f" (known: {', '.join(sorted(names))})" if names else f" (there are no {what}s)"
            problems.append(f"{where}: unknown {what} {value!r}{hint}.")

    for i, member in enumerate(data["members"]):
        if member.get("team"):
            must_exist(member["team"], teams, f"members[{i}].team", "team")
    if data["statuses"] and data["statuses"][0]["kind"] != "open":
        problems.append("statuses[0].kind: the first status is where new leads start, so it must be open.")
    if not statuses:
        problems.append("statuses: a workspace needs at least one status.")
    for i, status in enumerate(data["statuses"]):
        for j, name in enumerate(status.get("next", [])):
            must_exist(name, statuses, f"statuses[{i}].next[{j}]", "status")
            if name == status["name"]:
                problems.append(f"statuses[{i}].next[{j}]: a status cannot move to itself.")
    for i, cf in enumerate(data["custom_fields"]):
        if cf["name"] in CSV_COLUMNS:   # its column would be the fixed one's twin, which the import refuses
            problems.append(f"custom_fields[{i}].name: '{cf['name']}' is a column of the CSV export and import; "
                            "choose another name.")
        for value in cf.get("score", {}):
            if cf["type"] == "choice" and value not in cf["options"]:
                problems.append(f"custom_fields[{i}].score.{value}: not one of the options.")
    for i, rule in enumerate(data["rules"]):
        where = f"rules[{i}]"
        for j, name in enumerate(rule["when"].get("source", [])):
            must_exist(name, sources, f"{where}.when.source[{j}]", "source")
        for key in rule["when"].get("custom_fields", {}):
            must_exist(key, set(fields), f"{where}.when.custom_fields.{key}", "custom field")
        assign = rule["assign"]
        if "team" in assign:
            must_exist(assign["team"], teams, f"{where}.assign.team", "team")
        elif assign["member"].lower() not in members:
            problems.append(f"{where}.assign.member: unknown member {assign['member']!r}.")
    for i, form in enumerate(data["forms"]):
        if form.get("source"):
            must_exist(form["source"], sources, f"forms[{i}].source", "source")
    kinds = {} if existing is None else dict(
        Connector.select(Connector.name, Connector.kind).where(Connector.workspace == existing.id).tuples())
    for i, connector in enumerate(data["connectors"]):
        where = f"connectors[{i}]"
        must_exist(connector["source"], sources, f"{where}.source", "source")
        for column, name in (connector.get("custom_fields") or {}).items():
            must_exist(name, set(fields), f"{where}.custom_fields.{column}", "custom field")
        for target in (connector.get("map") or {}):
            if target.startswith(generic.CUSTOM_PREFIX):
                must_exist(target.removeprefix(generic.CUSTOM_PREFIX), set(fields), f"{where}.map.{target}",
                           "custom field")
        before = kinds.get(connector["name"])
        if before is not None and before != connector["kind"]:
            problems.append(f"{where}.kind: connector {connector['name']!r} is {before}; a connector's kind cannot "
                            "change (its key and intakes are its kind's). Give the new feed another name.")
    return problems


# --- applying --------------------------------------------------------------------------------

@dataclass
class SetupResult:
    workspace: str
    teams: dict[str, str] = field(default_factory=dict)
    members: dict[str, str] = field(default_factory=dict)
    statuses: dict[str, str] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    custom_fields: dict[str, str] = field(default_factory=dict)
    rules: dict[str, str] = field(default_factory=dict)
    forms: dict[str, str] = field(default_factory=dict)
    lost_reasons: dict[str, str] = field(default_factory=dict)
    # name -> {"id", "url", "key"}: the key only in the run that created the connector, else null
    connectors: dict[str, dict[str, str | None]] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"workspace": self.workspace, "teams": self.teams, "members": self.members,
                "statuses": self.statuses, "sources": self.sources, "custom_fields": self.custom_fields,
                "rules": self.rules, "forms": self.forms, "lost_reasons": self.lost_reasons,
                "connectors": self.connectors}


def _upsert(model, workspace: Workspace, lookup: dict[str, Any], values: dict[str, Any]):
    """The row matching lookup in the workspace, created or brought up to date with values."""
    query = model.select().where(model.workspace == workspace.id)
    for column, value in lookup.items():
        query = query.where(getattr(model, column) == value)
    row = query.first()
    if row is None:
        return model.create(workspace=workspace, **lookup, **values)
    changed = [key for key, value in values.items()
               if _stored(row, key) != (value.id if isinstance(value, pw.Model) else value)]
    if changed:
        for key in changed:
            setattr(row, key, values[key])
        row.save(only=[getattr(model, key) for key in changed])
    return row


def _stored(row: pw.Model, key: str) -> Any:
    """A column's stored value: a foreign key's id (`team_id`), without loading the row it names."""
    return getattr(row, f"{key}_id" if hasattr(type(row), f"{key}_id") else key)


def apply_setup(data: dict[str, Any], secret_key: str = "") -> SetupResult:
    """Create or update the workspace described by checked setup data, in one transaction.
    `secret_key` (webhooks.secret_key) is what connectors' keys derive from: a file with
    connectors needs it."""
    if data["connectors"] and not secret_key:
        raise SetupError(["connectors: connector keys derive from webhooks.secret_key, which is not configured; "
                          "set it (32+ random characters) or webhooks.secret_key_file, then run setup again."])
    with transaction():
        ws = data["workspace"]
        workspace = Workspace.get_or_none(Workspace.name == ws["name"])
        # Left out of the file, [working_hours] and [sla] are off, as a left-out timezone is the default.
        values = {"timezone": ws["timezone"], "currency": ws["currency"], "phone_regions": tuple(ws["phone_regions"]),
                  "working_hours": data["working_hours"],
                  "first_response_minutes": (data["sla"] or {}).get("first_response_minutes")}
        if workspace is None:
            workspace = Workspace.create(name=ws["name"], **values)
        elif changed := [key for key, value in values.items() if getattr(workspace, key) != value]:
            for key in changed:
                setattr(workspace, key, values[key])
            workspace.save(only=[getattr(Workspace, key) for key in changed])
        result = SetupResult(workspace=workspace.public_id)

        teams = {t.name: t for t in Team.select().where(Team.workspace == workspace.id)}
        for item in data["teams"]:
            teams[item["name"]] = _upsert(Team, workspace, {"name": item["name"]}, {})
        result.teams = {item["name"]: teams[item["name"]].public_id for item in data["teams"]}

        members = {}
        for item in data["members"]:
            email = item["email"].lower()
            team = teams[item["team"]] if item.get("team") else None
            members[email] = _upsert(Member, workspace, {"email": email},
                                     {"name": item["name"], "role": item["role"], "team": team,
                                      "active": item["active"],
                                      **{cap: item[cap] for cap in ("max_open_leads", "daily_leads") if cap in item}})
        result.members = {email: m.public_id for email, m in members.items()}

        statuses = {s.name: s for s in Status.select().where(Status.workspace == workspace.id)}
        listed = [item["name"] for item in data["statuses"]]
        unlisted = sorted((s for s in statuses.values() if s.name not in listed), key=lambda s: s.position)
        for position, item in enumerate(data["statuses"], start=1):
            before = statuses.get(item["name"])
            statuses[item["name"]] = _upsert(Status, workspace, {"name": item["name"]},
                                             {"kind": item["kind"], "position": position,
                                              "stale_after_days": item.get("stale_after_days")})
            if before is not None and before.stale_after_days != item.get("stale_after_days"):
                lead_timers.redate_stale(workspace.id, before.id, item.get("stale_after_days"))
        for position, status in enumerate(unlisted, start=len(listed) + 1):
            _upsert(Status, workspace, {"name": status.name}, {"position": position})
        for item in data["statuses"]:
            allowed = [statuses[name].public_id for name in item["next"]] if "next" in item else None
            _upsert(Status, workspace, {"name": item["name"]}, {"allowed_next": allowed})
        result.statuses = {name: statuses[name].public_id for name in listed}

        sources = {s.name: s for s in Source.select().where(Source.workspace == workspace.id)}
        for item in data["sources"]:
            sources[item["name"]] = _upsert(Source, workspace, {"name": item["name"]},
                                            {"score": item["score"],
                                             "first_response_minutes": item.get("first_response_minutes")})
        result.sources = {item["name"]: sources[item["name"]].public_id for item in data["sources"]}

        for position, item in enumerate(data["custom_fields"], start=1):
            row = _upsert(CustomField, workspace, {"name": item["name"]},
                          {"label": item.get("label") or item["name"].replace("_", " ").capitalize(),
                           "type": item["type"], "options": item.get("options"),
                           "score": item.get("score"), "position": position,
                           "personal": item.get("personal", item["type"] == "text")})
            result.custom_fields[item["name"]] = row.public_id

        for position, item in enumerate(data["rules"], start=1):
            when = item["when"]
            conditions = {key: value for key, value in when.items() if key != "source"}
            if "source" in when:
                conditions["source"] = [sources[name].public_id for name in when["source"]]
            assign = item["assign"]
            if "team" in assign:
                target = {"team": teams[assign["team"]], "member": None, "strategy": assign["strategy"]}
            else:
                member = members.get(assign["member"].lower()) or Member.get(
                    (Member.workspace == workspace.id) & (Member.email == assign["member"].lower()))
                target = {"team": None, "member": member, "strategy": "member"}
            row = _upsert(Rule, workspace, {"name": item["name"]},
                          {"position": position, "conditions": conditions, **target})
            result.rules[item["name"]] = row.public_id

        for item in data["forms"]:
            source = sources[item["source"]] if item.get("source") else None
            row = _upsert(Form, workspace, {"name": item["name"]},
                          {"source": source, "allowed_origins": item["allowed_origins"],
                           "notice": item.get("notice"), "notice_version": item.get("notice_version"),
                           "consent_required": item["consent_required"]})
            result.forms[item["name"]] = row.public_id

        # In the file's order; reasons it leaves out keep theirs, after the listed ones.
        listed = [item["name"] for item in data["lost_reasons"]]
        unlisted = (LostReason.select().where((LostReason.workspace == workspace.id) & LostReason.name.not_in(listed))
                    .order_by(LostReason.position, LostReason.id)) if listed else []
        for position, name in enumerate([*listed, *(reason.name for reason in unlisted)], start=1):
            row = _upsert(LostReason, workspace, {"name": name}, {"position": position})
            if name in listed:
                result.lost_reasons[name] = row.public_id

        for item in data["connectors"]:
            result.connectors[item["name"]] = _connector(workspace, item, sources[item["source"]], secret_key)
    return result


def _connector(workspace: Workspace, item: dict[str, Any], source: Source, secret_key: str) -> dict[str, str | None]:
    """Create or update a connector; its id, url, and its key when it is new (an update never re-keys)."""
    settings = {key: item[key] for key in (*sorted(ALL_CONNECTOR_KEYS), "notice_version") if key in item}
    row = Connector.get_or_none((Connector.workspace == workspace.id) & (Connector.name == item["name"]))
    key = None
    if row is None:
        salt = events.new_salt()
        key = connectors.key_for(item["kind"], salt, secret_key)
        row = Connector.create(workspace=workspace, name=item["name"], kind=item["kind"], source=source,
                               key_salt=salt, settings=settings)
        intake.arm_cut(row, row.created_at + intake.CUT_EVERY)
    else:
        row = _upsert(Connector, workspace, {"name": item["name"]}, {"source": source, "settings": settings})
    pull.arm(row)
    return {"id": row.public_id, "url": connectors.intake_path(row), "key": key}
