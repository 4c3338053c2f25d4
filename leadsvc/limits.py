"""Rate limits: per token across all routes, per client IP without a valid token, per IP for web forms.

A Limiter is made per app (like the Api): flask-limiter keeps its storage and exemptions on the
instance, and a test run builds apps with different limits side by side.
"""

from __future__ import annotations

from flask import Flask, request
from flask_limiter import HeaderNames, Limiter

from .auth import current_caller
from .config import settings


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


def init_app(app: Flask) -> Limiter:
    cfg = app.config["LEADSVC"]["rate_limits"]
    limiter = Limiter(
        key_func=caller_key,
        application_limits=[caller_limit],
        storage_uri=cfg["storage"],
        enabled=cfg["enabled"],
        headers_enabled=True,
        header_name_mapping={HeaderNames.LIMIT: "RateLimit-Limit", HeaderNames.REMAINING: "RateLimit-Remaining",
                             HeaderNames.RESET: "RateLimit-Reset"},
        # Redis trouble must not become 500s: count in this process until it is back.
        swallow_errors=True,
        in_memory_fallback_enabled=True,
        key_prefix="leadsvc",
    )
    limiter.init_app(app)
    app.extensions["leadsvc.limiter"] = limiter
    return limiter
