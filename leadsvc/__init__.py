"""leadsvc: a lead pipeline service. `create_app()` builds it; `LeadService` mounts it into a host app."""

from __future__ import annotations

from typing import Any, Mapping

from flask import Flask
from flask_limiter import ExemptionScope
from jinja2 import PackageLoader
from werkzeug.middleware.dispatcher import DispatcherMiddleware

from . import (bulk, connectors, db, docs, export, forms, headers, health, idempotency, jobs, jsoncodec, leads, limits,
               members, merge, metrics, observability, openapi, privacy, problems, reference, reports, tasks, timeline,
               webhooks)
from .config import load_settings
from .extensions import body_limits, register_converters
from .intake import endpoints as intake_endpoints

__version__ = "0.1.0"


def create_app(config: Mapping[str, Mapping[str, Any]] | None = None, *,
               config_file: str | None = None) -> Flask:
    """The WSGI app: settings from config_file/LEADSVC_CONFIG/./config.toml, the environment, then config."""
    settings = load_settings(config_file, overrides=config)
    app = Flask("leadsvc")
    app.config.update(
        LEADSVC=settings,
        MAX_CONTENT_LENGTH=settings["api"]["max_body_bytes"],
    )
    app.json = jsoncodec.JSONProvider(app)   # keeps keys in the order schemas and documents give them
    # A package loader, not the filesystem: templates must also load from inside leadsvc.pyz.
    app.jinja_loader = PackageLoader("leadsvc", "templates")
    db.init_app(app)
    body_limits(app)   # first: every other hook that reads the body meets the view's own limit
    observability.init_app(app)
    headers.init_app(app)
    metrics.init_app(app)
    api = openapi.init_app(app, __version__)
    problems.init_app(app)
    register_converters(app, api)
    for blueprint in (health.blp, export.blp, leads.blp, timeline.blp, tasks.blp, privacy.blp, reports.blp,
                      reference.blp, members.blp, forms.blp, webhooks.blp, connectors.blp, intake_endpoints.blp,
                      merge.blp, jobs.blp, bulk.blp):
        api.register_blueprint(blueprint)
    app.register_blueprint(docs.blp)
    app.register_blueprint(docs.home)
    limiter = limits.init_app(app, exempt=(health.blp, docs.blp, docs.home, openapi.blp, metrics.blp))
    # Web-form submissions also count per client IP against their own, lower limit.
    limiter.limit(limits.form_limit, key_func=limits.client_ip, methods=["POST"])(forms.blp)
    # A sender's requests count against its connector alone: a sender posts from many addresses,
    # and a stranger hammering one connector must not use up another's budget.
    limiter.exempt(intake_endpoints.blp, flags=ExemptionScope.APPLICATION)
    limiter.limit(limits.intake_limit, key_func=limits.connector_key)(intake_endpoints.blp)
    idempotency.init_app(app)   # after the limiter: a 429 never reserves a key
    return app


class LeadService:
    """The API mounted into a host Flask app under a prefix.

    The service runs as its own Flask app behind the prefix (a WSGI dispatcher), so its error
    handlers, hooks and config never touch the host's pages, and the host's never touch it.
    """

    def __init__(self, app: Flask | None = None, *, url_prefix: str = "/leads",
                 config: Mapping[str, Mapping[str, Any]] | None = None, config_file: str | None = None):
        self.url_prefix = "/" + url_prefix.strip("/")
        self.config = config
        self.config_file = config_file
        self.app: Flask | None = None
        if app is not None:
            self.init_app(app)

    def init_app(self, host: Flask) -> None:
        if self.url_prefix == "/":
            raise ValueError("Mount the service under a prefix such as /crm.")
        self.app = create_app(self.config, config_file=self.config_file)
        host.wsgi_app = DispatcherMiddleware(host.wsgi_app, {self.url_prefix: self.app})
        host.extensions["leadsvc"] = self
