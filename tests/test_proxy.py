"""leadsvc behind nginx with the README's configuration (examples/nginx/leadsvc.conf): requests go
through, idle and slow clients are held by nginx and never reach leadsvc, and an oversized body is
a problem document."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from leadsvc.serving import waitress_options
from served import InProcessServer, call, free_port, wait_until

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "nginx" / "leadsvc.conf"
IDLE_CLIENTS = 300
# Fewer connections than the idle clients hold: leadsvc alone would stop answering.
LEADSVC_CONNECTIONS = 50


@contextmanager
def nginx_in_front_of(upstream_url: str, folder: Path) -> Iterator[str]:
    """nginx serving the example's server block on a free port, proxying to upstream_url; yields its URL.
    Only the two addresses change: nginx's own listening one and leadsvc's."""
    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    assert os.access(binary, os.X_OK), "nginx is not installed (.ci/run installs nginx-light)"
    port = free_port()
    site = EXAMPLE.read_text()
    for example, here in (("listen 80;", f"listen 127.0.0.1:{port};"),
                          ("server 127.0.0.1:8080;", f"server 127.0.0.1:{upstream_url.rsplit(':', 1)[1]};")):
        assert site.count(example) == 1, example
        site = site.replace(example, here)
    (folder / "leadsvc.conf").write_text(site)
    temp_paths = "\n".join(f"    {kind}_temp_path {folder}/{kind};" for kind in
                           ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    (folder / "nginx.conf").write_text(f"""\
{"user root;" if os.geteuid() == 0 else ""}
daemon off;
worker_processes 1;
pid {folder}/nginx.pid;
error_log {folder}/error.log;
events {{ worker_connections 1024; }}
http {{
    access_log off;
{temp_paths}
    include {folder}/leadsvc.conf;
}}
""")
    process = subprocess.Popen([binary, "-p", str(folder), "-c", str(folder / "nginx.conf"),
                                "-e", str(folder / "error.log")], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        def up() -> bool:
            if process.poll() is not None:
                raise AssertionError((folder / "error.log").read_text())
            return call(url, "GET", "/healthz", timeout=2).status == 200
        wait_until(up, 30, f"nginx answering on {url}")
        yield url
    finally:
        process.terminate()
        process.wait(30)


@pytest.fixture
def proxied(app, tmp_path):
    """(leadsvc's URL, nginx's URL): leadsvc in a thread with the service's waitress settings, for
    LEADSVC_CONNECTIONS connections, believing nginx's X-Forwarded-* headers."""
    server = {**app.config["LEADSVC"]["server"], "connection_limit": LEADSVC_CONNECTIONS,
              "trusted_proxy": "127.0.0.1", "channel_timeout": 600}
    with InProcessServer(app, **waitress_options(app, server)) as leadsvc:
        with nginx_in_front_of(leadsvc.url, tmp_path) as nginx:
            yield leadsvc.url, nginx


def idle_connections(url: str, count: int, stack: ExitStack) -> None:
    """count connections that send half a request and then nothing."""
    host, port = url.removeprefix("http://").split(":")
    for index in range(count):
        connection = stack.enter_context(socket.create_connection((host, int(port)), timeout=10))
        if index % 2:
            connection.sendall(b"GET /healthz HTTP/1.1\r\nHost: leads.example.com\r\n")


def test_requests_go_through_the_example_nginx_configuration(proxied, ws):
    _, nginx = proxied
    created = call(nginx, "POST", "/api/v1/leads", json_body={"first_name": "Asha", "email": "asha.proxy@example.com"},
                   headers={**ws.headers(), "X-Request-ID": "through-nginx"})
    assert created.status == 201, created.body[:300]
    assert created.headers["x-request-id"] == "through-nginx"
    assert created.headers["x-content-type-options"] == "nosniff"


def test_idle_clients_at_the_proxy_leave_healthz_answering_where_alone_leadsvc_would_stop(proxied, ws):
    leadsvc, nginx = proxied
    with ExitStack() as stack:
        idle_connections(nginx, IDLE_CLIENTS, stack)
        assert call(nginx, "GET", "/healthz", timeout=30).status == 200
        assert call(nginx, "GET", "/api/v1/statuses", headers=ws.headers(), timeout=30).status == 200
    with ExitStack() as stack:
        idle_connections(leadsvc, IDLE_CLIENTS, stack)
        with pytest.raises(OSError):   # waitress accepts no connection past its limit: nothing answers
            call(leadsvc, "GET", "/healthz", timeout=3)


@pytest.mark.parametrize("size", [100 * 1024, 2 * 1024 * 1024], ids=["over-leadsvc-limit", "over-waitress-limit"])
def test_an_oversized_body_through_the_proxy_is_a_413_problem(proxied, ws, size):
    _, nginx = proxied
    reply = call(nginx, "POST", "/api/v1/leads", json_body={"first_name": "x" * size}, headers=ws.headers())
    assert reply.status == 413 and reply.headers["content-type"] == "application/problem+json"
    problem = reply.json()
    assert problem["code"] == "payload_too_large" and problem["request_id"] == reply.headers["x-request-id"]
    assert ("errors" in problem) is False and len(problem["request_id"]) == 32
