"""The published OpenAPI document: every plugin and step that shapes it, and the route that serves it."""

from __future__ import annotations

import copy
import http
import json
import re
from typing import Any

from apispec import BasePlugin
from flask import Blueprint, Flask, Response, current_app, request

from .extensions import CONVERTERS
from .idempotency import HEADER, REPLAYED_HEADER, UNRECORDED_STATUSES
from .problems import PROBLEM_MIMETYPE, ProblemApi

blp = Blueprint("openapi", __name__)

API_DESCRIPTION = """\
The lead pipeline of one workspace: list, create, read, update and move leads through
pipeline stages. Every request outside the probes, the docs and web forms carries
`Authorization: Bearer lsk_...`; errors are RFC 9457 problem documents whose `code` is
explained at `/docs/api/problems/<code>`."""


def init_app(app: Flask, version: str) -> ProblemApi:
    """The app's flask-smorest Api, with the plugins that shape its document, and the route serving it."""
    app.config.update(
        API_TITLE="leadsvc",
        API_VERSION=version,
        OPENAPI_VERSION="3.1.0",
        API_SPEC_OPTIONS={
            "info": {"description": API_DESCRIPTION, "license": {"name": "MIT", "identifier": "MIT"}},
            # Relative: requests go to the host that served the document. Under a mount prefix the
            # served document names the prefix instead (served_openapi_json).
            "servers": [{"url": "/"}],
            "components": {"securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"}}},
            "security": [{"bearerAuth": []}],
        },
    )
    # No OPENAPI_URL_PREFIX: flask-smorest then registers no docs routes of its own. The document
    # is served here, after the steps below; Swagger UI is a page of docs.py.
    api = ProblemApi(app, spec_kwargs={"extra_plugins": [
        IdempotencySpecPlugin(), SchemaKeywordsPlugin(), ConditionalRequestsPlugin(), NotFoundPlugin(),
        OperationIdsPlugin()]})   # last: the id follows what the others add
    app.extensions["leadsvc.api"] = api
    app.register_blueprint(blp)
    return api


# --- plugins: what each operation's decorators leave unsaid ----------------------------------

INTAKE_PATHS = "/api/v1/intake/"


class IdempotencySpecPlugin(BasePlugin):
    """Documents the Idempotency-Key header, and the 409 and 422 it can cause, on every POST."""

    def init_spec(self, spec) -> None:
        spec.components.parameter("IdempotencyKey", "header", {
            "name": HEADER, "required": False,
            "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": r"^[\x21-\x7e]+$"},
            "description": "Makes the POST safe to retry for 24 hours: a retry with the same key and body "
                           "gets the first response again (with `Idempotent-Replayed: true`); the same key "
                           "with another body is 422; a retry while the first is still running waits for "
                           "it (409, or 503 on SQLite, if that takes too long; a batch's retry is 409 at once). 2xx and 4xx answers are kept, except 401, "
                           "403 and 429; a 5xx keeps nothing and changes nothing (a batch keeps the items it "
                           "created before it). Keys belong to the "
                           "token that sent them (to the client IP without a token).",
        })

    def operation_helper(self, path=None, operations=None, **kwargs) -> None:
        post = (operations or {}).get("post")
        # A sender's POST is taken once per the sender's own id (intake/): no key there.
        if post is None or (path or "").startswith(INTAKE_PATHS):
            return
        post.setdefault("parameters", []).append("IdempotencyKey")
        responses = post.setdefault("responses", {})
        for status, name in ((409, "CONFLICT"), (422, "UNPROCESSABLE_ENTITY")):
            if not any(str(code) == str(status) for code in responses):
                responses[status] = name


class SchemaKeywordsPlugin(BasePlugin):
    """apispec documents fields; a rule across fields, such as "a phone or an e-mail", is declared
    as JSON Schema in the marshmallow schema's `Meta.json_schema` and added to its component."""

    def schema_helper(self, name, definition, **kwargs):
        schema = kwargs.get("schema")
        meta = getattr(schema if isinstance(schema, type) else type(schema), "Meta", None)
        return dict(getattr(meta, "json_schema", {}))


IF_MATCH = {"name": "If-Match", "in": "header", "required": False, "schema": {"type": "string"},
            "description": "The ETag you read; 412 if the lead changed since."}
IF_NONE_MATCH = {"name": "If-None-Match", "in": "header", "required": False, "schema": {"type": "string"},
                 "description": "The ETag you read; 304 if the lead has not changed since (not with include)."}


class ConditionalRequestsPlugin(BasePlugin):
    """Documents If-Match on every operation that can answer 412 and If-None-Match on every one
    that can answer 304: each status is that header's answer."""

    def operation_helper(self, path=None, operations=None, **kwargs) -> None:
        for operation in (operations or {}).values():
            statuses = {str(status) for status in operation.get("responses", {})}
            for status, header in (("412", IF_MATCH), ("304", IF_NONE_MATCH)):
                if status in statuses:
                    operation.setdefault("parameters", []).append(header)


# A route argument that is a public id (a lead, a note, a webhook, a delivery): `<lead_id:public_id>`.
PUBLIC_ID_IN_RULE = re.compile(r"<(?:%s):\w+>" % "|".join(map(re.escape, CONVERTERS)))


class NotFoundPlugin(BasePlugin):
    """Documents 404 on every operation whose path names a record by its public id: the record may
    not exist, or lie outside the caller's scope, which answers the same."""

    def operation_helper(self, path=None, operations=None, rule=None, **kwargs) -> None:
        if rule is None or not PUBLIC_ID_IN_RULE.search(rule.rule):
            return
        for operation in (operations or {}).values():
            responses = operation.get("responses", {})
            if any(str(status) == "404" for status in responses):
                continue
            # Among the operation's error answers, before its first success (or 304).
            listed: dict[Any, Any] = {}
            for status, response in responses.items():
                if 404 not in listed and str(status).isdigit() and int(status) < 400:
                    listed[404] = "NOT_FOUND"
                listed[status] = response
            listed.setdefault(404, "NOT_FOUND")
            operation["responses"] = listed


class OperationIdsPlugin(BasePlugin):
    """Every operation names its operationId (the name client generators give the method that
    calls it) beside its view, with flask-smorest's `@blp.doc(operationId=...)`; an operation
    without one is a startup error rather than a generated name in the published contract."""

    def operation_helper(self, path=None, operations=None, **kwargs) -> None:
        for method, operation in (operations or {}).items():
            if "operationId" not in operation:
                raise ValueError(f"{method.upper()} {path} has no operationId: "
                                 "name it with @blp.doc(operationId=...) on the view.")
            # Listed last, after the parameters and responses the other plugins add.
            operation["operationId"] = operation.pop("operationId")


# --- the finished document -------------------------------------------------------------------

def openapi_document(app: Flask) -> dict:
    """The OpenAPI document: the one place it is produced, for the CLI and for /api/v1/openapi.json."""
    # A copy: APISpec.to_dict() merges the document into the spec options it keeps and returns
    # them, so changing what it returns would change every later document.
    spec = document_problems(copy.deepcopy(app.extensions["leadsvc.api"].spec.to_dict()))
    document_replays(spec)
    return without_unused_components(spec)


def _integer_header(description: str) -> dict[str, Any]:
    return {"description": description, "schema": {"type": "integer", "minimum": 0}}


# Headers that come with some problems, for the OpenAPI document.
RESPONSE_HEADERS: dict[int, dict[str, Any]] = {
    429: {"Retry-After": _integer_header("Seconds until the rate limit resets."),
          "RateLimit-Limit": _integer_header("Requests allowed in the window."),
          "RateLimit-Remaining": _integer_header("Requests left in the window."),
          "RateLimit-Reset": _integer_header("Seconds until the window resets.")},
    503: {"Retry-After": _integer_header("Seconds to wait before retrying.")},
}


def document_problems(spec: dict[str, Any]) -> dict[str, Any]:
    """The OpenAPI document (APISpec.to_dict()) with its error responses as problem documents.

    flask-smorest registers a response component per HTTP status with ERROR_SCHEMA in its
    default response content type, application/json; the document says what the service sends,
    application/problem+json, and names the headers that come with a 429 or a 503."""
    components = spec.get("components", {})
    if "responses" in components:
        spec["components"] = {**components, "responses": {
            name: _as_problem(name, response) for name, response in components["responses"].items()}}
    return spec


_PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}


def _as_problem(name: str, response: dict[str, Any]) -> dict[str, Any]:
    content = response.get("content", {})
    if [media.get("schema") for media in content.values()] != [_PROBLEM_REF]:
        return response
    problem = {key: value for key, value in response.items() if key != "content"}
    status = http.HTTPStatus.__members__.get(name)
    if status in RESPONSE_HEADERS:
        problem["headers"] = RESPONSE_HEADERS[status]
    problem["content"] = {PROBLEM_MIMETYPE: next(iter(content.values()))}
    return problem


REPLAYED_DOC = {
    "description": "`true` when this is the recorded answer to an earlier request with the same "
                   "Idempotency-Key, replayed; absent otherwise.",
    "schema": {"type": "string", "enum": ["true"]},
}


def document_replays(spec: dict[str, Any]) -> None:
    """Name the Idempotent-Replayed header on every answer of a POST that a retry can replay: all
    but 401, 403, 429 and 5xx (`default` included: it stands for 4xx codes such as 413 too).

    A response that is a shared component (one problem response serves GETs as well) becomes the
    POST's own copy of it with the header."""
    components = spec.setdefault("components", {})
    components.setdefault("headers", {})[REPLAYED_HEADER] = REPLAYED_DOC
    header = {"$ref": f"#/components/headers/{REPLAYED_HEADER}"}
    shared = components.get("responses", {})
    for item in spec.get("paths", {}).values():
        responses = item.get("post", {}).get("responses", {})
        for status, response in responses.items():
            if status[0] == "5" or status.isdigit() and int(status) in UNRECORDED_STATUSES:
                continue
            if "$ref" in response:
                response = copy.deepcopy(shared[response["$ref"].rsplit("/", 1)[1]])
            response["headers"] = {**response.get("headers", {}), REPLAYED_HEADER: header}
            responses[status] = response


def without_unused_components(spec: dict) -> dict:
    """The document without the components nothing refers to: flask-smorest registers some for
    every app (its pagination metadata), and problem responses that every POST now spells out
    with its replay header may have no other user."""
    components = spec.get("components", {})
    used = set(_references({key: value for key, value in spec.items() if key != "components"}))
    pending = list(used)
    while pending:   # what the used components refer to is used too
        kind, name = pending.pop()
        for found in _references(components.get(kind, {}).get(name)):
            if found not in used:
                used.add(found)
                pending.append(found)
    for kind, members in components.items():
        if kind != "securitySchemes":   # named in `security`, never by $ref
            components[kind] = {name: value for name, value in members.items() if (kind, name) in used}
    return spec


def _references(value) -> list[tuple[str, str]]:
    """(kind, name) of each "#/components/<kind>/<name>" reference in a part of the document."""
    found, pending = [], [value]
    while pending:
        value = pending.pop()
        if isinstance(value, dict):
            ref = value.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/components/"):
                kind, name = ref.removeprefix("#/components/").split("/", 1)
                found.append((kind, name))
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
    return found


def openapi_json(app: Flask) -> str:
    """The OpenAPI document as published in schemas/openapi.json: indented, so that a change to the
    contract reads as a diff (the service answers it through the app's one JSON encoder)."""
    return json.dumps(openapi_document(app), indent=2, ensure_ascii=False) + "\n"


@blp.get("/api/v1/openapi.json")
def served_openapi_json() -> Response:
    """/api/v1/openapi.json: under a mount prefix its `servers` names the prefix, so Swagger UI's
    "Try it out" calls reach the service instead of the host app's root."""
    spec = openapi_document(current_app)
    if request.script_root:
        spec["servers"] = [{"url": request.script_root}]
    return current_app.json.response(spec)
