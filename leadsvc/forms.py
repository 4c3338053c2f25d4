"""Web forms: an HTML page people fill in, and the submission endpoint it (or a site's script) posts to.

No token: submissions are limited per client IP (rate_limits.forms, applied in create_app), must
come from one of the form's allowed origins, and a filled honeypot is answered like a success and
dropped. What is left goes through pipeline.create_lead with the form as the actor, exactly like
an API create: validation, duplicates, routing, scoring, audit.

Origins: a request's Origin header, else the origin of its Referer, must be the service's own
(the form page it serves) or one of the form's allowed_origins. A request with neither header is
not from a browser page, could forge either anyway, and is let through to the other checks.
"""

from __future__ import annotations

import re
import time
from typing import Any, Mapping
from urllib.parse import urlsplit

import marshmallow as ma
from flask import Response, g, render_template, request, url_for
from flask.views import MethodView
from werkzeug.datastructures import MultiDict

from . import pipeline
from .config import settings
from .custom_fields import form_value
from .documents import FormReceiptSchema
from .extensions import Blueprint, check_storable
from .fields import BLANK_PATTERN, NOT_BLANK_PATTERN, is_blank, phones_of, trim
from .headers import allow_framing_by
from .history import Actor
from .limits import client_ip
from .models import CustomField, Form, Workspace, public_id_pattern
from .problems import PROBLEM_MIMETYPE, Forbidden, NotFound, UnsupportedMediaType, ValidationFailed
from .refs import Refs, cached_refs
from .schemas import (ATTRIBUTION_LENGTH, ATTRIBUTION_PREFIX, HONEYPOT, NAME_LENGTH, AttributionSentSchema,
                      FormSubmissionSchema)

blp = Blueprint("forms", __name__, description="Web forms: the HTML page and its submissions (no token).")

THANKS = "Thank you! We have your details and will be in touch soon."
FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")
CUSTOM_PREFIX = "custom_fields."
CONSENT = "consent"
# What a form's page copies from its own URL into the submission, as hidden inputs (DESIGN section 19).
PAGE_ATTRIBUTION = ("utm_source", "utm_medium", "utm_campaign", "utm_term", "utm_content", "gclid", "fbclid")
DEFAULT_PORTS = {"http": 80, "https": 443}

HTML_PAGE = {"content": {"text/html": {"schema": {"type": "string"}}}}
NOT_BLANK = {"pattern": NOT_BLANK_PATTERN}   # an input of only whitespace (or controls) is one left empty
FORM_FIELDS = {
    "type": "object",
    "description": "The HTML form's fields; an empty input means not given. Answered with HTML.",
    "properties": {
        "first_name": {"type": "string", "maxLength": NAME_LENGTH},
        "last_name": {"type": "string", "maxLength": NAME_LENGTH},
        "phone": {"type": "string"},
        "email": {"type": "string"},
        HONEYPOT: {"type": "string", "pattern": BLANK_PATTERN, "description": "The honeypot: leave it empty."},
        CONSENT: {"type": "string", "description": "The consent checkbox: any non-empty value consents to the "
                                                   "form's notice (required when the form says so)."},
        **{ATTRIBUTION_PREFIX + key: {"type": "string", "maxLength": ATTRIBUTION_LENGTH,
                                      "description": f"attribution.{key}, as in JSON; the page copies utm_*, gclid "
                                                     "and fbclid from its own URL."}
           for key in AttributionSentSchema().fields},
    },
    "patternProperties": {"^" + re.escape(CUSTOM_PREFIX): {
        "type": "string", "description": "custom_fields.<name>: one input per custom field."}},
    "additionalProperties": False,
    "anyOf": [{"required": ["phone"], "properties": {"phone": NOT_BLANK}},
              {"required": ["email"], "properties": {"email": NOT_BLANK}}],
}
SUBMISSION_BODY = {
    "required": True,
    "content": {
        "application/json": {"schema": FormSubmissionSchema},
        "application/x-www-form-urlencoded": {"schema": FORM_FIELDS},
    },
}
SUBMISSION_PAGES = {
    "200": {"description": "Form-encoded: the thank-you page (whether the lead was new, a duplicate, or "
                           "dropped by the honeypot: it does not say which).", **HTML_PAGE},
    "422": {"description": "Not valid: a problem document for JSON; the form again with the errors "
                           "shown for form-encoded submissions.",
            "content": {PROBLEM_MIMETYPE: {"schema": {"$ref": "#/components/schemas/Problem"}},
                        **HTML_PAGE["content"]}},
}


FORM_ID = public_id_pattern("form_")


def find_form(form_id: str) -> Form:
    form = None
    if FORM_ID.match(form_id):   # anything else cannot exist, and is neither queried nor echoed
        form = Form.select(Form, Workspace).join(Workspace).where(Form.public_id == form_id).first()
    if form is None:
        raise NotFound("There is no form with this id.")
    # The sites that embed the form may frame its pages: the form, its errors, its thank-you page.
    allow_framing_by(filter(None, map(origin_of, form.allowed_origins or [])))
    return form


def origin_of(url: str | None) -> str | None:
    """scheme://host[:port] in lower case, without a default port; None if the URL has no origin."""
    try:
        parts = urlsplit((url or "").strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname:
        return None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}" + (f":{port}" if port and port != DEFAULT_PORTS[parts.scheme] else "")


def check_origin(form: Form) -> None:
    """403 unless the request comes from the service's own pages or one of the form's allowed origins."""
    origin, referer = request.headers.get("Origin"), request.headers.get("Referer")
    if origin is None and referer is None:
        return
    sent = origin_of(origin) if origin is not None else origin_of(referer)
    allowed = {origin_of(request.host_url)} | {origin_of(url) for url in form.allowed_origins or []}
    if sent is None or sent not in allowed:
        raise Forbidden("This form does not accept submissions from "
                        f"{sent or 'a page without an origin'}; add it to the form's allowed_origins.")


def from_form_fields(fields: MultiDict, definitions: Mapping[str, CustomField]) -> dict[str, Any]:
    """Form-encoded fields as a submission; empty inputs mean "not given"."""
    data: dict[str, Any] = {}
    custom: dict[str, Any] = {}
    attribution: dict[str, str] = {}
    for name, value in fields.items():
        if is_blank(value):
            continue
        if name.startswith(CUSTOM_PREFIX):
            key = name[len(CUSTOM_PREFIX):]
            custom[key] = form_value(trim(value), definitions.get(key))
        elif name.startswith(ATTRIBUTION_PREFIX):
            attribution[name[len(ATTRIBUTION_PREFIX):]] = value
        elif name == CONSENT:   # a ticked checkbox, whatever its value
            data[name] = True
        else:
            data[name] = value
    if custom:
        data["custom_fields"] = custom
    if attribution:
        data["attribution"] = attribution
    return data


def copied_attribution(values: Mapping[str, str]) -> dict[str, str]:
    """What a page carries in hidden inputs: the utm_* and click ids among these values (its URL's
    query, or a submission shown again), each only if a submission would take it, since a visitor
    cannot mend a hidden input."""
    copied: dict[str, str] = {}
    for key in PAGE_ATTRIBUTION:
        if key not in values:
            continue
        try:
            check_storable(values[key])
            copied.update(AttributionSentSchema().load({key: values[key]}))
        except (ma.ValidationError, ValidationFailed):
            continue
    return copied


def submission() -> tuple[Mapping[str, Any], bool]:
    """The submitted fields and whether they came form-encoded (from an HTML page), read by the
    API's own parser: the same 422s for bad JSON and for text no database can store."""
    if request.mimetype in FORM_TYPES:
        check_storable(request.form.to_dict(flat=False))
        return request.form, True
    if request.mimetype != "application/json":
        raise UnsupportedMediaType("Send the fields as JSON or form-encoded (application/x-www-form-urlencoded).")
    return blp.ARGUMENTS_PARSER.load_json(request, FormSubmissionSchema()), False


def accept_in_even_time(form: Form, data: Mapping[str, Any], refs: Refs) -> None:
    """accept(), answered no sooner than forms.answer_floor_ms after it began, whatever came of it
    (a new lead, a duplicate, the honeypot's drop or a refusal): an anonymous caller must not time
    which phones and e-mails are leads already. Every outcome waits for the same floor, so none
    is told by a fast tail of its own, as long as the work itself stays under the floor."""
    deadline = time.perf_counter() + settings()["forms"]["answer_floor_ms"] / 1000
    try:
        accept(form, data, refs)
    finally:
        while (wait := deadline - time.perf_counter()) > 0:
            time.sleep(wait)


def accept(form: Form, data: Mapping[str, Any], refs: Refs) -> pipeline.Created | None:
    """Create the lead a submission describes; None when the honeypot says a bot sent it."""
    if not is_blank(str(data.get(HONEYPOT) or "")):
        return None
    errors: dict[str, list[str]] = {}
    try:
        with phones_of(form.workspace):
            fields = FormSubmissionSchema().load(data)
    except ma.ValidationError as exc:
        fields, errors = {}, pipeline.item_failure(exc, "form")[1]
    if form.consent_required and data.get(CONSENT) is not True and CONSENT not in errors:
        errors[CONSENT] = ["Please agree to the privacy notice: this form cannot take your details without it."]
    if errors:
        raise ValidationFailed(errors=errors)
    fields.pop(HONEYPOT, None)
    if fields.pop(CONSENT, False):
        fields[CONSENT] = {"purpose": form.name, "notice_version": form.notice_version, "ip": client_ip()}
    fields["source"] = form.source.public_id if form.source_id else None
    actor = Actor(workspace=form.workspace, form=form, request_id=g.request_id)
    return pipeline.create_lead(fields, actor, refs)


def page(form: Form, refs: Refs, attribution: Mapping[str, str], *, values: Mapping[str, str] | None = None,
         errors: Mapping[str, list[str]] | None = None, status: int = 200) -> Response:
    fields = sorted(refs.custom_fields.values(), key=lambda f: (f.position, f.name))
    html = render_template("form.html", form=form, custom_fields=fields, values=values or {},
                           errors=errors or {}, honeypot=HONEYPOT, custom_prefix=CUSTOM_PREFIX,
                           attribution=copied_attribution(attribution), attribution_prefix=ATTRIBUTION_PREFIX,
                           action=url_for("forms.FormSubmissions", form_id=form.public_id))
    return Response(html, status=status, mimetype="text/html")


@blp.route("/forms/<form_id>")
class FormPage(MethodView):
    @blp.doc(operationId="getFormPage", security=[],
             responses={"200": {"description": "The form.", **HTML_PAGE}, "404": {"description": "No such form.", **HTML_PAGE}})
    @blp.alt_response(429, response="TOO_MANY_REQUESTS")
    def get(self, form_id):
        """The web form, as an HTML page that works without JavaScript"""
        try:
            form = find_form(form_id)
        except NotFound:
            return Response(render_template("form_missing.html"), status=404, mimetype="text/html")
        return page(form, cached_refs(form.workspace, settings()), request.args)


@blp.route("/api/v1/forms/<form_id>/submissions")
class FormSubmissions(MethodView):
    @blp.doc(operationId="submitForm", security=[], requestBody=SUBMISSION_BODY, responses=SUBMISSION_PAGES)
    @blp.response(201, FormReceiptSchema, description="JSON: the submission was taken (a new lead, a duplicate of "
                  "one, or dropped by the honeypot: the receipt does not say which).")
    @blp.alt_response(403, response="FORBIDDEN")
    @blp.alt_response(404, response="NOT_FOUND")
    @blp.alt_response(415, response="UNSUPPORTED_MEDIA_TYPE")
    @blp.alt_response(429, response="TOO_MANY_REQUESTS")
    def post(self, form_id):
        """Submit a web form: JSON answers JSON, form-encoded answers an HTML page"""
        form = find_form(form_id)
        check_origin(form)
        raw, from_page = submission()
        refs = cached_refs(form.workspace, settings())
        if not from_page:
            # The same receipt whether the lead was new, a duplicate or a bot's: an anonymous caller
            # must not learn which phones and e-mails are already leads.
            accept_in_even_time(form, raw, refs)
            return {"data": {"form": form.public_id, "message": THANKS}}
        fields = from_form_fields(raw, refs.custom_fields)
        try:
            accept_in_even_time(form, fields, refs)
        except ValidationFailed as exc:
            return page(form, refs, fields.get("attribution", {}), values=raw,
                        errors=pipeline.item_failure(exc, "form")[1], status=422)
        return Response(render_template("form_thanks.html", form=form, message=THANKS), mimetype="text/html")
