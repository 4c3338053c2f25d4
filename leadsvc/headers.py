"""Headers every answer carries: no content sniffing, and no framing but a web form's by its sites.

Pages (the docs, problem pages, forms) are what a hostile site would frame to trick a click, and
JSON loses nothing by the same headers, so one rule covers every answer. A form's pages (the
form, its errors, its thank-you page) may be framed by the form's allowed origins, the sites it
is embedded in; a view says so with `allow_framing_by`.
"""

from __future__ import annotations

from typing import Iterable

from flask import Flask, Response, g


def allow_framing_by(origins: Iterable[str]) -> None:
    """Let these origins (scheme://host[:port]) frame the answer to this request."""
    g.framing_origins = sorted(set(origins))


def init_app(app: Flask) -> None:
    @app.after_request
    def protect(response: Response) -> Response:
        headers = response.headers
        headers["X-Content-Type-Options"] = "nosniff"
        origins = g.get("framing_origins")
        if origins:
            # X-Frame-Options cannot name several origins; browsers that know CSP ignore it anyway.
            headers["Content-Security-Policy"] = "frame-ancestors " + " ".join(origins)
        else:
            headers["Content-Security-Policy"] = "frame-ancestors 'none'"
            headers["X-Frame-Options"] = "DENY"
        return response
