"""The request schemas: what each operation takes, built from the fields of fields.py (the
response schemas are in documents.py)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Mapping

import marshmallow as ma

from .fields import (BLANK_PATTERN, CustomFieldValues, JsonBoolean, LowerEmail, Mobile, Money, PublicId, Text,
                     UtcAwareDateTime, comma_separated, is_blank, list_items, required_text)
from .models import CONTACT_KINDS, TASK_KINDS, utcnow

NAME_LENGTH = 100
NOTE_LENGTH = 5000


# --- leads: input ----------------------------------------------------------------------------

def missing_contact(phone: str | None, email: str | None) -> dict[str, list[str]] | None:
    """A lead needs a phone or an e-mail (or both): the errors when it has neither."""
    if phone or email:
        return None
    message = "Give a phone number or an e-mail address (or both)."
    return {"phone": [message], "email": [message]}


# missing_contact's rule in JSON Schema (neither field takes null or an empty string on a create).
PHONE_OR_EMAIL = {"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}


# What a create does with the lead its phone or e-mail matches (the first is the default).
ON_DUPLICATE = ("ignore", "update", "fill_empty")


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


def refuse_with_reasons(data: Any, reasons: Mapping[str, str]) -> Any:
    """A schema's body, unless it names keys that `reasons` explains: keys a caller must not send,
    which are not fields, answered with why rather than "Unknown field." (422 naming each)."""
    if isinstance(data, dict) and (errors := {key: [reason] for key, reason in reasons.items() if key in data}):
        raise ma.ValidationError(errors)
    return data


ATTRIBUTION_LENGTH = 200
# How flat fields name an attribution key (CSV columns, web form inputs): attribution.utm_source.
ATTRIBUTION_PREFIX = "attribution."
# What the service sets in a lead's attribution, and why a caller cannot send it.
SET_BY_THE_SERVICE = {
    "channel": "The channel is how the lead came in (api for API creates); the service sets it.",
    "connector": "The connector is the feed a lead came through; the service sets it.",
    "external_id": "The external id is a connector's sender's own id; the service sets it.",
}


def _attribution_text(description: str) -> Text:
    return Text(ATTRIBUTION_LENGTH, allow_none=True, metadata={"description": description})


class AttributionSentSchema(ma.Schema):
    """Where the lead came from, as the caller knows it: campaign and ad ids, click ids, UTM
    parameters. An empty or null value counts as not sent."""

    campaign_id = _attribution_text("The ad platform's campaign id (the conversion report's campaign when given).")
    adgroup_id = _attribution_text("The ad group (ad set) id.")
    ad_id = _attribution_text("The ad id.")
    form_id = _attribution_text("The ad platform's lead form id.")
    gclid = _attribution_text("Google's click id.")
    fbclid = _attribution_text("Facebook's click id.")
    utm_source = _attribution_text("utm_source of the landing page's URL.")
    utm_medium = _attribution_text("utm_medium of the landing page's URL.")
    utm_campaign = _attribution_text("utm_campaign of the landing page's URL (the report's campaign without "
                                     "a campaign_id).")
    utm_term = _attribution_text("utm_term of the landing page's URL.")
    utm_content = _attribution_text("utm_content of the landing page's URL.")

    @ma.pre_load
    def _nothing_the_service_sets(self, data, **kwargs):
        return refuse_with_reasons(data, SET_BY_THE_SERVICE)

    @ma.post_load
    def _without_empty_values(self, data, **kwargs):
        return {key: value for key, value in data.items() if value}


class LeadCreateSchema(PhoneOrEmailSchema):
    first_name = Text(NAME_LENGTH)
    last_name = Text(NAME_LENGTH)
    source = PublicId("src_")
    estimated_value = Money(allow_none=True)
    custom_fields = CustomFieldValues()
    attribution = ma.fields.Nested(AttributionSentSchema, metadata={
        "description": "Where the lead came from (first touch: a duplicate keeps the lead's own). The lead's "
                       "channel, connector and external id are set by the service."})
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


# Fields of a lead that PATCH never changes, and why.
NOT_PATCHED = {
    "status": "PATCH never changes the status; use POST /api/v1/leads/{id}/status.",
    "attribution": "A lead's attribution is its first touch, set when it was created; it never changes.",
}


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
        json_schema = {"description": "The fields to change; any other, `status` and `attribution` included, is "
                                      "422. The status moves with POST /api/v1/leads/{id}/status."}

    @ma.pre_load
    def _not_patched(self, data, **kwargs):
        return refuse_with_reasons(data, NOT_PATCHED)


class StatusMoveSchema(ma.Schema):
    status = PublicId("st_", required=True)
    note = Text(NOTE_LENGTH, allow_none=True)
    reason = PublicId("lr_", metadata={
        "description": "Why the lead was lost (GET /api/v1/lost-reasons): required on a move to a lost status "
                       "when the workspace defines reasons; refused on a move to any other status."})


INCLUDES = ("activities", "notes", "tasks")


class Includes(ma.fields.String):
    """`include`: what a lead's document also carries, loaded as a set."""

    MAX_LENGTH = 50

    def __init__(self, **kwargs):
        super().__init__(metadata={"description": "Comma-separated: activities, notes, tasks.", "maxLength": self.MAX_LENGTH,
                                   "pattern": comma_separated(f"({'|'.join(INCLUDES)})")}, **kwargs)

    def _deserialize(self, value, attr, data, **kwargs):
        text = super()._deserialize(value, attr, data, **kwargs)
        if len(text) > self.MAX_LENGTH:   # before anything is echoed back
            raise ma.ValidationError(f"Longer than maximum length {self.MAX_LENGTH}.")
        items = list_items(text)
        unknown = [item for item in items if item not in INCLUDES]
        if unknown:   # named as written, so that a control character in one shows
            raise ma.ValidationError(f"Unknown include {', '.join(map(repr, unknown))}; use {', '.join(INCLUDES)}.")
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


class PageQuery(ma.Schema):
    """page[size] and page[after], as every cursor-paginated list takes them."""

    page_size = ma.fields.Integer(data_key="page[size]", load_default=50, validate=ma.validate.Range(1, 200))
    page_after = ma.fields.String(data_key="page[after]", metadata={"description": "The cursor from links.next."})


# --- tasks -----------------------------------------------------------------------------------

TITLE_LENGTH, OUTCOME_LENGTH = 200, 1000
# A due time within the years the lists' filters take: a lead without an open task sorts after
# every due time (models.NO_TASK).
DUE_YEARS = (1900, 9998)


def _within_years(value) -> None:
    if not DUE_YEARS[0] <= value.year <= DUE_YEARS[1]:
        raise ma.ValidationError(f"Use a time in the years {DUE_YEARS[0]} to {DUE_YEARS[1]}.")


def _due_time(**kwargs) -> UtcAwareDateTime:
    return UtcAwareDateTime(validate=_within_years, **kwargs)


class TaskPatchSchema(ma.Schema):
    kind = ma.fields.String(validate=ma.validate.OneOf(TASK_KINDS))
    title = Text(TITLE_LENGTH, validate=(ma.validate.Length(min=1),), metadata={"minLength": 1})
    notes = Text(NOTE_LENGTH, allow_none=True)
    due_at = _due_time(metadata={"description": "RFC 3339 with an offset."})
    remind_at = _due_time(allow_none=True, metadata={
        "description": "When task.due fires; not after due_at. Null: no reminder."})
    assignee = PublicId("mem_", metadata={
        "description": "The lead's owner, a manager of the lead's team, or an admin (else 422); active."})

    class Meta:
        json_schema = {"description": "The fields to change; a done or cancelled task is 409."}

    @ma.validates("title")
    def _title_says_something(self, value, **kwargs):
        if is_blank(value):
            raise ma.ValidationError("Say what to do: the title is empty.")


class TaskCreateSchema(TaskPatchSchema):
    kind = ma.fields.String(required=True, validate=ma.validate.OneOf(TASK_KINDS))
    title = required_text(TITLE_LENGTH, "Say what to do: the title is empty.",
                          metadata={"description": "Trimmed; 1 to 200 characters."})
    due_at = _due_time(required=True, metadata={"description": "RFC 3339 with an offset."})
    assignee = PublicId("mem_", metadata={
        "description": "Default: the lead's owner, else the caller's member. The lead's owner, a manager of the "
                       "lead's team, or an admin (else 422); active."})

    class Meta:
        json_schema = {"description": "A follow-up on the lead."}


class TaskCompleteSchema(ma.Schema):
    class Meta:
        body_optional = True   # "complete it" needs nothing more

    outcome = Text(OUTCOME_LENGTH, allow_none=True, metadata={
        "description": "What came of it; the logged activity's summary (else the title)."})


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


# --- privacy ---------------------------------------------------------------------------------

REASON_LENGTH = 500


class EraseSchema(ma.Schema):
    reason = required_text(REASON_LENGTH, "Say why: the reason is empty.", metadata={
        "description": "Why the lead is erased (kept in its `erased` audit entry)."})


class PersonErasureSchema(PhoneOrEmailSchema, EraseSchema):
    """Who to erase (every lead with this phone or this e-mail), and why."""


class SubjectQuery(PhoneOrEmailSchema):
    """Who a subject access request is about (an e-mail in any case)."""
