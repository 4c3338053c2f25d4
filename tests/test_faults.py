"""Database trouble: down, locked past its timeout, out of connections -> 503 with Retry-After,
and the service recovers by itself when the database is back (/readyz follows it)."""

from __future__ import annotations

import sqlite3
import time
import uuid
from urllib.parse import urlsplit, urlunsplit

import pytest

from conftest import Tenant, standard_setup
from leadsvc.db import database, make_database, migrate
from leadsvc.problems import RETRY_AFTER_UNAVAILABLE
from leadsvc.provision import apply_setup, parse_setup
from served import ServedProcess, TcpProxy, call, free_port, held_in_another_thread, wait_until

FAKE_TOKEN = {"Authorization": "Bearer lsk_" + "A" * 40}


def assert_unavailable(response):
    assert response.status_code == 503
    assert response.content_type == "application/problem+json"
    assert response.json["code"] == "service_unavailable"
    assert response.headers["Retry-After"] == str(RETRY_AFTER_UNAVAILABLE)


def with_port(url: str, port: int) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{parts.username}@127.0.0.1:{port}"))


@pytest.fixture
def unreachable_url(backend, tmp_path) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp_path}/missing-folder/leadsvc.sqlite3"
    return f"postgresql://postgres@127.0.0.1:{free_port()}/leadsvc"


def test_an_unreachable_database_is_503_and_readyz_follows(make_app, unreachable_url):
    client = make_app(database={"url": unreachable_url}).test_client()
    assert_unavailable(client.get("/api/v1/leads", headers=FAKE_TOKEN))
    assert_unavailable(client.post("/api/v1/leads", json={"email": "a@b.test"}, headers=FAKE_TOKEN))
    assert_unavailable(client.get("/readyz"))
    assert client.get("/healthz").status_code == 200, "liveness never needs the database"


def test_with_rate_limits_on_a_database_outage_is_still_503_with_its_own_retry_after(make_app, unreachable_url):
    client = make_app(database={"url": unreachable_url}, rate_limits={"enabled": True}).test_client()
    for _ in range(2):
        response = client.get("/api/v1/statuses", headers=FAKE_TOKEN)
        assert_unavailable(response)


@pytest.mark.only_on("sqlite")
def test_sqlite_locked_past_its_busy_timeout_is_503(make_app, backend, tmp_path):
    url = f"sqlite:///{tmp_path}/locked.sqlite3"
    migrate(make_database(url, busy_timeout_ms=100))
    client = make_app(database={"url": url, "busy_timeout_ms": 100}).test_client()
    tenant = Tenant(apply_setup(parse_setup(standard_setup("Locked"))))
    headers = tenant.headers()
    assert client.get("/api/v1/statuses", headers=headers).status_code == 200
    holder = sqlite3.connect(url.removeprefix("sqlite:///"))
    holder.execute("BEGIN IMMEDIATE")
    try:
        response = client.post("/api/v1/leads", json={"email": f"{uuid.uuid4().hex}@x.test"}, headers=headers)
        assert_unavailable(response)
        assert client.get("/api/v1/statuses", headers=headers).status_code == 200, "WAL readers go on"
    finally:
        holder.rollback()
        holder.close()
    assert client.post("/api/v1/leads", json={"email": f"{uuid.uuid4().hex}@x.test"}, headers=headers).status_code == 201
    database.close()


@pytest.mark.only_on("sqlite")
def test_sqlite_write_of_another_thread_held_past_the_busy_timeout_is_503(make_app, backend, tmp_path):
    # Threads of one process queue for SQLite's write lock on a mutex: the same timeout, the same 503.
    url = f"sqlite:///{tmp_path}/queued.sqlite3"
    migrate(make_database(url, busy_timeout_ms=100))
    client = make_app(database={"url": url, "busy_timeout_ms": 100}).test_client()
    headers = Tenant(apply_setup(parse_setup(standard_setup("Queued")))).headers()
    transaction = database.atomic()
    with held_in_another_thread(transaction.__enter__, lambda: (transaction.__exit__(None, None, None),
                                                                 database.close())):
        assert_unavailable(client.post("/api/v1/leads", json={"email": f"{uuid.uuid4().hex}@x.test"},
                                       headers=headers))
    assert client.post("/api/v1/leads", json={"email": f"{uuid.uuid4().hex}@x.test"}, headers=headers).status_code == 201
    database.close()


@pytest.mark.only_on("postgresql")
def test_postgresql_pool_exhausted_is_503(make_app, backend, database_url, ws):
    headers = ws.headers()
    url = database_url + "?pool=one"   # another URL, so another pool: one connection, one second's wait
    app = make_app(database={"url": url, "pool_size": 1, "pool_timeout": 1}, server={"threads": 1})
    with held_in_another_thread(database.connect, database.close):   # the only connection
        assert_unavailable(app.test_client().get("/api/v1/leads", headers=headers))
    assert app.test_client().get("/api/v1/leads", headers=headers).status_code == 200
    make_database(url).close_all()


@pytest.mark.slow
@pytest.mark.only_on("postgresql")
def test_postgresql_cut_gives_503_within_a_second_and_recovers_within_five(backend, database_url, ws, tmp_path):
    """Acceptance 2: a served process, PostgreSQL behind a proxy the test cuts and restores."""
    upstream = urlsplit(database_url)
    headers = ws.headers()
    with TcpProxy(upstream.hostname, upstream.port) as proxy:
        server = ServedProcess({"LEADSVC_DATABASE_URL": with_port(database_url, proxy.port),
                                "LEADSVC_DATABASE_POOL_TIMEOUT": "1",
                                "LEADSVC_RATE_LIMITS_ENABLED": "false"}, tmp_path / "serve.log")
        with server:
            for _ in range(5):   # warm the pool: several connections open through the proxy
                assert call(server.url, "GET", "/api/v1/leads", headers=headers).status == 200

            proxy.cut()
            cut_at = time.monotonic()

            def unavailable():
                reply = call(server.url, "GET", "/api/v1/leads", headers=headers, timeout=5)
                return reply if reply.status == 503 else None

            reply = wait_until(unavailable, 1.0, "503 after the database connection was cut")
            detected = time.monotonic() - cut_at
            assert reply.headers["retry-after"] == str(RETRY_AFTER_UNAVAILABLE)
            assert reply.json()["code"] == "service_unavailable"
            assert call(server.url, "GET", "/readyz").status == 503
            assert call(server.url, "GET", "/healthz").status == 200

            proxy.restore()
            restored_at = time.monotonic()
            wait_until(lambda: call(server.url, "GET", "/api/v1/leads", headers=headers, timeout=5).status == 200,
                       5.0, "200 again after the database came back, without a restart")
            recovered = time.monotonic() - restored_at
            assert call(server.url, "GET", "/readyz").status == 200
            server.alive()
    print(f"\nfault test: 503 {detected * 1000:.0f} ms after the cut, 200 {recovered * 1000:.0f} ms after restoring")


@pytest.mark.parametrize("idempotency_key", [None, "retry-me"])
@pytest.mark.only_on("postgresql")
def test_postgresql_dying_mid_request_is_503_and_the_next_request_gets_a_fresh_connection(
        client, ws, backend, monkeypatch, idempotency_key):
    from leadsvc import pipeline

    real_create = pipeline.create_lead

    def create_on_a_dying_connection(*args, **kwargs):
        database.execute_sql("SELECT pg_terminate_backend(pg_backend_pid())")
        return real_create(*args, **kwargs)

    headers = ws.headers()
    if idempotency_key:
        headers["Idempotency-Key"] = f"{idempotency_key}-{uuid.uuid4().hex}"
    body = {"email": f"{uuid.uuid4().hex}@x.test"}
    monkeypatch.setattr(pipeline, "create_lead", create_on_a_dying_connection)
    assert_unavailable(client.post("/api/v1/leads", json=body, headers=headers))
    monkeypatch.undo()
    retried = client.post("/api/v1/leads", json=body, headers=headers)
    assert retried.status_code == 201, "the dead connection left the pool; nothing was half-written"
    assert "Idempotent-Replayed" not in retried.headers
