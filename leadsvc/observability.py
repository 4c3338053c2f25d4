"""Request ids: echoed when the client sent a sane one, generated otherwise, on every response."""

from __future__ import annotations

import re
import uuid

from flask import Flask, Response, g, request

REQUEST_ID_HEADER = "X-Request-ID"
_SANE_REQUEST_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@/+=-]{0,127}$")


def init_app(app: Flask) -> None:
    @app.before_request
    def assign_request_id() -> None:
        sent = request.headers.get(REQUEST_ID_HEADER, "")
        g.request_id = sent if _SANE_REQUEST_ID.match(sent) else uuid.uuid4().hex

    @app.after_request
    def echo_request_id(response: Response) -> Response:
        response.headers[REQUEST_ID_HEADER] = g.get("request_id") or uuid.uuid4().hex
        return response
