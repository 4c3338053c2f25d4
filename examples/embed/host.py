"""A host Flask site with the lead API mounted under /crm.

The site keeps its own pages, its own 404 page and its own logging: leadsvc installs no log
handlers, and its `leadsvc` logger (access lines included) propagates to the host's root handler.
Errors under /crm are leadsvc's problem documents; everywhere else they are the host's pages.

    python examples/embed/host.py            # migrates, then serves on http://127.0.0.1:5000
"""

from __future__ import annotations

import logging
import os

from flask import Flask

from leadsvc import LeadService

PAGE = "<!doctype html><title>{title}</title><h1>{title}</h1><p>{body}</p>"


def create_host_app(leadsvc_config: dict | None = None) -> Flask:
    """The host site; leadsvc_config overrides leadsvc's settings (config.toml/LEADSVC_* otherwise)."""
    app = Flask(__name__)

    @app.get("/")
    def home():
        return PAGE.format(title="Acme Realty", body='Our CRM API lives at <a href="/crm/docs">/crm/docs</a>.')

    @app.errorhandler(404)
    def not_found(error):
        return PAGE.format(title="Page not found", body="Try the home page."), 404

    LeadService(app, url_prefix="/crm", config=leadsvc_config)
    return app


if __name__ == "__main__":
    from waitress import serve

    from leadsvc.db import migrate

    # The host owns logging: one format for its own lines and leadsvc's access lines.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    app = create_host_app()
    migrate()   # or run `leadsvc migrate` once before starting the site
    serve(app, host="127.0.0.1", port=int(os.environ.get("PORT", "5000")))
