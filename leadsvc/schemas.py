"""Marshmallow schemas: what goes in (normalized at the boundary) and what comes out."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from functools import cache, lru_cache

import marshmallow as ma
from apispec import BasePlugin

from .models import CONTACT_KINDS, Workspace, public_id_pattern, public_id_regex, utcnow


def rfc3339(value: datetime | None) -> str | None:
    """A naive UTC datetime as RFC 3339 with Z."""
    return None if value is None else value.isoformat(timespec="microseconds") + "Z"


class UtcDateTime(ma.fields.DateTime):
    """Dumps naive UTC datetimes as RFC 3339 with `Z`."""

    def _serialize(self, value, attr, obj, **kwargs):
        return rfc3339(value)


class RefSchema(ma.Schema):
    """A related record: its public id and name."""

    id = ma.fields.String(attribute="public_id", required=True)
    name = ma.fields.String(required=True)


class TeamSchema(RefSchema):
    pass


class LostReasonSchema(RefSchema):
    position = ma.fields.Integer(required=True)


class SourceSchema(RefSchema):
    score = ma.fields.Integer(required=True, metadata={"description": "Points a lead from this source scores."})


class StatusSchema(RefSchema):
    position = ma.fields.Integer(required=True)
    kind = ma.fields.String(required=True, metadata={"enum": ["open", "won", "lost"]})
    next = ma.fields.List(ma.fields.String(), required=True,
                          metadata={"description": "Ids of the statuses a lead may move to from this one."})


class MemberSchema(RefSchema):
    email = ma.fields.String(required=True)
    role = ma.fields.String(required=True, metadata={"enum": ["admin", "manager", "agent"]})
    team = ma.fields.Nested(RefSchema, allow_none=True, required=True)
    active = ma.fields.Boolean(required=True)


class CustomFieldSchema(RefSchema):
    label = ma.fields.String(required=True)
    type = ma.fields.String(required=True, metadata={"enum": ["text", "number", "boolean", "date", "choice"]})
    options = ma.fields.List(ma.fields.String(), allow_none=True, required=True)
    personal = ma.fields.Boolean(required=True, metadata={
        "description": "Holds personal data: erasing a lead clears this field's value."})


class FormSchema(RefSchema):
    source = ma.fields.Nested(RefSchema, allow_none=True, required=True,
                              metadata={"description": "The source the form's leads get."})
    page_url = ma.fields.String(required=True, metadata={
        "description": "The path of the form's HTML page (under the service's mount prefix), e.g. /forms/form_..."})
    notice = ma.fields.String(allow_none=True, required=True, metadata={
        "description": "The privacy notice the form's page shows."})
    notice_version = ma.fields.String(allow_none=True, required=True)
    consent_required = ma.fields.Boolean(required=True, metadata={
        "description": "A submission without `consent` is refused (422)."})


class LinksSchema(ma.Schema):
    next = ma.fields.String(allow_none=True, required=True,
                            metadata={"description": "Relative URL of the next page; null on the last."})


class MetaSchema(ma.Schema):
    has_more = ma.fields.Boolean(required=True)


@cache
def page_of(item: type[ma.Schema], meta: type[ma.Schema] = MetaSchema) -> type[ma.Schema]:
    """The list envelope around a schema: {"data": [...], "links": {"next"}, "meta": {"has_more"}}."""
    name = item.__name__.removesuffix("Schema") + "Page"
    return type(name, (ma.Schema,), {
        "data": ma.fields.List(ma.fields.Nested(item), required=True),
        "links": ma.fields.Nested(LinksSchema, required=True),
        "meta": ma.fields.Nested(meta, required=True),
    })


@cache
def one(item: type[ma.Schema]) -> type[ma.Schema]:
    """The single-resource envelope: {"data": {...}}."""
    name = item.__name__.removesuffix("Schema") + "Document"
    return type(name, (ma.Schema,), {"data": ma.fields.Nested(item, required=True)})


def whole_page(items) -> dict:
    """A list that fits on one page (reference data)."""
    return {"data": list(items), "links": {"next": None}, "meta": {"has_more": False}}


# --- input fields: normalization happens here, at the boundary -------------------------------

# Whitespace, as the `\s` of JSON Schema's regular expressions (ECMA-262) means it: tab, line
# feed, vertical tab, form feed, carriage return, the space separators (Zs), U+2028, U+2029 and
# U+FEFF. Input is trimmed of these alone: Python's str.strip() and isspace() take a set of their
# own (U+001C-U+001F and U+0085 too, U+FEFF not), so what the published patterns allow around a
# value would not be what the code takes off.
WHITESPACE = ("\t\n\v\f\r \xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
              "\u2028\u2029\u202f\u205f\u3000\ufeff")
CONTROL = "".join(map(chr, (*range(0x20), *range(0x7F, 0xA0))))   # Unicode's Cc


def char_class(chars: str, negated: bool = False) -> str:
    """A regular expression class of exactly these characters, in \\u escapes: ECMA-262 (the
    published document's dialect) and Python read it alike, which they do not `\\s`."""
    runs: list[list[int]] = []
    for code in sorted(set(map(ord, chars))):
        if runs and code == runs[-1][1] + 1:
            runs[-1][1] = code
        else:
            runs.append([code, code])
    body = "".join(f"\\u{a:04x}" if a == b else f"\\u{a:04x}-\\u{b:04x}" for a, b in runs)
    return f"[{'^' if negated else ''}{body}]"


SPACE_PATTERN = char_class(WHITESPACE)
# Text that must say something holds a character that is neither whitespace nor a control
# character: a note of a lone U+001E says nothing, and neither does one of U+0085.
NOT_BLANK_PATTERN = char_class(WHITESPACE + CONTROL, negated=True)
BLANK_PATTERN = f"^{char_class(WHITESPACE + CONTROL)}*$"


def trim(text: str) -> str:
    """The text without the whitespace at its ends (WHITESPACE; never a bare str.strip())."""
    return text.strip(WHITESPACE)


def is_blank(text: str) -> bool:
    """Whether the text holds nothing but whitespace and control characters (NOT_BLANK_PATTERN)."""
    return all(ch in WHITESPACE or ch in CONTROL for ch in text)


def comma_separated(item: str) -> str:
    """The pattern of a comma-separated list of the item's pattern, whitespace around each item
    allowed: what list_items takes apart."""
    return rf"^{SPACE_PATTERN}*{item}{SPACE_PATTERN}*(,{SPACE_PATTERN}*{item}{SPACE_PATTERN}*)*$"


def list_items(text: str) -> list[str]:
    """The items of a comma-separated query value, each trimmed (an empty one stays, to be refused)."""
    return [trim(part) for part in text.split(",")]


class Text(ma.fields.String):
    """A trimmed string of at most max_length characters."""

    def __init__(self, max_length: int, validate: tuple = (), **kwargs):
        self.max_length = max_length
        super().__init__(validate=[ma.validate.Length(max=max_length), *validate], **kwargs)

    def _deserialize(self, value, attr, data, **kwargs):
        return trim(super()._deserialize(value, attr, data, **kwargs))


# The regions whose mobiles a phone may be: the workspace's phone_regions (setup), wherever the
# code that loads a schema knows the workspace (with phones_of), else India's alone.
MOBILE_REGIONS: ContextVar[tuple[str, ...]] = ContextVar("mobile_regions", default=("IN",))


@contextmanager
def phones_of(workspace: Workspace) -> Iterator[None]:
    """Phones loaded inside the block are read as the workspace takes them (its phone_regions)."""
    token = MOBILE_REGIONS.set(workspace.phone_regions)
    try:
        yield
    finally:
        MOBILE_REGIONS.reset(token)


def invalid_mobile_message(regions: tuple[str, ...]) -> str:
    if regions == ("IN",):
        return "Enter a valid Indian mobile number, such as +91 98765 43210."
    return (f"Enter a valid mobile number of {', '.join(regions)}: an Indian one such as +91 98765 43210, "
            "any other with its + country code.")


class Mobile(ma.fields.String):
    """A mobile number of the workspace's phone regions in any common spelling, stored as E.164."""

    MAX_LENGTH = 32   # longer is no phone number however it is spelt

    def __init__(self, **kwargs):
        metadata = {"minLength": 1, "maxLength": self.MAX_LENGTH, **kwargs.pop("metadata", {})}
        super().__init__(metadata=metadata, **kwargs)

    def _deserialize(self, value, attr, data, **kwargs):
        raw = trim(super()._deserialize(value, attr, data, **kwargs))
        regions = MOBILE_REGIONS.get()
        normalized = normalize_mobile(raw, regions) if len(raw) <= self.MAX_LENGTH else None
        if normalized is None:
            raise ma.ValidationError(invalid_mobile_message(regions))
        return normalized


# +91 and ten ASCII digits, the first not 0: E.164 already, and what phonenumbers.parse reads as
# country code 91 with those ten digits as the national number (India's national prefix, 0, is
# only stripped from a number that starts with it).
_INDIAN_E164 = re.compile(r"\+91([1-9][0-9]{9})", re.ASCII)
# What a phone may be written with. phonenumbers reads keypad letters as digits ("98765abcde" is
# +919876522233) and drops trailing text ("9876543210x"), so anything else is refused before it.
PHONE_PUNCTUATION = frozenset(" +-.()")


def is_phone_text(text: str) -> bool:
    """Whether text holds only what a phone may be written with: digits, spaces and + - . ( )."""
    return all(ch.isdecimal() or ch in PHONE_PUNCTUATION for ch in text)


@lru_cache(maxsize=4096)   # a pure function; repeats (duplicates, imports) cost nothing
def normalize_mobile(raw: str, regions: tuple[str, ...] = ("IN",)) -> str | None:
    """The phone rule, wherever a phone comes in: raw as E.164 when it spells a mobile number of
    one of the regions (one without + is read as Indian), else None."""
    import phonenumbers
    from phonenumbers import PhoneNumber, PhoneNumberFormat, PhoneNumberType

    if not is_phone_text(raw):
        return None
    e164 = _INDIAN_E164.fullmatch(raw)
    if e164 is not None and "IN" in regions:   # the spelling clients mostly send: its type, without parse
        number = PhoneNumber(country_code=91, national_number=int(e164[1]))
        return raw if phonenumbers.number_type(number) == PhoneNumberType.MOBILE else None
    try:
        number = phonenumbers.parse(raw, "IN")
    except phonenumbers.NumberParseException:
        return None
    region = phonenumbers.region_code_for_number(number)
    # A region whose plan cannot tell mobiles from fixed lines (the US, Canada) says "either".
    if (number.extension or region not in regions or not phonenumbers.is_valid_number_for_region(number, region)
            or phonenumbers.number_type(number) not in (PhoneNumberType.MOBILE, PhoneNumberType.FIXED_LINE_OR_MOBILE)):
        return None
    return phonenumbers.format_number(number, PhoneNumberFormat.E164)


class LowerEmail(ma.fields.Email):
    """A checked e-mail address, trimmed and lower-cased."""

    def __init__(self, **kwargs):
        metadata = {"minLength": 1, **kwargs.pop("metadata", {})}
        super().__init__(validate=ma.validate.Length(max=254), metadata=metadata, **kwargs)

    def _deserialize(self, value, attr, data, **kwargs):
        if isinstance(value, str):
            value = trim(value)
        return super()._deserialize(value, attr, data, **kwargs).lower()


class JsonBoolean(ma.fields.Boolean):
    """JSON true or false, nothing else: marshmallow's Boolean also takes "yes", "on", 1 and 0, and
    truthy={True}, falsy={False} still lets 1 and 0 through (1 == True)."""

    def _deserialize(self, value, attr, data, **kwargs):
        if not isinstance(value, bool):
            raise self.make_error("invalid")
        return value


class PublicId(ma.fields.String):
    """A public id of one kind (a name or another kind's id is refused)."""

    def __init__(self, prefix: str, **kwargs):
        self.prefix = prefix
        metadata = {"pattern": f"^{public_id_regex(prefix)}$", **kwargs.pop("metadata", {})}
        super().__init__(validate=ma.validate.Regexp(
            public_id_pattern(prefix), error=f"Must be a {prefix}... id."), metadata=metadata, **kwargs)


class Money(ma.fields.Float):
    """A non-negative amount with at most two decimals, loaded as a Decimal."""

    MAX = 9_999_999_999_999

    def __init__(self, **kwargs):
        super().__init__(allow_nan=False, validate=ma.validate.Range(0, self.MAX), **kwargs)

    def _deserialize(self, value, attr, data, **kwargs):
        if isinstance(value, (bool, str)):   # the contract says number: neither true nor "100" is one
            raise self.make_error("invalid")
        number = super()._deserialize(value, attr, data, **kwargs)
        if abs(number) > self.MAX:
            return number   # out of range: the validator refuses it (quantize would overflow on 1e308)
        return Decimal(str(number)).quantize(Decimal("0.01"))


MAX_CUSTOM_FIELDS = 50
NAME_LENGTH = 100
NOTE_LENGTH = 5000


def at_most_custom_fields(value: dict) -> None:
    # A function, not ma.validate.Length: apispec documents a Length on a Dict as maxLength,
    # which says nothing about an object; the metadata below says maxProperties.
    if len(value) > MAX_CUSTOM_FIELDS:
        raise ma.ValidationError(f"At most {MAX_CUSTOM_FIELDS} custom fields.")


class CustomFieldValues(ma.fields.Dict):
    """custom_fields: at most 50 keys; each value is checked against its definition later."""

    def __init__(self, **kwargs):
        metadata = {"maxProperties": MAX_CUSTOM_FIELDS, **kwargs.pop("metadata", {})}
        super().__init__(keys=ma.fields.String(validate=ma.validate.Length(1, 64)), values=ma.fields.Raw(allow_none=True),
                         validate=at_most_custom_fields, metadata=metadata, **kwargs)


# --- leads: input ----------------------------------------------------------------------------

def missing_contact(phone: str | None, email: str | None) -> dict[str, list[str]] | None:
    """A lead needs a phone or an e-mail (or both): the errors when it has neither."""
    if phone or email:
        return None
    message = "Give a phone number or an e-mail address (or both)."
    return {"phone": [message], "email": [message]}


# missing_contact's rule in JSON Schema (neither field takes null or an empty string on a create).
PHONE_OR_EMAIL = {"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}


class SchemaKeywordsPlugin(BasePlugin):
    """apispec documents fields; a rule across fields, such as "a phone or an e-mail", is declared
    as JSON Schema in the marshmallow schema's `Meta.json_schema` and added to its component."""

    def schema_helper(self, name, definition, **kwargs):
        schema = kwargs.get("schema")
        meta = getattr(schema if isinstance(schema, type) else type(schema), "Meta", None)
        return dict(getattr(meta, "json_schema", {}))


# What a create does with the lead its phone or e-mail matches (the first is the default).
ON_DUPLICATE = ("ignore", "update", "fill_empty")


def required_text(max_length: int, blank: str, metadata: dict) -> Text:
    """A trimmed string of 1..max_length characters that says something: blank text (is_blank)
    is refused with the sentence `blank`."""
    def says_something(value: str) -> None:
        if is_blank(value):
            raise ma.ValidationError(blank)

    return Text(max_length, validate=(says_something,), required=True,
                metadata={"minLength": 1, "pattern": NOT_BLANK_PATTERN, **metadata})


PURPOSE_LENGTH, NOTICE_VERSION_LENGTH = 200, 64


class ConsentGivenSchema(ma.Schema):
    """The consent a person gave to a notice, as an API client sends it with a new lead."""

    purpose = required_text(PURPOSE_LENGTH, "Say what the person consented to: the purpose is empty.",
                            metadata={"description": "What the person consented to."})
    notice_version = Text(NOTICE_VERSION_LENGTH, allow_none=True, metadata={
        "description": "The version of the notice the person saw."})


class PhoneOrEmailSchema(ma.Schema):
    """A person's phone or e-mail, or both: a lead's contact, or who a privacy request is about."""

    phone = Mobile(metadata={"example": "+919876543210"})
    email = LowerEmail(metadata={"example": "asha@example.com"})

    class Meta:
        json_schema = PHONE_OR_EMAIL

    @ma.validates_schema
    def _phone_or_email(self, data, **kwargs):
        if errors := missing_contact(data.get("phone"), data.get("email")):
            raise ma.ValidationError(errors)


class LeadCreateSchema(PhoneOrEmailSchema):
    first_name = Text(NAME_LENGTH)
    last_name = Text(NAME_LENGTH)
    source = PublicId("src_")
    estimated_value = Money(allow_none=True)
    custom_fields = CustomFieldValues()
    consent = ma.fields.Nested(ConsentGivenSchema, metadata={
        "description": "Records the person's consent (on the lead matched, for a duplicate)."})
    on_duplicate = ma.fields.String(validate=ma.validate.OneOf(ON_DUPLICATE), metadata={
        "description": "What to do when the phone or e-mail matches a lead: `ignore` (the default) leaves it as it "
                       "is; `update` replaces its fields with the ones sent, as a PATCH would; `fill_empty` fills "
                       "only its empty fields (custom fields key by key). Both need the leads:update ability "
                       "(403 when a duplicate is found without it; nothing changes)."})


MAX_BATCH = 100


class LeadBatchSchema(ma.Schema):
    # Items are read one by one, each as a create body: an item that is not valid fails alone (its
    # result is a 422) and the others go in; null too, which is no more an object than 7 is.
    leads = ma.fields.List(ma.fields.Raw(allow_none=True), required=True, validate=ma.validate.Length(
        1, MAX_BATCH, error=f"Send 1 to {MAX_BATCH} leads."))

    class Meta:
        checked_per_item = ("leads",)   # for text no database stores, too (extensions.check_storable)
        # The items' shape is a create body's, though each is checked on its own.
        json_schema = {"properties": {"leads": {
            "type": "array", "minItems": 1, "maxItems": MAX_BATCH, "items": {"$ref": "#/components/schemas/LeadCreate"},
            "description": "Each item is a body of POST /api/v1/leads (`on_duplicate` included)."}}}


class LeadPatchSchema(ma.Schema):
    first_name = Text(NAME_LENGTH, allow_none=True)
    last_name = Text(NAME_LENGTH, allow_none=True)
    phone = Mobile(allow_none=True)
    email = LowerEmail(allow_none=True)
    source = PublicId("src_", allow_none=True)
    estimated_value = Money(allow_none=True)
    custom_fields = CustomFieldValues(metadata={"description": "Merged key by key; a null value removes the key."})
    owner = PublicId("mem_", metadata={"description": "Needs the leads:assign ability."})
    do_not_contact = JsonBoolean(metadata={
        "description": "While true, calls, e-mails and messages cannot be logged on the lead (409)."})

    class Meta:
        json_schema = {"description": "The fields to change; any other, `status` included, is 422. "
                                      "The status moves with POST /api/v1/leads/{id}/status."}

    @ma.pre_load
    def _no_status(self, data, **kwargs):
        # Not a field (the document has no `status` here), but a more useful answer than "Unknown field.".
        if isinstance(data, dict) and "status" in data:
            raise ma.ValidationError({"status": ["PATCH never changes the status; use POST /api/v1/leads/{id}/status."]})
        return data


class StatusMoveSchema(ma.Schema):
    status = PublicId("st_", required=True)
    note = Text(NOTE_LENGTH, allow_none=True)
    reason = PublicId("lr_", metadata={
        "description": "Why the lead was lost (GET /api/v1/lost-reasons): required on a move to a lost status "
                       "when the workspace defines reasons; refused on a move to any other status."})


INCLUDES = ("activities", "notes")


class Includes(ma.fields.String):
    """`include`: what a lead's document also carries, loaded as a set."""

    MAX_LENGTH = 50

    def __init__(self, **kwargs):
        super().__init__(metadata={"description": "Comma-separated: activities, notes.", "maxLength": self.MAX_LENGTH,
                                   "pattern": comma_separated(f"({'|'.join(INCLUDES)})")}, **kwargs)

    def _deserialize(self, value, attr, data, **kwargs):
        text = super()._deserialize(value, attr, data, **kwargs)
        if len(text) > self.MAX_LENGTH:   # before anything is echoed back
            raise ma.ValidationError(f"Longer than maximum length {self.MAX_LENGTH}.")
        items = list_items(text)
        unknown = [item for item in items if item not in INCLUDES]
        if unknown:   # named as written, so that a control character in one shows
            raise ma.ValidationError(f"Unknown include {', '.join(map(repr, unknown))}; use activities and/or notes.")
        return frozenset(items)


class NoQuery(ma.Schema):
    """The query of a route that takes no parameters: any is 422 (unknown field), so that a typo or
    a filter the route does not have is never silently ignored. Used with as_kwargs=True, it hands
    the view nothing."""


class LeadReadQuery(ma.Schema):
    include = Includes()


# --- timeline --------------------------------------------------------------------------------

# How far in the future a logged activity's occurred_at may be: clocks of clients drift.
CLOCK_SKEW = timedelta(minutes=5)


class UtcAwareDateTime(ma.fields.AwareDateTime):
    """An RFC 3339 datetime with an offset, loaded as naive UTC (how times are stored)."""

    default_error_messages = {"out_of_range": "In UTC this time falls outside the years 1 to 9999."}

    def _deserialize(self, value, attr, data, **kwargs):
        moment = super()._deserialize(value, attr, data, **kwargs)
        try:
            return moment.astimezone(UTC).replace(tzinfo=None)
        except OverflowError:   # 0001-01-01T00:00:00+00:01 is in year 0 in UTC
            raise self.make_error("out_of_range") from None


class NoteCreateSchema(ma.Schema):
    body = required_text(NOTE_LENGTH, "Write something: the note is empty.",
                         metadata={"description": "Trimmed; 1 to 5,000 characters."})


class ActivityCreateSchema(ma.Schema):
    kind = ma.fields.String(required=True, validate=ma.validate.OneOf(CONTACT_KINDS))
    summary = required_text(NOTE_LENGTH, "Say what happened: the summary is empty.",
                            metadata={"description": "What happened; 1 to 5,000 characters."})
    occurred_at = UtcAwareDateTime(metadata={
        "description": "RFC 3339 with an offset; default now. Not in the future (5 minutes of clock skew allowed)."})

    @ma.validates("occurred_at")
    def _not_in_future(self, value, **kwargs):
        if value > utcnow() + CLOCK_SKEW:
            raise ma.ValidationError("An activity cannot have happened in the future.")


class HistoryQuery(ma.Schema):
    page_size = ma.fields.Integer(data_key="page[size]", load_default=50, validate=ma.validate.Range(1, 200))
    page_after = ma.fields.String(data_key="page[after]", metadata={"description": "The cursor from links.next."})


# --- web forms -------------------------------------------------------------------------------

HONEYPOT = "website"   # a field people never see; bots that fill every field fill it


class FormSubmissionSchema(LeadCreateSchema):
    """A web-form submission: the lead's contact and custom fields; the form sets the source."""

    website = ma.fields.String(load_only=True, metadata={
        "pattern": BLANK_PATTERN,
        "description": "The honeypot: leave it out or empty. A submission that fills it is answered "
                       "like a success and dropped."})
    consent = JsonBoolean(metadata={
        "description": "true: the person consents to the form's notice (required when the form says so)."})

    class Meta:
        exclude = ("source", "estimated_value", "on_duplicate")
        json_schema = PHONE_OR_EMAIL


class FormReceiptBodySchema(ma.Schema):
    form = ma.fields.String(required=True)
    message = ma.fields.String(required=True)


class FormReceiptSchema(ma.Schema):
    """What a JSON submission gets back: a receipt, never the lead (the caller is anonymous)."""

    data = ma.fields.Nested(FormReceiptBodySchema, required=True)


# --- privacy ---------------------------------------------------------------------------------

REASON_LENGTH = 500


class EraseSchema(ma.Schema):
    reason = required_text(REASON_LENGTH, "Say why: the reason is empty.", metadata={
        "description": "Why the lead is erased (kept in its `erased` audit entry)."})


class PersonErasureSchema(PhoneOrEmailSchema, EraseSchema):
    """Who to erase (every lead with this phone or this e-mail), and why."""


class SubjectQuery(PhoneOrEmailSchema):
    """Who a subject access request is about (an e-mail in any case)."""
