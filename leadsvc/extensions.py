"""The request parser every blueprint uses, and the lead id converter.

The flask-smorest Api itself is made per app in create_app: it keeps per-app state (the app and
its spec), so one module-level instance could not serve the several apps a test run builds.
"""

from __future__ import annotations

import json
import re
from typing import Any

import flask_smorest
import marshmallow as ma
from flask import Flask, Request, request
from werkzeug.routing import BaseConverter
from webargs import core
from webargs.flaskparser import FlaskParser, is_json_request

from .models import public_id_regex
from .problems import UnsupportedMediaType, ValidationFailed

_SURROGATE = re.compile("[\ud800-\udfff]")
JSON_TYPE_NAMES = {list: "an array", str: "a string", int: "a number", float: "a number",
                   bool: "a boolean", type(None): "null"}


class ApiParser(FlaskParser):
    """webargs' Flask parser, speaking the contract: 422 `errors.body` for bad JSON, 415 for non-JSON,
    422 for an unknown or repeated query parameter."""

    DEFAULT_UNKNOWN_BY_LOCATION = {
        **FlaskParser.DEFAULT_UNKNOWN_BY_LOCATION,
        "query": ma.RAISE,          # a misspelt parameter must not be silently ignored
        "querystring": ma.RAISE,
    }

    # webargs documents load_<location> as what a parser subclass implements; the body is read here.
    def load_json(self, req: Request, schema: ma.Schema):
        if not is_json_request(req):
            if req.content_length:
                raise UnsupportedMediaType("Send the body as JSON with Content-Type: application/json.")
            data = core.missing
        else:
            data = parse_json_body(req.get_data(cache=True))
        if data is core.missing and getattr(getattr(schema, "Meta", None), "body_optional", False):
            return {}   # every field is optional, and so is the body (documented with required=False)
        if data is core.missing or not isinstance(data, dict):
            # An empty body, or JSON that is not an object: say so instead of per-field "Missing data".
            what = "empty" if data is core.missing else JSON_TYPE_NAMES[type(data)]
            raise ValidationFailed.field("body", f"The request body must be a JSON object, not {what}.")
        # A batch checks its items one by one, so that one item's bad text fails that item alone.
        check_storable(data, skip=getattr(getattr(schema, "Meta", None), "checked_per_item", ()))
        return data

    def load_querystring(self, req: Request, schema: ma.Schema):
        # A parameter given twice would otherwise count once, silently: `status=a&status=b` reads
        # as `status=a`. Several values of a filter are comma-separated, in one parameter.
        repeated = {name: [f"Give {name} once; separate several values with commas."]
                    for name, values in req.args.lists() if len(values) > 1}
        if repeated:
            raise ValidationFailed(errors=repeated)
        return super().load_querystring(req, schema)

    def load_form(self, req: Request, schema: ma.Schema):
        check_storable({name: value for name, value in req.form.items(multi=True)})
        return super().load_form(req, schema)


def parse_json_body(body: bytes) -> Any:
    """The JSON in a request body (UTF-8), missing when it is empty, or a 422 about the body."""
    if not body:
        return core.missing
    try:
        return json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ValidationFailed.field("body", "The request body is not valid JSON.") from None
    except RecursionError:
        raise ValidationFailed.field("body", "The request body is nested too deeply.") from None
    except ValueError:
        # Python refuses integers of thousands of digits (int_max_str_digits).
        raise ValidationFailed.field("body", "The request body holds a number too long to read.") from None


def check_storable(data: Any, *, skip: tuple[str, ...] = ()) -> None:
    """422 naming each string no database can store: NUL characters (PostgreSQL refuses them,
    SQLite cuts strings at them) and lone UTF-16 surrogates (not UTF-8 at all). The values of the
    top-level keys in `skip` are left to the caller."""
    errors: dict[str, list[str]] = {}
    pending: list[tuple[Any, str]] = [(data, "")]
    while pending:   # iterative: the document may be nested as deep as the decoder allows
        value, where = pending.pop()
        if isinstance(value, str):
            if "\x00" in value or _SURROGATE.search(value):
                errors[where or "body"] = ["Text must not hold a NUL character or a lone UTF-16 surrogate "
                                           "(\\ud800-\\udfff): no database can store them."]
        elif isinstance(value, dict):
            for key, item in value.items():
                pending.append((key, where or "body"))
                if where or key not in skip:
                    pending.append((item, f"{where}.{key}" if where else str(key)))
        elif isinstance(value, list):
            pending.extend((item, f"{where}.{index}" if where else str(index)) for index, item in enumerate(value))
    if errors:
        raise ValidationFailed(errors=errors)


def body_limits(app: Flask) -> None:
    """A view whose class has `max_body(api_settings) -> bytes` takes bodies up to that size
    instead of api.max_body_bytes (a CSV file, a bulk change's ids): set before any hook reads the
    body, so register it first."""
    @app.before_request
    def _raise_the_limit() -> None:
        view = app.view_functions.get(request.endpoint) if request.endpoint else None
        max_body = getattr(getattr(view, "view_class", None), "max_body", None)
        if max_body is not None:
            request.max_content_length = max_body(app.config["LEADSVC"]["api"])


class Blueprint(flask_smorest.Blueprint):
    ARGUMENTS_PARSER = ApiParser()


class LeadIdConverter(BaseConverter):
    """`<lead_id:public_id>`: only lead-shaped ids match, so /leads/export.csv is never taken for one."""

    regex = public_id_regex("ld_")


class NoteIdConverter(BaseConverter):
    regex = public_id_regex("note_")


class WebhookIdConverter(BaseConverter):
    regex = public_id_regex("wh_")


class DeliveryIdConverter(BaseConverter):
    regex = public_id_regex("dlv_")


class TaskIdConverter(BaseConverter):
    regex = public_id_regex("task_")


class ConnectorIdConverter(BaseConverter):
    regex = public_id_regex("conn_")


class IntakeIdConverter(BaseConverter):
    regex = public_id_regex("in_")


class JobIdConverter(BaseConverter):
    regex = public_id_regex("job_")


class MemberIdConverter(BaseConverter):
    regex = public_id_regex("mem_")


class TokenIdConverter(BaseConverter):
    regex = public_id_regex("tok_")


class MergeIdConverter(BaseConverter):
    regex = public_id_regex("mrg_")


CONVERTERS = {"lead_id": LeadIdConverter, "note_id": NoteIdConverter, "webhook_id": WebhookIdConverter,
              "delivery_id": DeliveryIdConverter, "task_id": TaskIdConverter, "connector_id": ConnectorIdConverter,
              "intake_id": IntakeIdConverter, "job_id": JobIdConverter, "member_id": MemberIdConverter,
              "token_id": TokenIdConverter, "merge_id": MergeIdConverter}


def register_converters(app: Flask, api: flask_smorest.Api) -> None:
    for name, converter in CONVERTERS.items():
        app.url_map.converters[name] = converter
        api.register_converter(converter, lambda converter: {"type": "string", "pattern": f"^{converter.regex}$"})
