"""The request parser every blueprint uses, and the unbound rate limiter.

The flask-smorest Api itself is made per app in create_app: it keeps per-app state (the app and
its spec), so one module-level instance could not serve the several apps a test run builds.
"""

from __future__ import annotations

from typing import Any

import flask_smorest
import marshmallow as ma
from flask import Request
from webargs import core
from webargs.flaskparser import FlaskParser, is_json_request

from .problems import UnsupportedMediaType, ValidationFailed

JSON_TYPE_NAMES = {list: "an array", str: "a string", int: "a number", float: "a number",
                   bool: "a boolean", type(None): "null"}


def holds_unstorable_text(data: Any) -> bool:
    """Whether a key or string in decoded JSON holds NUL or a lone surrogate: valid JSON escapes,
    but PostgreSQL refuses NUL and UTF-8 cannot encode a lone surrogate, so they would fail as 500s."""
    pending = [data]
    while pending:   # iterative: the document may be nested as deep as the decoder allows
        item = pending.pop()
        if isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
        elif isinstance(item, str):
            if "\x00" in item:
                return True
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
    return False


class ApiParser(FlaskParser):
    """webargs' Flask parser, speaking the contract: 422 `errors.body` for bad JSON, 415 for non-JSON."""

    DEFAULT_UNKNOWN_BY_LOCATION = {
        **FlaskParser.DEFAULT_UNKNOWN_BY_LOCATION,
        "query": ma.RAISE,          # a misspelt parameter must not be silently ignored
        "querystring": ma.RAISE,
    }

    def _handle_invalid_json_error(self, error, req: Request, *args, **kwargs):
        raise ValidationFailed.field("body", "The request body is not valid JSON.")

    def _raw_load_json(self, req: Request):
        if req.content_length and not is_json_request(req):
            raise UnsupportedMediaType("Send the body as JSON with Content-Type: application/json.")
        try:
            data = super()._raw_load_json(req)
        except RecursionError:   # valid JSON nested deeper than the decoder goes
            raise ValidationFailed.field("body", "The request body is nested too deeply.") from None
        if data is not core.missing and holds_unstorable_text(data):
            raise ValidationFailed.field("body", "The request body holds a NUL character or a lone UTF-16 "
                                                 "surrogate (\\ud800-\\udfff), which cannot be stored.")
        return data

    def load_json(self, req: Request, schema: ma.Schema):
        data = super().load_json(req, schema)
        if data is core.missing or not isinstance(data, dict):
            # An empty body, or JSON that is not an object: say so instead of per-field "Missing data".
            what = "empty" if data is core.missing else JSON_TYPE_NAMES[type(data)]
            raise ValidationFailed.field("body", f"The request body must be a JSON object, not {what}.")
        return data


class Blueprint(flask_smorest.Blueprint):
    ARGUMENTS_PARSER = ApiParser()
