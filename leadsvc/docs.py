"""The /docs pages: Swagger UI assets served from a Python package, and one page per problem code."""

from __future__ import annotations

import copy
import json
import mimetypes
import re
from importlib import resources

from flask import Blueprint, Flask, Response, abort, current_app, redirect, render_template, request, url_for
from markupsafe import Markup, escape

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


def openapi_document(app: Flask) -> dict:
    """The OpenAPI document: the one place it is produced, for the CLI and for /api/v1/openapi.json."""
    # A copy: APISpec.to_dict() merges the document into the spec options it keeps and returns
    # them, so changing what it returns would change every later document.
    return document_problems(copy.deepcopy(app.extensions["leadsvc.api"].spec.to_dict()))


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
