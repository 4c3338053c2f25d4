"""GET /metrics: request counts, a latency histogram, database errors, webhook deliveries and timers.

prometheus_client keeps the metrics, in a registry per app (so per process: scrape every
process), and writes the text format. The endpoint needs no token; it is answered only to the
addresses in `metrics.allow_from` (loopback by default), is 404 to everyone else and when
`metrics.enabled` is false, and is exempt from rate limits.
"""

from __future__ import annotations

import math
import time
from datetime import datetime
from ipaddress import ip_address
from typing import Any, Callable, Iterable, Iterator

import peewee as pw
from flask import Blueprint, Flask, Response, current_app, g, request, request_finished
from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric

from .config import networks
from .db import UNAVAILABLE_ERRORS, database, statement
from .models import Delivery, Timer, utcnow
from .observability import request_method, request_route
from .problems import NotFound, problem_response

blp = Blueprint("metrics", __name__)

# Upper bounds in seconds, Prometheus' usual spread from 5 ms to 10 s.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# Delivery lag: well under a second when receivers answer, hours when they are retried.
LAG_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0, 600.0, 3600.0, 86400.0)
# The format generate_latest writes.
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4


class Metrics:
    """The metrics of one app, in a registry of its own: tests and host applications build many apps
    in one process, and prometheus_client's global registry would refuse the second app's names."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.series: dict[tuple[str, str, int], tuple[Any, Any]] = {}   # (method, route, status) -> its children
        self.requests = Counter(
            "leadsvc_http_requests_total", "Requests answered, by method, route template and status.",
            ["method", "route", "status"], registry=self.registry)
        self.duration = Histogram(
            "leadsvc_http_request_duration_seconds", "Time to build a response, by route template.",
            ["route"], buckets=BUCKETS, registry=self.registry)
        self.database_errors = Counter(
            "leadsvc_database_errors_total", "Requests answered 503 because the database was down, "
            "locked past its timeout or out of connections.", registry=self.registry)
        Gauge("leadsvc_process_start_time_seconds", "When this process started serving, in Unix time.",
              registry=self.registry).set_to_current_time()
        self.deliveries = Counter(
            "leadsvc_webhook_deliveries_total", "Webhook delivery attempts made by this process, by outcome "
            "(the delivery's state after the attempt).", ["outcome"], registry=self.registry)
        self.lag = Histogram(
            "leadsvc_webhook_lag_seconds", "From the commit of a change to the successful delivery of its event.",
            buckets=LAG_BUCKETS, registry=self.registry)
        Gauge("leadsvc_webhook_backlog", "Webhook deliveries due now and not yet attempted "
              "(all processes on this database).", registry=self.registry).set_function(webhook_backlog)
        self.timers = Counter(
            "leadsvc_timers_total", "Due timers this process's clock took, by kind and outcome (fired, or "
            "failed and tried again later).", ["kind", "outcome"], registry=self.registry)
        Gauge("leadsvc_timers_due", "Timers due now and not yet fired (all processes on this database).",
              registry=self.registry).set_function(timers_due)

    def delivery(self, outcome: str, lag_seconds: float | None) -> None:
        """One delivery attempt's outcome (its state after it) and, for a success, commit-to-delivery lag."""
        self.deliveries.labels(outcome).inc()
        if lag_seconds is not None:
            self.lag.observe(lag_seconds)

    def timers_fired(self, kind: str, outcome: str, count: int) -> None:
        """Timers of one kind that a clock's batch took, by outcome (kinds are the code's, never input)."""
        self.timers.labels(kind, outcome).inc(count)

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        """One answered request."""
        key = (method, route, status)
        series = self.series.get(key)
        if series is None:   # labels() takes a lock and converts every value: once per label set
            series = self.series[key] = (self.requests.labels(method, route, str(status)),
                                         self.duration.labels(route))
        count, duration = series
        count.inc()
        duration.observe(seconds)
        if status == 503:   # the only 503 the service gives: the database is down, locked or full
            self.database_errors.inc()

    def collect(self) -> Iterator[Metric]:
        """The registry's metrics without the `_created` series prometheus_client adds to counters
        and histograms: the page keeps its names, and turning them off process-wide
        (`disable_created_metrics`) would also change a host application's metrics."""
        for family in self.registry.collect():
            family.samples = [sample for sample in family.samples if not sample.name.endswith("_created")]
            yield family

    def render(self) -> bytes:
        """The Prometheus text page."""
        return generate_latest(self)


def webhook_backlog() -> float:
    """Deliveries due now (all processes on this database)."""
    return _due_now(_backlog, Delivery.next_attempt_at)


def timers_due() -> float:
    """Timers due now (all processes on this database)."""
    return _due_now(_timers_due, Timer.fire_at)


def _due_now(build: Callable[[], pw.Query], due: pw.Field) -> float:
    """How many rows `build`'s count finds due by now, from the database: NaN, Prometheus' "no
    value", when it does not answer, so the rest of the page still renders. Asked on every
    scrape, so the statement is written once (db.statement)."""
    try:
        return database.execute_sql(statement(build), [due.db_value(utcnow())]).fetchone()[0]
    except UNAVAILABLE_ERRORS:
        return math.nan


def _backlog() -> pw.Query:
    return Delivery.select(pw.fn.COUNT(pw.SQL("*"))).where(Delivery.next_attempt_at <= datetime.min)


def _timers_due() -> pw.Query:
    return Timer.select(pw.fn.COUNT(pw.SQL("*"))).where(Timer.fire_at <= datetime.min)


def init_app(app: Flask) -> None:
    """Count every request and serve /metrics, unless metrics.enabled is false."""
    cfg = app.config["LEADSVC"]["metrics"]
    if not cfg["enabled"]:
        return
    app.extensions["leadsvc.metrics"] = Metrics()
    app.extensions["leadsvc.metrics_allowed"] = networks(cfg["allow_from"])

    request_finished.connect(count_request, app)
    app.register_blueprint(blp)


def count_request(app: Flask, response: Response, **extra: object) -> None:
    """Flask's request_finished receiver: sent after every after_request hook, for every answer."""
    started = g.get("request_started")
    if started is not None:
        app.extensions["leadsvc.metrics"].observe(request_method(), request_route(), response.status_code,
                                                  time.perf_counter() - started)


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
