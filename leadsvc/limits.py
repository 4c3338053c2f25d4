"""Rate limits and request-size limits: what a single client may send, and how often.

Rate limits count per token across all routes for a valid token, per client IP otherwise, and per
client IP for web-form submissions (`form_limit`). A Limiter is made per app (like the Api):
flask-limiter keeps its storage and exemptions on the instance, and a test run builds apps with
different limits side by side.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any, Callable, Iterable

from flask import Blueprint, Flask, Response, request
from flask.globals import request_ctx
from flask_limiter import ApplicationLimit, Limiter, RateLimitExceeded, RequestLimit
from limits.storage import MemoryStorage
from werkzeug.exceptions import RequestHeaderFieldsTooLarge

from .auth import current_caller
from .current import current_request
from .config import settings

log = logging.getLogger("leadsvc")

# All request headers together (names and values). A bearer token and the usual browser headers
# take well under 2 KiB; waitress's own, larger limit answers with a plain-text 431 before us.
MAX_HEADER_BYTES = 16 * 1024

_BODY_HEADER_KEYS = frozenset({"CONTENT_TYPE", "CONTENT_LENGTH"})   # the headers WSGI keeps without HTTP_

# Redis must never stall a request: a dead server fails fast, and the limiter then counts in this
# process (flask-limiter's in-memory fallback) until Redis answers again. redis-py otherwise
# retries three times with backoff of up to 14 seconds in all.
REDIS_TIMEOUT_SECONDS = 0.5


class SweptMemoryStorage(MemoryStorage):
    """limits' in-memory counters, with expired ones swept by the requests instead of a thread.

    MemoryStorage starts a threading.Timer 10 ms ahead on every count whose last timer has run
    out: under load a new thread about every 10 ms, and starting one hands the GIL back and forth
    (3% of a create's CPU, measured in-process). A counter past its window is already dropped when
    it is next read; the rest are swept here, at most once per SWEEP_SECONDS.
    """

    STORAGE_SCHEME = ["leadsvc+memory"]
    SWEEP_SECONDS = 1.0

    def __init__(self, uri: str | None = None, **options: Any):
        super().__init__(uri, **options)
        self._swept_at = time.monotonic()
        self._sweeping = threading.Lock()

    # MemoryStorage calls this (a private method, hence the mangled name) on every count.
    def _MemoryStorage__schedule_expiry(self) -> None:
        if time.monotonic() - self._swept_at >= self.SWEEP_SECONDS and self._sweeping.acquire(blocking=False):
            try:
                self._swept_at = time.monotonic()
                self._MemoryStorage__expire_events()
            except KeyError:   # a request dropped an expired counter meanwhile; the next sweep goes on
                pass
            finally:
                self._sweeping.release()


class ServiceLimiter(Limiter):
    """flask-limiter, counting the one limit an API request has on a short path.

    For every request flask-limiter works out anew which of the limits it supports apply
    (application, default, blueprint, decorated and meta limits, exemption scopes twice, each
    limit string parsed again): 0.87 of a create's 4.9 million instructions, for the single
    application-wide limit of an API request. While the storage answers, that limit is counted
    here as flask-limiter's ApplicationLimit gives it (key, scope "global", strategy), so both
    paths count one budget, and either leaves it as the request's current_limit (for the
    headers). Blueprints with limits of their own (limit_blueprint: web forms), limit strings
    naming several limits, and every request once the storage has failed (flask-limiter then
    counts in memory until the storage is back: its _storage_dead) take flask-limiter's own
    check, which this overrides (hence the pin of flask-limiter to 4.1); the request that finds
    the storage failing tries it twice, once here. Exempt blueprints are never counted.
    """

    def __init__(self, *args: Any, exempt: Iterable[str] = (), **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.exempt_blueprints = frozenset(exempt)
        self._own_limits: set[str] = set()   # blueprints whose requests flask-limiter checks
        self._limits: dict[str, list[Any]] = {}   # limit string -> flask-limiter's RuntimeLimits
        self._prefix = [kwargs["key_prefix"]] if kwargs.get("key_prefix") else []

    def limit_blueprint(self, blueprint: Blueprint, limit: Callable[[], str], **options: Any) -> None:
        """Give the blueprint's requests a limit of their own, on top of the application's."""
        self.limit(limit, **options)(blueprint)
        self._own_limits.add(blueprint.name)

    @property
    def context(self) -> Any:
        """flask-limiter's state of the current request, where flask-limiter keeps it (on the
        request context), looked up once: its own property, called five times a request, goes
        through the request-context proxy three times a call, failing an attribute lookup first."""
        contexts = getattr(request_ctx._get_current_object(), "_limiter_request_context", None)
        return super().context if contexts is None else contexts[self]

    def _check_request_limit(self, callable_name: str | None = None, in_middleware: bool = True) -> None:
        req = current_request()
        blueprint = req.blueprint
        if blueprint in self.exempt_blueprints or req.endpoint is None:
            return   # as flask-limiter: probes and docs, and unknown routes, are never counted
        # The caller is looked up here, before flask-limiter's check: flask-limiter takes any error
        # raised while it computes a key for a storage failure (and swallows it), and a database
        # outage must be a 503. Probes and docs never touch the database.
        limits = self._runtime_limits(caller_limit())
        if (callable_name is not None or not in_middleware or self._storage_dead or len(limits) != 1
                or blueprint in self._own_limits):
            return super()._check_request_limit(callable_name, in_middleware)
        limit = limits[0]
        args = [*self._prefix, caller_key(), limit.scope]
        try:
            allowed = self.limiter.hit(limit.limit, *args)
        except Exception:   # storage trouble: flask-limiter's check falls back to counting in memory
            return super()._check_request_limit(callable_name, in_middleware)
        counted = RequestLimit(self, limit.limit, args, breached=not allowed, shared=True)
        context = self.context
        context.view_rate_limit, context.view_rate_limits = counted, [counted]
        if not allowed:
            # Logged as flask-limiter logs a breach (its scope where it says endpoint).
            self.logger.info("ratelimit %s (%s) exceeded at endpoint: %s", limit.limit, args[-2], limit.scope)
            raise RateLimitExceeded(limit)

    def _runtime_limits(self, text: str) -> list[Any]:
        """The application limits a limit string names, as flask-limiter counts them; parsed once."""
        limits = self._limits.get(text)
        if limits is None:
            limits = self._limits[text] = list(ApplicationLimit(text, key_function=caller_key))
        return limits


def storage_uri(configured: str) -> str:
    """The limits storage for the configured one: memory:// counts in SweptMemoryStorage."""
    return "leadsvc+memory://" if configured == "memory://" else configured


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
    def check_header_size() -> None:
        # Counted from the WSGI environ, where each header is HTTP_<NAME> (or CONTENT_TYPE and
        # CONTENT_LENGTH) with a name of the same length: request.headers spells each name anew.
        size = sum(len(key) - (5 if key[:5] == "HTTP_" else 0) + len(value) + 4
                   for key, value in current_request().environ.items()
                   if key[:5] == "HTTP_" or key in _BODY_HEADER_KEYS)
        if size > MAX_HEADER_BYTES:
            raise RequestHeaderFieldsTooLarge(f"Request headers may take at most {MAX_HEADER_BYTES} bytes.")

    limiter = ServiceLimiter(
        key_func=caller_key,
        exempt=exempt_names,
        application_limits=[caller_limit],
        storage_uri=storage_uri(cfg["storage"]),
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

    @app.after_request
    def write_headers(response: Response) -> Response:
        """RateLimit-Limit, -Remaining and -Reset (seconds from now) of the limit this request
        counted against, and on a 429 Retry-After (the same seconds)."""
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
        if response.status_code == 429:
            headers["Retry-After"] = seconds
        return response

    limiter.init_app(app)
    app.extensions["leadsvc.limiter"] = limiter
    return limiter
