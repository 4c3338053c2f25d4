"""`leadsvc serve` under load and under malformed HTTP: concurrent creates and reads are all
answered, and a request waitress cannot parse gets waitress's 400."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from processes import SETUP_TOML, call, clean_env, free_port, leadsvc, stop, wait_until_serving
from served import ServedProcess
from served import call as served_call


@pytest.mark.slow
def test_leadsvc_serve_on_sqlite_answers_concurrent_creates_and_reads(tmp_path):
    env = clean_env(LEADSVC_DATABASE_URL=f"sqlite:///{tmp_path}/served.sqlite3", LEADSVC_SERVER_THREADS="2")
    (tmp_path / "setup.toml").write_text(SETUP_TOML)

    ids = json.loads(leadsvc(env, tmp_path, "setup", "setup.toml", "--json"))
    token = json.loads(leadsvc(env, tmp_path, "tokens", "create", "--member", ids["members"]["admin@t.test"],
                               "--abilities", "*", "--json"))["token"]
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with (tmp_path / "serve.log").open("w") as log:
        process = subprocess.Popen([sys.executable, "-m", "leadsvc.cli", "serve", "--port", str(port)],
                                   env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until_serving(process, base)

        def create(i: int):
            return call("POST", f"{base}/api/v1/leads", token, {"first_name": f"Lead {i}", "phone": f"+9190000{i:05d}"})

        with ThreadPoolExecutor(12) as pool:
            creates = [pool.submit(create, i) for i in range(40)]
            reads = [pool.submit(call, "GET", f"{base}/api/v1/leads?page[size]=5", token) for _ in range(20)]
            created = [future.result() for future in creates]
            listed = [future.result() for future in reads]
        assert [status for status, _ in created] == [201] * 40
        assert [status for status, _ in listed] == [200] * 20
        assert len({body["data"]["id"] for _, body in created}) == 40
        again = call("POST", f"{base}/api/v1/leads", token, {"first_name": "Again", "phone": "+919000000007"})
        assert again[0] == 200 and again[1]["duplicate"] is True
        status, page = call("GET", f"{base}/api/v1/leads?page[size]=100", token)
        assert status == 200 and len(page["data"]) == 40
    finally:
        assert stop(process) == 0, (tmp_path / "serve.log").read_text()


# Requests waitress's parser refuses: a NUL and a DEL byte in a header value (neither is a visible
# character, RFC 9110 section 5.5), and a request line that is not one.
MALFORMED = {
    "nul in a header": b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Test: a\x00b\r\n\r\n",
    "del in a header": b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Test: a\x7fb\r\n\r\n",
    "garbage request line": b"\x16\x03\x01 not an http request\r\n\r\n",
}


def status_line(port: int, raw: bytes) -> bytes:
    """Send raw bytes on a new connection; the first line of the answer (empty if the server
    closed the connection without one)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as connection:
        connection.sendall(raw)
        answer = b""
        while b"\r\n" not in answer:
            chunk = connection.recv(4096)
            if not chunk:
                break
            answer += chunk
    return answer.split(b"\r\n", 1)[0]


@pytest.mark.slow
def test_a_request_waitress_cannot_parse_gets_its_400_and_serving_goes_on(database_url, tmp_path):
    environment = {"LEADSVC_DATABASE_URL": database_url, "LEADSVC_RATE_LIMITS_ENABLED": "false"}
    with ServedProcess(environment, tmp_path / "serve.log") as server:
        for name, raw in MALFORMED.items():
            # HTTP/1.0 or 1.1: waitress answers in the version it had read when it gave up.
            assert re.fullmatch(rb"HTTP/1\.[01] 400 Bad Request", status_line(server.port, raw)), name
        assert served_call(server.url, "GET", "/healthz").status == 200
