"""RFC 9457 problem documents: the only code that turns an error into a response."""

from __future__ import annotations

import logging
from typing import Any, Mapping

import flask_smorest
import marshmallow as ma
from flask import Flask, Response, current_app, g, request
from werkzeug.exceptions import HTTPException

from .config import settings
from .db import is_unavailable

log = logging.getLogger("leadsvc")

PROBLEM_MIMETYPE = "application/problem+json"
RETRY_AFTER_UNAVAILABLE = 5   # seconds a client waits before retrying a 503

# code -> (status, title, what it means): also the text of /docs/api/problems/<code>.
CODES: dict[str, tuple[int, str, str]] = {
    "unauthenticated": (401, "Authentication required",
                        "The request carries no bearer token, or the token is malformed, unknown, "
                        "expired or revoked. Send `Authorization: Bearer lsk_...` with a valid token."),
    "forbidden": (403, "Not allowed",
                  "The token is valid but lacks the ability this operation needs; `detail` names it. "
                  "Issue a token with that ability (agents can never hold leads:assign, "
                  "reports:read or audit:read; only admins hold webhooks:manage, privacy:manage, connectors:manage and members:manage)."),
    "not_found": (404, "Not found",
                  "No such route, or no such record in the caller's data scope. A record outside "
                  "the scope is reported exactly like one that does not exist."),
    "method_not_allowed": (405, "Method not allowed",
                           "The route exists but not with this HTTP method; the `Allow` header lists "
                           "the methods it takes."),
    "conflict": (409, "Conflict",
                 "The request clashes with the current state: a phone or e-mail that another lead "
                 "has, a duplicate outside the caller's scope, a stage move that the lead's "
                 "status does not allow (`detail` lists the allowed targets), or a request with the "
                 "same `Idempotency-Key` that is still running (retry after `Retry-After`)."),
    "precondition_failed": (412, "Precondition failed",
                            "The `If-Match` header does not match the lead's current `ETag`: someone "
                            "changed it since you read it. Read it again and retry."),
    "payload_too_large": (413, "Payload too large",
                          "The request body is larger than the service accepts (64 KiB by default)."),
    "unsupported_media_type": (415, "Unsupported media type",
                               "The body must be JSON, sent with `Content-Type: application/json` "
                               "(web-form submissions also take form encoding)."),
    "validation_failed": (422, "Validation failed",
                          "The input is not valid: `errors` maps each field (or `body`, or a query "
                          "parameter such as `page[size]`, or a header such as `Idempotency-Key`) to a "
                          "list of messages. Nothing was changed."),
    "rate_limited": (429, "Too many requests",
                     "The caller went over its rate limit, or asked for a CSV export while the "
                     "service was writing as many as it writes at once. Wait the number of seconds "
                     "in `Retry-After`; the `RateLimit-*` headers show the rate limit's budget."),
    "bad_request": (400, "Bad request",
                    "The request breaks HTTP in a way the service cannot take (for example headers "
                    "that are too large); `status` carries the precise 4xx code."),
    "internal_error": (500, "Internal error",
                       "Something failed inside the service. Nothing was half-written; quote the "
                       "`request_id` when you report it."),
    "not_implemented": (501, "Method not implemented",
                        "The request uses a method that HTTP does not define, so no route of the service "
                        "takes it. A method HTTP defines that a route does not take is "
                        "`method_not_allowed` (405)."),
    "service_unavailable": (503, "Service unavailable",
                            "The database is unreachable, busy past its timeout or out of "
                            "connections. Retry after `Retry-After` seconds with backoff."),
}
_CODE_BY_STATUS = {status: code for code, (status, _, _) in CODES.items()}

DEFAULT_DETAILS = {
    "unauthenticated": "A valid bearer token is required.",
    "not_found": "There is nothing at this address.",
    "method_not_allowed": "This route does not take that method.",
    "payload_too_large": "The request body is too large.",
    "unsupported_media_type": "Use Content-Type: application/json.",
    "validation_failed": "Some of the input is not valid; see errors.",
    "rate_limited": "Too many requests; slow down.",
    "bad_request": "The request could not be understood.",
    "internal_error": "The service failed to handle this request.",
    "not_implemented": "The service does not know this method.",
    "service_unavailable": "The database is not available right now; retry shortly.",
}


class Problem(Exception):
    """A domain error that becomes a problem document: raise it anywhere below a view."""

    status = 500
    code = "internal_error"

    def __init__(self, detail: str | None = None, *, errors: Mapping[str, list[str]] | None = None,
                 headers: Mapping[str, str] | None = None, members: Mapping[str, Any] | None = None):
        super().__init__(detail or self.code)
        self.detail = detail
        self.errors = dict(errors) if errors else None
        self.headers = dict(headers or {})
        self.members = dict(members or {})   # extension members of the document (RFC 9457 3.2), as merged_into


class Unauthenticated(Problem):
    status, code = 401, "unauthenticated"

    def __init__(self, detail: str | None = None):
        super().__init__(detail, headers={"WWW-Authenticate": 'Bearer realm="leadsvc"'})


class Forbidden(Problem):
    status, code = 403, "forbidden"


class NotFound(Problem):
    status, code = 404, "not_found"


class Conflict(Problem):
    status, code = 409, "conflict"


class PreconditionFailed(Problem):
    status, code = 412, "precondition_failed"


class UnsupportedMediaType(Problem):
    status, code = 415, "unsupported_media_type"


class ValidationFailed(Problem):
    status, code = 422, "validation_failed"

    @classmethod
    def field(cls, name: str, message: str) -> "ValidationFailed":
        return cls(errors={name: [message]})


class TooManyRequests(Problem):
    status, code = 429, "rate_limited"

    def __init__(self, detail: str, retry_after: int):
        super().__init__(detail, headers={"Retry-After": str(retry_after)})


class MethodNotImplemented(Problem):
    status, code = 501, "not_implemented"


class ServiceUnavailable(Problem):
    status, code = 503, "service_unavailable"

    def __init__(self, detail: str | None = None):
        super().__init__(detail, headers={"Retry-After": str(RETRY_AFTER_UNAVAILABLE)})


class ProblemSchema(ma.Schema):
    """An RFC 9457 problem document."""

    type = ma.fields.String(required=True, metadata={"description": "URL of the page that explains `code`."})
    title = ma.fields.String(required=True)
    status = ma.fields.Integer(required=True)
    detail = ma.fields.String(required=True)
    code = ma.fields.String(required=True, metadata={"enum": list(CODES),
                                                     "description": "Stable machine-readable code."})
    request_id = ma.fields.String(required=True)
    errors = ma.fields.Dict(keys=ma.fields.String(), values=ma.fields.List(ma.fields.String()),
                            metadata={"description": "Field -> messages, on validation failures."})
    merged_into = ma.fields.String(metadata={
        "description": "On a 404 for a lead that was merged: the lead it was merged into, when the caller sees it."})


def problem_type(code: str) -> str:
    """The configured docs, else a relative reference under the mount prefix: script_root comes
    from the WSGI mount, never from a header such as Host that a client sets."""
    base = settings()["api"]["docs_url"].rstrip("/") or request.script_root + "/docs"
    return f"{base}/api/problems/{code}"


def problem_response(status: int, code: str, detail: str | None = None, *,
                     errors: Mapping[str, list[str]] | None = None,
                     headers: Mapping[str, str] | None = None,
                     members: Mapping[str, Any] | None = None) -> Response:
    """The one place a problem document is built; `members` are its extension members."""
    body: dict[str, Any] = {
        "type": problem_type(code),
        "title": CODES[code][1],
        "status": status,
        "detail": detail or DEFAULT_DETAILS.get(code) or CODES[code][1] + ".",
        "code": code,
        "request_id": g.get("request_id", ""),
    }
    if errors:
        body["errors"] = dict(errors)
    body.update(members or {})
    response = current_app.json.response(body)   # the app's one JSON encoder
    response.status_code, response.mimetype = status, PROBLEM_MIMETYPE
    for name, value in (headers or {}).items():
        response.headers[name] = value
    return response


def flatten_messages(messages: Any, prefix: str = "") -> dict[str, list[str]]:
    """webargs/marshmallow nested messages -> {"contact.phone": [...]}; `_schema` (marshmallow's
    name for a schema's own errors, such as a nested object that is not one) becomes the field
    that holds the schema, or `body` at the top."""
    flat: dict[str, list[str]] = {}
    if isinstance(messages, Mapping):
        for key, value in messages.items():
            name = (prefix.rstrip(".") or "body") if key == "_schema" else f"{prefix}{key}"
            if isinstance(value, Mapping):
                flat.update(flatten_messages(value, name + "."))
            else:
                flat.setdefault(name, []).extend(value if isinstance(value, list) else [str(value)])
    elif messages:
        flat[prefix.rstrip(".") or "body"] = messages if isinstance(messages, list) else [str(messages)]
    return flat


class ProblemApi(flask_smorest.Api):
    """flask-smorest's Api with its HTTP errors rendered as problem documents."""

    # Documented with ErrorHandlerMixin.ERROR_SCHEMA ("Should match payload structure in handle_http_exception").
    ERROR_SCHEMA = ProblemSchema

    # Documented in flask-smorest's API reference (Api.handle_http_exception), the handler of every HTTPException.
    def handle_http_exception(self, err: HTTPException) -> Response:
        data = getattr(err, "data", None) or {}
        headers = {k: v for k, v in err.get_headers() if k.lower() != "content-type"}
        headers.update(data.get("headers") or {})
        messages = data.get("errors") or data.get("messages")
        errors = None
        if isinstance(messages, Mapping):
            # webargs groups messages by location ({"json": {...}, "query": {...}}).
            errors = {}
            for location_messages in messages.values():
                errors.update(flatten_messages(location_messages))
        status = err.code or 500
        if status == 400:   # malformed input, from werkzeug or webargs: the contract says 422
            status = 422
            # A 422 always says where: werkzeug's own 400s (request.get_json() on a bad body, a bad
            # form) carry no field, so they are about the body.
            errors = errors or {"body": ["The request body could not be understood."]}
        code = data.get("code") or _CODE_BY_STATUS.get(status) or (
            "bad_request" if status < 500 else "internal_error")
        return problem_response(status, code, data.get("message"), errors=errors, headers=headers)


def handle_problem(err: Problem) -> Response:
    return problem_response(err.status, err.code, err.detail, errors=err.errors, headers=err.headers,
                            members=err.members)


def handle_unexpected(err: Exception) -> Response:
    request_id = g.get("request_id")
    if is_unavailable(err):
        log.warning("request %s: database unavailable: %s", request_id, err, extra={"request_id": request_id})
        return handle_problem(ServiceUnavailable())
    log.exception("request %s failed", request_id, extra={"request_id": request_id})
    return problem_response(500, "internal_error")


def init_app(app: Flask) -> None:
    """Domain errors and unexpected ones become problem documents too (the Api handles HTTP errors)."""
    app.register_error_handler(Problem, handle_problem)
    app.register_error_handler(Exception, handle_unexpected)
