"""Rate limits and request-size limits: what a single client may send, and how often.

Rate limits count per token across all routes for a valid token, per client IP otherwise, per
client IP for web-form submissions (`form_limit`), and per connector, alone, for what senders post
to a connector (`intake_limit`). A Limiter is made per app (like the Api):
flask-limiter keeps its storage and exemptions on the instance, and a test run builds apps with
different limits side by side.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Iterable

from flask import Blueprint, Flask, Response, request
from flask_limiter import Limiter
from werkzeug.exceptions import RequestHeaderFieldsTooLarge

from .auth import current_caller
from .config import settings
from .observability import HTTP_METHODS
from .problems import MethodNotImplemented

log = logging.getLogger("leadsvc")

# All request headers together (names and values). A bearer token and the usual browser headers
# take well under 2 KiB; waitress's own, larger limit answers with a plain-text 431 before us.
MAX_HEADER_BYTES = 16 * 1024

# Redis must never stall a request: a dead server fails fast, and the limiter then counts in this
# process (flask-limiter's in-memory fallback) until Redis answers again. redis-py's default
# retries with backoff would otherwise hold each request for seconds.
REDIS_TIMEOUT_SECONDS = 0.5


def client_ip() -> str:
    """The client address (behind a trusted proxy, waitress has already put the real one here)."""
    return request.remote_addr or "unknown"


def caller_key() -> str:
    """Who a request counts against: its token when valid, else its client IP."""
    caller = current_caller()
    return f"tok:{caller.token.public_id}" if caller else f"ip:{client_ip()}"


def caller_limit() -> str:
    limits = settings()["rate_limits"]
    return limits["per_token"] if current_caller() else limits["per_ip"]


def form_limit() -> str:
    return settings()["rate_limits"]["forms"]


def intake_limit() -> str:
    return settings()["rate_limits"]["intake"]


def connector_key() -> str:
    """What a sender's request counts against: the connector named in its path, whoever sends it."""
    return f"conn:{str((request.view_args or {}).get('conn_id', ''))[:64]}"


def storage_options(uri: str) -> dict[str, Any]:
    """Connection options for the limiter's storage: short timeouts and no retries for Redis."""
    if not uri.startswith("redis"):   # redis://, rediss://, redis+sentinel://, ...
        return {}
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return {"socket_timeout": REDIS_TIMEOUT_SECONDS, "socket_connect_timeout": REDIS_TIMEOUT_SECONDS,
            "retry": Retry(NoBackoff(), 0)}


def init_app(app: Flask, exempt: Iterable[Blueprint] = ()) -> Limiter:
    """Bind a limiter to the app; the exempt blueprints (probes, docs) are never counted or slowed."""
    cfg = app.config["LEADSVC"]["rate_limits"]
    exempt_names = {blueprint.name for blueprint in exempt}

    @app.before_request
    def refuse_unknown_method() -> None:
        # RFC 9110: a method the server does not recognise is 501, one a route does not take 405
        # (routing says that); before anything else, so a made-up method costs nothing.
        if request.method not in HTTP_METHODS:
            raise MethodNotImplemented()

    @app.before_request
    def check_header_size() -> None:
        size = sum(len(name) + len(value) + 4 for name, value in request.headers.items())   # "name: value\r\n"
        if size > MAX_HEADER_BYTES:
            raise RequestHeaderFieldsTooLarge(f"Request headers may take at most {MAX_HEADER_BYTES} bytes.")

    if cfg["enabled"]:
        @app.before_request
        def look_up_caller() -> None:
            # Before flask-limiter's check (registered by init_app below), which computes the key:
            # flask-limiter takes any error raised while it computes a key for a storage failure
            # (and swallows it), and a database outage must be a 503. The lookup is kept for the
            # request. Probes, docs and unknown routes are never counted and never touch the database.
            if request.endpoint is not None and request.blueprint not in exempt_names:
                current_caller()

    limiter = Limiter(
        key_func=caller_key,
        application_limits=[caller_limit],
        storage_uri=cfg["storage"],
        storage_options=storage_options(cfg["storage"]),
        enabled=cfg["enabled"],
        # write_headers writes them: flask-limiter's would give the reset as an epoch second, and
        # Retry-After on every response.
        headers_enabled=False,
        # Redis trouble must not become 500s, nor switch limits off: count in this process until
        # Redis is back (flask-limiter checks it again with backoff).
        swallow_errors=True,
        in_memory_fallback_enabled=True,
        key_prefix=cfg["key_prefix"],
    )
    for blueprint in exempt:
        limiter.exempt(blueprint)

    @app.after_request
    def write_headers(response: Response) -> Response:
        """RateLimit-Limit, -Remaining and -Reset (seconds from now) of the limit this request
        counted against, and on a 429 without one Retry-After (the same seconds)."""
        counted = limiter.current_limit
        if counted is None:
            return response
        try:
            reset_at, remaining = counted.window
        except Exception as exc:   # the storage failed after counting: the next request counts in memory
            log.warning("Rate limit headers left out: the limit storage failed (%s)", exc)
            return response
        seconds = str(max(1, math.ceil(reset_at - time.time())))
        headers = response.headers
        headers["RateLimit-Limit"] = str(counted.limit.amount)
        headers["RateLimit-Remaining"] = str(remaining)
        headers["RateLimit-Reset"] = seconds
        if response.status_code == 429 and "Retry-After" not in headers:   # a busy export says its own
            headers["Retry-After"] = seconds
        return response

    limiter.init_app(app)
    app.extensions["leadsvc.limiter"] = limiter
    return limiter
