"""Rate limits: per token across routes, per IP without a valid token, 429 problems with their
headers, a limit shared through Redis, and per-process limits when Redis is down."""

from __future__ import annotations

import socket
import threading
import uuid
from urllib.parse import urlsplit

import pytest

from leadsvc.limits import REDIS_TIMEOUT_SECONDS

PATH = "/api/v1/statuses"


@pytest.fixture
def limited(make_app):
    """An app with small limits and a key prefix of its own (parallel runs share one Redis)."""
    def build(storage="memory://", per_token="3/minute", per_ip="2/minute", prefix=None):
        return make_app(rate_limits={"enabled": True, "per_token": per_token, "per_ip": per_ip, "storage": storage,
                                     "key_prefix": prefix or f"leadsvc-test-{uuid.uuid4().hex}"})
    return build


def closed_port_url() -> str:
    from served import free_port

    return f"redis://127.0.0.1:{free_port()}/0"


def assert_rate_limited(response, limit: int):
    assert response.status_code == 429
    assert response.content_type == "application/problem+json"
    assert response.json["code"] == "rate_limited" and response.json["status"] == 429
    retry_after = response.headers["Retry-After"]
    assert retry_after.isdigit() and 1 <= int(retry_after) <= 60, "whole seconds, within the window"
    assert response.headers["RateLimit-Limit"] == str(limit)
    assert response.headers["RateLimit-Remaining"] == "0"
    assert response.headers["RateLimit-Reset"] == retry_after


def test_429_is_a_problem_with_retry_after_and_ratelimit_headers(limited, ws):
    client = limited().test_client()
    headers = ws.headers()
    for remaining in (2, 1, 0):
        response = client.get(PATH, headers=headers)
        assert response.status_code == 200
        assert response.headers["RateLimit-Limit"] == "3"
        assert response.headers["RateLimit-Remaining"] == str(remaining)
        reset = response.headers["RateLimit-Reset"]
        assert reset.isdigit() and 1 <= int(reset) <= 60, "seconds until the window resets, not an epoch"
        assert "Retry-After" not in response.headers, "Retry-After belongs to 429s only"
    assert_rate_limited(client.get(PATH, headers=headers), limit=3)


def test_the_token_limit_is_shared_across_routes(limited, ws):
    client = limited().test_client()
    headers = ws.headers()
    for path in ("/api/v1/statuses", "/api/v1/sources", "/api/v1/leads"):
        assert client.get(path, headers=headers).status_code == 200
    assert_rate_limited(client.get("/api/v1/teams", headers=headers), limit=3)


def test_each_token_has_its_own_budget(limited, ws):
    client = limited().test_client()
    for _ in range(3):
        client.get(PATH, headers=ws.headers("admin@t.test"))
    assert client.get(PATH, headers=ws.headers("admin@t.test")).status_code == 429
    assert client.get(PATH, headers=ws.headers("nmgr@t.test")).status_code == 200


def test_requests_without_a_valid_token_count_per_ip(limited, ws):
    """Made-up tokens cannot buy a fresh budget each: they all count against the client IP."""
    client = limited().test_client()
    for _ in range(2):
        forged = {"Authorization": "Bearer lsk_" + uuid.uuid4().hex + uuid.uuid4().hex}
        response = client.get(PATH, headers=forged)
        assert response.status_code == 401 and response.headers["RateLimit-Limit"] == "2"
    assert_rate_limited(client.get(PATH), limit=2)
    assert client.get(PATH, headers=ws.headers()).status_code == 200, "a valid token has its own budget"


def test_a_limit_string_naming_several_limits_applies_each(limited, ws):
    client = limited(per_token="5/hour;2/minute").test_client()
    headers = ws.headers()
    first, second = (client.get(PATH, headers=headers) for _ in range(2))
    assert first.status_code == second.status_code == 200
    assert (first.headers["RateLimit-Limit"], first.headers["RateLimit-Remaining"]) == ("2", "1"), \
        "the headers show the limit with the smallest window"
    assert client.get(PATH, headers=headers).status_code == 429


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/docs", "/api/v1/openapi.json", "/docs/api/problems/rate_limited"])
def test_probes_and_docs_are_never_limited(limited, path):
    client = limited(per_ip="1/minute").test_client()
    for _ in range(3):
        response = client.get(path)
        assert response.status_code == 200
        assert "RateLimit-Limit" not in response.headers and "Retry-After" not in response.headers


def test_a_redis_limit_is_shared_by_two_processes(limited, ws, redis_url):
    """Two apps (as two processes would) with one Redis storage share each token's budget."""
    prefix = f"leadsvc-test-{uuid.uuid4().hex}"
    first = limited(storage=redis_url, per_token="4/minute", prefix=prefix).test_client()
    second = limited(storage=redis_url, per_token="4/minute", prefix=prefix).test_client()
    headers = ws.headers()
    remaining = [int(client.get(PATH, headers=headers).headers["RateLimit-Remaining"])
                 for client in (first, second, first, second)]
    assert remaining == [3, 2, 1, 0]
    assert_rate_limited(first.get(PATH, headers=headers), limit=4)
    assert_rate_limited(second.get(PATH, headers=headers), limit=4)


def test_redis_down_falls_back_to_per_process_limits(limited, ws, caplog):
    app = limited(storage=closed_port_url())
    client = app.test_client()
    headers = ws.headers()
    for remaining in (2, 1, 0):
        response = client.get(PATH, headers=headers)
        assert response.status_code == 200, "Redis trouble is not a 500"
        assert response.headers["RateLimit-Remaining"] == str(remaining), "and limits stay on"
    assert_rate_limited(client.get(PATH, headers=headers), limit=3)
    assert any("falling back to in-memory" in record.getMessage() for record in caplog.records)


def test_redis_connections_time_out_quickly_and_do_not_retry(limited):
    app = limited(storage=closed_port_url())
    storage = app.extensions["leadsvc.limiter"].storage
    kwargs = storage.storage.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == kwargs["socket_connect_timeout"] == REDIS_TIMEOUT_SECONDS
    assert kwargs["retry"].get_retries() == 0


def test_redis_dying_mid_run_switches_to_per_process_limits(limited, ws, redis_url):
    from served import TcpProxy

    upstream = urlsplit(redis_url)
    with TcpProxy(upstream.hostname, upstream.port or 6379) as proxy:
        client = limited(storage=f"redis://127.0.0.1:{proxy.port}{upstream.path}").test_client()
        headers = ws.headers()
        assert client.get(PATH, headers=headers).headers["RateLimit-Remaining"] == "2"
        proxy.cut()
        statuses = [client.get(PATH, headers=headers).status_code for _ in range(4)]
    assert statuses == [200, 200, 200, 429], "per-process counting from a fresh window, never a 500"


def test_a_redis_that_never_answers_does_not_stall_requests(limited, ws):
    """A server that accepts connections and never replies: the socket timeouts end each wait."""
    with socket.socket() as blackhole:
        blackhole.bind(("127.0.0.1", 0))
        blackhole.listen(16)   # the kernel completes handshakes; nobody ever reads or answers
        client = limited(storage=f"redis://127.0.0.1:{blackhole.getsockname()[1]}/0").test_client()
        headers = ws.headers()
        statuses: list[int] = []
        worker = threading.Thread(target=lambda: statuses.extend(client.get(PATH, headers=headers).status_code
                                                                 for _ in range(3)))
        worker.start()
        worker.join(30)
        assert not worker.is_alive(), "requests hang on a silent Redis"
    assert statuses == [200, 200, 200]



def test_a_database_outage_is_a_503_and_not_taken_for_a_limit_storage_failure(make_app, caplog):
    """The caller is looked up before flask-limiter computes its key: flask-limiter takes an error
    raised there for a failure of its storage, and would count in memory from then on."""
    app = make_app(rate_limits={"enabled": True},
                   database={"url": "postgresql://postgres@127.0.0.1:1/nowhere", "pool_timeout": 1})
    response = app.test_client().get(PATH, headers={"Authorization": "Bearer lsk_" + "A" * 40})
    assert response.status_code == 503 and response.json["code"] == "service_unavailable"
    assert not any("falling back to in-memory" in record.getMessage() for record in caplog.records)
