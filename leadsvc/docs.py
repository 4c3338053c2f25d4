"""The /docs pages: Swagger UI assets served from a Python package, and one page per problem code."""

from __future__ import annotations

import copy
import json
import mimetypes
import re
from importlib import resources

from flask import Blueprint, Flask, Response, abort, current_app, redirect, render_template, request, url_for
from markupsafe import Markup, escape

from .idempotency import document_replays
from .problems import CODES, document_problems

blp = Blueprint("docs", __name__, url_prefix="/docs")
home = Blueprint("home", __name__)

UI_BUNDLES = resources.files("openapi_ui_bundles")
# Only what our Swagger UI page loads: the package also holds a demo index.html that points at an
# external petstore spec, and its Python sources.
SWAGGER_UI_FOLDER = ("swagger_ui", "vendor")
ASSET_SUFFIXES = (".css", ".js", ".png")


@blp.app_template_filter("codify")
def codify(text: str) -> Markup:
    """`backticks` in the problem texts become <code>."""
    return Markup(re.sub(r"`([^`]+)`", r"<code>\1</code>", str(escape(text))))


@blp.get("/assets/<path:path>")
def asset(path: str) -> Response:
    """Swagger UI's files, read through importlib.resources so they also load from a .pyz."""
    parts = path.split("/")
    if (tuple(parts[:-1]) != SWAGGER_UI_FOLDER or parts[-1] in ("", ".", "..")
            or not parts[-1].endswith(ASSET_SUFFIXES)):
        abort(404)
    item = UI_BUNDLES.joinpath(*parts)
    if not item.is_file():
        abort(404)
    mimetype = mimetypes.guess_type(path)[0] or "application/octet-stream"
    response = Response(item.read_bytes(), mimetype=mimetype)
    response.cache_control.public = True
    response.cache_control.max_age = 86400
    return response


@blp.get("/api/problems/")
def problems() -> str:
    """Every problem code the API can answer with."""
    return render_template("problems.html", codes=CODES)


@blp.get("/api/problems/<code>")
def problem(code: str) -> str:
    """What one problem code means and what to do about it."""
    if code not in CODES:
        abort(404)
    status, title, meaning = CODES[code]
    return render_template("problem.html", code=code, status=status, title=title, meaning=meaning)


# Each operation's operationId: the name client generators give the method that calls it.
OPERATION_IDS = {
    ("get", "/healthz"): "checkHealth",
    ("get", "/readyz"): "checkReadiness",
    ("get", "/api/v1/leads"): "listLeads",
    ("post", "/api/v1/leads"): "createLead",
    ("post", "/api/v1/leads/batch"): "createLeadsBatch",
    ("get", "/api/v1/leads/export.csv"): "exportLeads",
    ("get", "/api/v1/leads/{public_id}"): "getLead",
    ("patch", "/api/v1/leads/{public_id}"): "updateLead",
    ("post", "/api/v1/leads/{public_id}/status"): "moveLeadStatus",
    ("post", "/api/v1/leads/{public_id}/notes"): "addLeadNote",
    ("get", "/api/v1/leads/{public_id}/notes"): "listLeadNotes",
    ("patch", "/api/v1/notes/{public_id}"): "updateNote",
    ("delete", "/api/v1/notes/{public_id}"): "deleteNote",
    ("post", "/api/v1/leads/{public_id}/activities"): "logLeadActivity",
    ("get", "/api/v1/leads/{public_id}/transitions"): "listLeadTransitions",
    ("get", "/api/v1/leads/{public_id}/audit"): "listLeadAuditEntries",
    ("post", "/api/v1/leads/{public_id}/erase"): "eraseLead",
    ("post", "/api/v1/leads/{public_id}/consent/withdraw"): "withdrawLeadConsent",
    ("post", "/api/v1/privacy/erasures"): "erasePerson",
    ("get", "/api/v1/privacy/subject"): "getDataSubject",
    ("get", "/api/v1/reports/funnel"): "getFunnelReport",
    ("get", "/api/v1/reports/velocity"): "getVelocityReport",
    ("get", "/api/v1/reports/conversion"): "getConversionReport",
    ("get", "/api/v1/statuses"): "listStatuses",
    ("get", "/api/v1/sources"): "listSources",
    ("get", "/api/v1/members"): "listMembers",
    ("get", "/api/v1/teams"): "listTeams",
    ("get", "/api/v1/custom-fields"): "listCustomFields",
    ("get", "/api/v1/lost-reasons"): "listLostReasons",
    ("get", "/api/v1/forms"): "listForms",
    ("get", "/forms/{form_id}"): "getFormPage",
    ("post", "/api/v1/forms/{form_id}/submissions"): "submitForm",
    ("get", "/api/v1/webhooks"): "listWebhooks",
    ("post", "/api/v1/webhooks"): "createWebhook",
    ("get", "/api/v1/webhooks/{public_id}"): "getWebhook",
    ("patch", "/api/v1/webhooks/{public_id}"): "updateWebhook",
    ("delete", "/api/v1/webhooks/{public_id}"): "deleteWebhook",
    ("post", "/api/v1/webhooks/{public_id}/rotate-secret"): "rotateWebhookSecret",
    ("post", "/api/v1/webhooks/{public_id}/test"): "testWebhook",
    ("get", "/api/v1/webhooks/{public_id}/deliveries"): "listWebhookDeliveries",
    ("post", "/api/v1/webhooks/{public_id}/deliveries/{delivery_id}/replay"): "replayWebhookDelivery",
}


def openapi_document(app: Flask) -> dict:
    """The OpenAPI document: the one place it is produced, for the CLI and for /api/v1/openapi.json."""
    # A copy: APISpec.to_dict() merges the document into the spec options it keeps and returns
    # them, so changing what it returns would change every later document.
    spec = document_problems(copy.deepcopy(app.extensions["leadsvc.api"].spec.to_dict()))
    document_replays(spec)
    for (method, path), name in OPERATION_IDS.items():
        spec["paths"][path][method]["operationId"] = name
    return without_unused_components(spec)


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
    """The OpenAPI document as published in schemas/openapi.json."""
    return json.dumps(openapi_document(app), indent=2, ensure_ascii=False) + "\n"


def served_openapi_json() -> Response:
    """/api/v1/openapi.json: under a mount prefix its `servers` names the prefix, so Swagger UI's
    "Try it out" calls reach the service instead of the host app's root."""
    spec = openapi_document(current_app)
    if request.script_root:
        spec["servers"] = [{"url": request.script_root}]
    return Response(json.dumps(spec, indent=2, ensure_ascii=False), mimetype="application/json")


@home.get("/")
def root() -> Response:
    """Nothing lives at the root: a person who opens it wants the docs."""
    return redirect(url_for("api-docs.openapi_swagger_ui"))
