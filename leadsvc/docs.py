"""The /docs pages: Swagger UI on the service's OpenAPI document, its assets served from a Python
package, and one page per problem code."""

from __future__ import annotations

import mimetypes
import re
from importlib import resources

from flask import Blueprint, Response, abort, current_app, redirect, render_template, url_for
from markupsafe import Markup, escape

from .problems import CODES

blp = Blueprint("docs", __name__, url_prefix="/docs")
home = Blueprint("home", __name__)

UI_BUNDLES = resources.files("openapi_ui_bundles")
# Only what our Swagger UI page loads: the package also holds a demo index.html that points at an
# external petstore spec, and its Python sources.
SWAGGER_UI_FOLDER = ("swagger_ui", "vendor")
ASSET_SUFFIXES = (".css", ".js", ".png")
# Relative, so the assets resolve under whatever prefix the app is mounted at.
SWAGGER_UI_URL = "docs/assets/swagger_ui/vendor/"
# Keep the token across reloads; fetch no badge from validator.swagger.io.
SWAGGER_UI_CONFIG = {"persistAuthorization": True, "validatorUrl": None, "deepLinking": True, "tryItOutEnabled": True}


@blp.app_template_filter("codify")
def codify(text: str) -> Markup:
    """`backticks` in the problem texts become <code>."""
    return Markup(re.sub(r"`([^`]+)`", r"<code>\1</code>", str(escape(text))))


@blp.get("")
def swagger_ui() -> str:
    """Swagger UI, reading the document this service serves."""
    return render_template("swagger_ui.html", title=current_app.config["API_TITLE"],
                           spec_url=url_for("openapi.served_openapi_json"), swagger_ui_url=SWAGGER_UI_URL,
                           swagger_ui_config=SWAGGER_UI_CONFIG)


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


@home.get("/")
def root() -> Response:
    """Nothing lives at the root: a person who opens it wants the docs."""
    return redirect(url_for("docs.swagger_ui"))
