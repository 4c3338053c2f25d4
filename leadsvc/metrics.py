"""GET /metrics: request counts, a latency histogram and database errors in Prometheus text format.

Counters are plain integers under one lock, kept per app (so per process: scrape every process).
A request costs a tuple key, a bisect and two dict updates. The endpoint needs no token; it is
answered only to the addresses in `metrics.allow_from` (loopback by default), is 404 to everyone
else and when `metrics.enabled` is false, and is exempt from rate limits.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from ipaddress import ip_address
from typing import Callable, Iterable

from flask import Blueprint, Flask, Response, current_app, g, request

from .config import networks
from .db import UNAVAILABLE_ERRORS
from .models import Delivery, utcnow
from .observability import request_method, request_route
from .problems import NotFound, problem_response

blp = Blueprint("metrics", __name__)

# Upper bounds in seconds, Prometheus' usual spread from 5 ms to 10 s.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# Delivery lag: well under a second when receivers answer, hours when they are retried.
LAG_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0, 600.0, 3600.0, 86400.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Metrics:
    """The counters of one app."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: dict[tuple[str, str, int], int] = {}
        self.latency: dict[str, list] = {}     # route -> [bucket counts..., +Inf count, sum]
        self.database_errors = 0
        self.started = time.time()
        self.deliveries: dict[str, int] = {}     # outcome of each delivery attempt -> count
        self.lag = [0] * (len(LAG_BUCKETS) + 1) + [0.0]

    def delivery(self, outcome: str, lag_seconds: float | None) -> None:
        """One delivery attempt's outcome (its state after it) and, for a success, commit-to-delivery lag."""
        with self.lock:
            self.deliveries[outcome] = self.deliveries.get(outcome, 0) + 1
            if lag_seconds is not None:
                self.lag[bisect_left(LAG_BUCKETS, lag_seconds)] += 1
                self.lag[-1] += lag_seconds

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        key = (method, route, status)
        slot = bisect_left(BUCKETS, seconds)
        with self.lock:
            self.requests[key] = self.requests.get(key, 0) + 1
            counts = self.latency.get(route)
            if counts is None:
                counts = self.latency[route] = [0] * (len(BUCKETS) + 1) + [0.0]
            counts[slot] += 1
            counts[-1] += seconds
            if status == 503:   # the only 503 the service gives: the database is down, locked or full
                self.database_errors += 1

    def render(self) -> str:
        with self.lock:
            requests = sorted(self.requests.items())
            latency = sorted((route, list(counts)) for route, counts in self.latency.items())
            database_errors = self.database_errors
            deliveries, lag = sorted(self.deliveries.items()), list(self.lag)
        lines = [
            "# HELP leadsvc_http_requests_total Requests answered, by method, route template and status.",
            "# TYPE leadsvc_http_requests_total counter",
        ]
        lines += [f'leadsvc_http_requests_total{{method="{_label(m)}",route="{_label(r)}",status="{s}"}} {n}'
                  for (m, r, s), n in requests]
        lines += [
            "# HELP leadsvc_http_request_duration_seconds Time to build a response, by route template.",
            "# TYPE leadsvc_http_request_duration_seconds histogram",
        ]
        for route, counts in latency:
            label = _label(route)
            total = 0
            for bound, count in zip((*BUCKETS, "+Inf"), counts[:-1]):
                total += count
                lines.append(f'leadsvc_http_request_duration_seconds_bucket{{route="{label}",le="{bound}"}} {total}')
            lines.append(f'leadsvc_http_request_duration_seconds_sum{{route="{label}"}} {counts[-1]:.6f}')
            lines.append(f'leadsvc_http_request_duration_seconds_count{{route="{label}"}} {total}')
        lines += [
            "# HELP leadsvc_database_errors_total Requests answered 503 because the database was down, "
            "locked past its timeout or out of connections.",
            "# TYPE leadsvc_database_errors_total counter",
            f"leadsvc_database_errors_total {database_errors}",
            "# HELP leadsvc_process_start_time_seconds When this process started serving, in Unix time.",
            "# TYPE leadsvc_process_start_time_seconds gauge",
            f"leadsvc_process_start_time_seconds {self.started:.3f}",
            "# HELP leadsvc_webhook_deliveries_total Webhook delivery attempts made by this process, by outcome "
            "(the delivery's state after the attempt).",
            "# TYPE leadsvc_webhook_deliveries_total counter",
        ]
        lines += [f'leadsvc_webhook_deliveries_total{{outcome="{_label(outcome)}"}} {n}' for outcome, n in deliveries]
        lines += ["# HELP leadsvc_webhook_lag_seconds From the commit of a change to the successful delivery of its event.",
                  "# TYPE leadsvc_webhook_lag_seconds histogram"]
        total = 0
        for bound, count in zip((*LAG_BUCKETS, "+Inf"), lag[:-1]):
            total += count
            lines.append(f'leadsvc_webhook_lag_seconds_bucket{{le="{bound}"}} {total}')
        lines += [f"leadsvc_webhook_lag_seconds_sum {lag[-1]:.6f}", f"leadsvc_webhook_lag_seconds_count {total}"]
        backlog = webhook_backlog()
        if backlog is not None:
            lines += ["# HELP leadsvc_webhook_backlog Webhook deliveries due now and not yet attempted "
                      "(all processes on this database).",
                      "# TYPE leadsvc_webhook_backlog gauge", f"leadsvc_webhook_backlog {backlog}"]
        return "\n".join(lines) + "\n"


def webhook_backlog() -> int | None:
    """Deliveries due now, from the database (None when it does not answer: the rest still renders)."""
    try:
        return Delivery.select().where(Delivery.next_attempt_at <= utcnow()).count()
    except UNAVAILABLE_ERRORS:
        return None


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def init_app(app: Flask) -> None:
    """Count every request and serve /metrics, unless metrics.enabled is false."""
    cfg = app.config["LEADSVC"]["metrics"]
    if not cfg["enabled"]:
        return
    metrics = app.extensions["leadsvc.metrics"] = Metrics()
    app.extensions["leadsvc.metrics_allowed"] = networks(cfg["allow_from"])

    @app.after_request
    def count_request(response: Response) -> Response:
        started = g.get("request_started")
        if started is not None:
            metrics.observe(request_method(), request_route(), response.status_code,
                            time.perf_counter() - started)
        return response

    app.register_blueprint(blp)


def metrics_only(app: Flask) -> Callable[[dict, Callable], Iterable[bytes]]:
    """The app as `leadsvc worker --metrics-port` serves it: /metrics (with its allow_from rule),
    and the app's 404 problem for any other path, which never reaches the API."""
    def wsgi(environ: dict, start_response: Callable) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == "/metrics":
            return app(environ, start_response)
        with app.request_context(environ):
            response = problem_response(404, "not_found")
        return response(environ, start_response)
    return wsgi


@blp.get("/metrics")
def scrape() -> Response:
    """The counters, to the addresses metrics.allow_from names; 404 to anyone else."""
    try:
        client = ip_address(request.remote_addr or "")
    except ValueError:
        client = None
    if client is not None and client.version == 6 and client.ipv4_mapped:
        client = client.ipv4_mapped   # an IPv6 listener sees IPv4 clients as ::ffff:a.b.c.d
    if client is None or not any(client in net for net in current_app.extensions["leadsvc.metrics_allowed"]):
        raise NotFound()
    return Response(current_app.extensions["leadsvc.metrics"].render(), content_type=CONTENT_TYPE)
