"""What operators rely on: /metrics, access and JSON logs, `leadsvc check`, graceful shutdown."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import sqlite3
import sys
import textwrap
import threading
import time

import pytest
from click.testing import CliRunner

from conftest import WEBHOOK_TEST_ENV
from leadsvc.cli import cli
from leadsvc.observability import configure_logging
from served import DEADLINE, ServedProcess, call, refuses_connections

FORGED = "Bearer lsk_" + "A" * 40


def scrape(client, addr="127.0.0.1"):
    response = client.get("/metrics", environ_base={"REMOTE_ADDR": addr})
    return response, response.get_data(as_text=True)


def test_metrics_count_requests_by_route_template_and_status_with_a_latency_histogram(make_app, ws):
    client = make_app().test_client()
    client.get("/api/v1/leads/ld_00000000000000000000", headers=ws.headers())
    client.get("/api/v1/leads", headers=ws.headers())
    client.get("/healthz")
    response, text = scrape(client)
    assert response.status_code == 200 and response.mimetype == "text/plain"
    assert 'leadsvc_http_requests_total{method="GET",route="/api/v1/leads/<lead_id:public_id>",status="404"} 1' in text
    assert 'leadsvc_http_requests_total{method="GET",route="/api/v1/leads",status="200"} 1' in text
    assert 'leadsvc_http_request_duration_seconds_bucket{le="+Inf",route="/healthz"} 1.0' in text
    assert 'leadsvc_http_request_duration_seconds_count{route="/api/v1/leads"} 1' in text
    assert "leadsvc_database_errors_total 0" in text
    assert "ld_0000" not in text, "route templates, never the values in them"


def test_unknown_methods_are_counted_under_one_label_whatever_they_are(make_app, ws):
    client = make_app().test_client()
    methods = ["FOO", "BAR", "Z" * 200_000]
    for index, method in enumerate(methods):
        client.open(f"/nope-{index}", method=method)
        client.open("/api/v1/leads", method=method, headers=ws.headers())
    client.open("/healthz", method="TRACE")
    _, text = scrape(client)
    assert 'leadsvc_http_requests_total{method="OTHER",route="(unmatched)",status="501"} 6' in text
    assert 'leadsvc_http_requests_total{method="TRACE",route="(unmatched)",status="405"} 1' in text
    assert not any(method in text for method in methods), "a made-up method never becomes a label"
    assert len(text) < 10_000


def test_metrics_answer_only_the_allowed_addresses(make_app):
    client = make_app().test_client()
    response, _ = scrape(client, "203.0.113.9")
    assert response.status_code == 404 and response.json["code"] == "not_found"
    assert scrape(client, "::1")[0].status_code == 200
    opened = make_app(metrics={"allow_from": "203.0.113.0/24"}).test_client()
    assert scrape(opened, "203.0.113.9")[0].status_code == 200
    assert scrape(opened, "127.0.0.1")[0].status_code == 404


def test_metrics_can_be_turned_off(make_app):
    assert scrape(make_app(metrics={"enabled": False}).test_client())[0].status_code == 404


def test_metrics_are_exempt_from_rate_limits(make_app):
    client = make_app(rate_limits={"enabled": True, "per_ip": "1/minute"}).test_client()
    responses = [scrape(client)[0] for _ in range(3)]
    assert [r.status_code for r in responses] == [200, 200, 200]
    assert "RateLimit-Limit" not in responses[0].headers


def test_database_errors_are_counted(make_app):
    app = make_app(database={"url": "postgresql://postgres@127.0.0.1:1/nowhere", "pool_timeout": 1})
    client = app.test_client()
    assert client.get("/api/v1/leads", headers={"Authorization": FORGED}).status_code == 503
    assert "leadsvc_database_errors_total 1" in scrape(client)[1]


def test_access_log_has_request_id_route_status_and_never_the_token(make_app, ws, caplog):
    client = make_app().test_client()
    secret = ws.token()
    with caplog.at_level(logging.INFO, logger="leadsvc.access"):
        client.get("/api/v1/leads", headers={"Authorization": f"Bearer {secret}", "X-Request-ID": "req-42"})
    [record] = [r for r in caplog.records if r.name == "leadsvc.access"]
    assert (record.request_id, record.route, record.status, record.method) == ("req-42", "/api/v1/leads", 200, "GET")
    assert record.token_id.startswith("tok_") and record.duration_ms >= 0
    line = caplog.text
    assert secret not in line and "Authorization" not in line and secret not in json.dumps(vars(record), default=str)


def test_access_log_bounds_the_method_and_path_it_writes(make_app, caplog):
    client = make_app().test_client()
    long_path = "/nope/" + "p" * 200_000
    with caplog.at_level(logging.INFO, logger="leadsvc.access"):
        client.open(long_path, method="M" * 200_000)
        client.get(long_path)
    made_up, known = [r for r in caplog.records if r.name == "leadsvc.access"]
    assert (made_up.method, made_up.status, known.method, known.status) == ("OTHER", 501, "GET", 404)
    for record in (made_up, known):
        assert record.path.startswith("/nope/ppp") and len(record.path) <= 513
        assert len(record.getMessage()) < 600
    assert len(caplog.text) < 2_000


def test_json_logs_are_one_object_per_line_with_the_request_id(make_app, ws):
    stream = io.StringIO()
    handler = configure_logging({"level": "INFO", "format": "json"}, stream=stream)
    try:
        client = make_app().test_client()
        client.get("/api/v1/leads", headers={**ws.headers(), "X-Request-ID": "json-line-1"})
        client.get("/api/v1/leads", headers={"Authorization": FORGED})
    finally:
        logging.getLogger().removeHandler(handler)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    access = [line for line in lines if line["logger"] == "leadsvc.access"]
    assert access[0]["request_id"] == "json-line-1" and access[0]["status"] == 200
    assert access[1]["status"] == 401 and "token_id" not in access[1]
    assert all({"time", "level", "logger", "message"} <= line.keys() for line in lines)
    assert "lsk_" not in stream.getvalue()


FORGED_LINE = "2026-11-24 15:44:00,000 INFO leadsvc.access: DELETE /api/v1/leads/ld_x 204"
# A line break, a carriage return, an ANSI escape, NEL and the Unicode line separator: each can
# end or rewrite a line in some log viewer.
HOSTILE_PATH = "/forms/x%0A" + FORGED_LINE.replace(" ", "%20") + "%0D%1B[2J%C2%85%E2%80%A8end"
RECORD_START = re.compile(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2},\d{3} [A-Z]+ [\w.]+: ")


def logged(make_app, log_format, requests):
    """What the log handler of `leadsvc serve` writes while the requests run."""
    stream = io.StringIO()
    handler = configure_logging({"level": "INFO", "format": log_format}, stream=stream)
    try:
        client = make_app().test_client()
        for request in requests:
            request(client)
    finally:
        logging.getLogger().removeHandler(handler)
    return stream.getvalue()


def test_text_log_escapes_control_characters_a_client_sent_so_no_line_is_forged(make_app):
    text = logged(make_app, "text", [lambda client: client.get(HOSTILE_PATH)])
    [line] = [line for line in text.splitlines() if "leadsvc.access" in line]
    assert text.count("\n") == 1 and RECORD_START.match(text), "one record, one line"
    assert "x\\n2026-11-24 15:44:00,000 INFO" in line and "\\r\\x1b[2J\\x85\\u2028end 404" in line
    assert not re.search("[\x00-\x1f\x7f-\x9f\u2028\u2029]", text.replace("\n", "")), "no raw control character"


def test_text_log_keeps_a_traceback_under_its_record_where_no_line_passes_for_a_record(make_app):
    def fail_with_the_input(client):
        try:
            raise ValueError("bad input x\n" + FORGED_LINE + "\r\x1b[2J")
        except ValueError:
            logging.getLogger("leadsvc").exception("request %s failed", "req\n" + FORGED_LINE)

    text = logged(make_app, "text", [fail_with_the_input])
    lines = text.splitlines()
    assert [line for line in lines if RECORD_START.match(line)] == [lines[0]], "one record"
    assert FORGED_LINE in lines[0] and "Traceback (most recent call last):" in text
    assert all(line.startswith("  ") for line in lines[1:]), "the traceback's lines are indented under it"
    assert not re.search("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029]", text)


def test_json_log_escapes_every_control_character_and_keeps_the_value(make_app):
    text = logged(make_app, "json", [lambda client: client.get(HOSTILE_PATH)])
    lines = text.split("\n")[:-1]
    access = [json.loads(line) for line in lines if '"leadsvc.access"' in line]
    assert len(access) == 1 and access[0]["path"].endswith("\r\x1b[2J\x85\u2028end")
    assert access[0]["path"].startswith("/forms/x\n" + FORGED_LINE)
    assert not re.search("[\x00-\x1f\x7f-\x9f\u2028\u2029]", text.replace("\n", "")), "no raw control character"
    assert all(json.loads(line) for line in lines)


def test_access_log_can_be_turned_off(make_app, caplog):
    client = make_app(logging={"access_log": False}).test_client()
    with caplog.at_level(logging.INFO, logger="leadsvc.access"):
        client.get("/healthz")
    assert not [r for r in caplog.records if r.name == "leadsvc.access"]


# --- leadsvc check ---------------------------------------------------------------------------

def run_check(**env):
    # The run's database holds other tests' webhooks: check wants the key they were made with.
    return CliRunner().invoke(cli, ["--config", os.devnull, "check"], env={**WEBHOOK_TEST_ENV, **env},
                              catch_exceptions=False)


def test_check_passes_on_a_migrated_database(app, database_url):
    result = run_check(LEADSVC_DATABASE_URL=database_url)
    assert result.exit_code == 0 and "schema is up to date" in result.stdout


def test_check_names_every_problem_and_how_to_fix_it(tmp_path):
    empty = tmp_path / "empty.sqlite3"
    sqlite3.connect(empty).close()
    result = run_check(LEADSVC_DATABASE_URL=f"sqlite:///{empty}", LEADSVC_RATE_LIMITS_STORAGE="redis://127.0.0.1:1/0")
    assert result.exit_code == 1
    from leadsvc.db import migrations_dir
    every = ", ".join(sorted(item.name[:-3] for item in migrations_dir().iterdir() if item.name[:1].isdigit()))
    assert f"needs migrations ({every}): run `leadsvc migrate`" in result.stderr
    assert "Redis at redis://127.0.0.1:1/0 (rate_limits.storage) does not answer" in result.stderr


@pytest.mark.parametrize("env,message", [
    ({"LEADSVC_DATABASE_URL": "sqlite:///{tmp}/missing/x.sqlite3"}, "does not exist yet: run `leadsvc migrate`"),
    ({"LEADSVC_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/x", "LEADSVC_DATABASE_POOL_TIMEOUT": "1"},
     "Check database.url"),
    ({"LEADSVC_SERVER_PORT": "eighty"}, "LEADSVC_SERVER_PORT must be a whole number"),
    ({"LEADSVC_LOGGING_FORMAT": "xml"}, "logging.format must be one of text, json"),
    ({"LEADSVC_METRICS_ALLOW_FROM": "10.0.0.0/33"}, "metrics.allow_from"),
])
def test_check_fails_with_a_message_that_says_what_to_fix(tmp_path, env, message):
    result = run_check(**{key: value.format(tmp=tmp_path) for key, value in env.items()})
    assert result.exit_code == 1 and message in result.stderr


# --- graceful shutdown -----------------------------------------------------------------------

SLOW_SERVER = textwrap.dedent("""\
    import os, sys, time, pathlib
    from leadsvc import create_app
    from leadsvc.serving import serve
    app = create_app({"database": {"url": sys.argv[1]}}, config_file=os.devnull)
    @app.get("/slow")
    def slow():
        pathlib.Path(sys.argv[3]).write_text("started")
        time.sleep(2)
        return {"finished": True}
    serve(app, "127.0.0.1", int(sys.argv[2]))
""")


@pytest.mark.slow
def test_sigterm_stops_accepting_finishes_requests_in_flight_and_exits_0(tmp_path):
    marker = tmp_path / "started"
    server = ServedProcess({}, tmp_path / "slow.log", cwd=tmp_path,
                           command=[sys.executable, "-c", SLOW_SERVER, f"sqlite:///{tmp_path}/x.sqlite3", "{port}",
                                    str(marker)])
    port, base = server.port, server.url
    try:
        server.start()
        process = server.process
        answers = []
        in_flight = threading.Thread(target=lambda: answers.append(call(base, "GET", "/slow", timeout=DEADLINE)))
        in_flight.start()
        deadline = time.monotonic() + DEADLINE
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        process.terminate()   # SIGTERM while /slow is running
        while not refuses_connections(port) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert refuses_connections(port), "no new connections after SIGTERM"
        in_flight.join(DEADLINE)
        replies = [(answer.status, answer.json()) for answer in answers]
        assert replies == [(200, {"finished": True})], "the request in flight got its answer"
        assert process.wait(DEADLINE) == 0
    finally:
        server.stop()
