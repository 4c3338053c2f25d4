"""`leadsvc serve` under load and under malformed HTTP: concurrent creates and reads are all
answered, a request waitress cannot parse gets waitress's 400, and clients that never read a large
export hold no worker thread."""

from __future__ import annotations

import json
import random
import re
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

import pytest

from conftest import PROCESS_SETUP_TOML, bearer, bulk_leads
from leadsvc.models import Lead, Workspace
from served import ServedProcess, call, clean_env, leadsvc, wait_until


@pytest.mark.slow
def test_leadsvc_serve_on_sqlite_answers_concurrent_creates_and_reads(tmp_path):
    settings = dict(LEADSVC_DATABASE_URL=f"sqlite:///{tmp_path}/served.sqlite3", LEADSVC_SERVER_THREADS="2")
    env = clean_env(**settings)
    (tmp_path / "setup.toml").write_text(PROCESS_SETUP_TOML)

    ids = json.loads(leadsvc(env, tmp_path, "setup", "setup.toml", "--json"))
    token = json.loads(leadsvc(env, tmp_path, "tokens", "create", "--member", ids["members"]["admin@t.test"],
                               "--abilities", "*", "--json"))["token"]
    process = ServedProcess(settings, tmp_path / "serve.log", cwd=tmp_path,
                            command=[sys.executable, "-m", "leadsvc.cli", "serve", "--port", "{port}"])
    base = process.url
    try:
        process.start()

        def create(i: int):
            reply = call(base, "POST", "/api/v1/leads", headers=bearer(token),
                         json_body={"first_name": f"Lead {i}", "phone": f"+9190000{i:05d}"})
            return reply.status, reply.json()

        with ThreadPoolExecutor(12) as pool:
            creates = [pool.submit(create, i) for i in range(40)]
            reads = [pool.submit(call, base, "GET", "/api/v1/leads?page[size]=5", headers=bearer(token))
                     for _ in range(20)]
            created = [future.result() for future in creates]
            listed = [future.result() for future in reads]
        assert [status for status, _ in created] == [201] * 40
        assert [reply.status for reply in listed] == [200] * 20
        assert len({body["data"]["id"] for _, body in created}) == 40
        again = call(base, "POST", "/api/v1/leads", headers=bearer(token),
                     json_body={"first_name": "Again", "phone": "+919000000007"})
        assert again.status == 200 and again.json()["duplicate"] is True
        reply = call(base, "GET", "/api/v1/leads?page[size]=100", headers=bearer(token))
        status, page = reply.status, reply.json()
        assert status == 200 and len(page["data"]) == 40
    finally:
        assert process.stop() == 0, (tmp_path / "serve.log").read_text()


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
        assert call(server.url, "GET", "/healthz").status == 200


# waitress makes a worker thread wait while more than outbuf_high_watermark (16 MiB) of its
# connection's output is unsent, and the kernel takes up to tcp_wmem's 4 MiB more: an export of
# ~23 MiB (70,000 leads with a note each) is past both.
EXPORT_LEADS = 70_000
NOTE = "Called twice, wants a site visit on a weekend; budget confirmed with the family. " * 2
THREADS = 4
NEVER_READING = 2 * THREADS   # in each of two rounds


def vm_rss(pid: int) -> int:
    """The process's resident memory in bytes (/proc/PID/status VmRSS)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def never_reading_export(port: int, token: str) -> socket.socket:
    """A connection that asks for the export, and then /healthz in the same packet (pipelined),
    and never reads."""
    connection = socket.socket()
    # Set before connecting, so the window the client offers stays small.
    connection.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    connection.settimeout(60)
    connection.connect(("127.0.0.1", port))
    connection.sendall(f"GET /api/v1/leads/export.csv HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                       f"Authorization: Bearer {token}\r\n\r\n"
                       f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    return connection


def peeked_status(connection: socket.socket) -> int:
    """The status code of the first response on the connection, left unread."""
    return int(connection.recv(12, socket.MSG_PEEK).split()[1])


@pytest.mark.slow
def test_clients_that_never_read_an_export_leave_health_and_lists_answering_within_a_second(ws, database_url, tmp_path):
    bulk_leads(ws, EXPORT_LEADS, random.Random(11))
    workspace = Workspace.get(Workspace.public_id == ws.public_id)
    Lead.update(custom_fields={"notes_from_call": NOTE}).where(Lead.workspace == workspace.id).execute()
    admin, agent = ws.headers(), ws.headers("n1@t.test")
    environment = {"LEADSVC_DATABASE_URL": database_url, "LEADSVC_RATE_LIMITS_ENABLED": "false",
                   "LEADSVC_SERVER_THREADS": str(THREADS)}

    slowest = 0.0

    def answers_within_a_second() -> None:
        # The timeout is the assertion: a request that waits for a thread raises TimeoutError.
        nonlocal slowest
        started = time.monotonic()
        assert call(server.url, "GET", "/healthz", timeout=1).status == 200
        listed = call(server.url, "GET", "/api/v1/leads?page[size]=5", headers=agent, timeout=1)
        assert listed.status == 200 and len(listed.json()["data"]) == 5
        slowest = max(slowest, time.monotonic() - started)

    def an_export_writer_is_free() -> bool:
        # An unknown filter exports the header alone, through the same writers.
        return call(server.url, "GET", "/api/v1/leads/export.csv?filter[colour]=red", headers=admin,
                           timeout=5).status == 200

    with ServedProcess(environment, tmp_path / "serve.log") as server, ExitStack() as readers:
        exported = call(server.url, "GET", "/api/v1/leads/export.csv", headers=admin, timeout=60)
        assert exported.status == 200 and len(exported.body) > 20 * 2**20, len(exported.body)
        before = vm_rss(server.process.pid)

        for _ in range(2):   # the first round's clients still read nothing during the second
            connections = [readers.enter_context(never_reading_export(server.port, ws.token()))
                           for _ in range(NEVER_READING)]
            answers_within_a_second()
            statuses = [peeked_status(connection) for connection in connections]
            # Some are written; the rest find every export writer busy and are told to come back.
            assert 200 in statuses and set(statuses) <= {200, 429}, statuses
            wait_until(an_export_writer_is_free, 60, "an export writer free again")
            answers_within_a_second()
        # The unread exports (over 20 MiB each) wait in temporary files, not in memory.
        grown = vm_rss(server.process.pid) - before
        assert grown < 64 * 2**20, f"RSS grew by {grown / 2**20:.0f} MiB"
        # Handed to waitress as a file, whose size it knows.
        assert exported.headers["content-length"] == str(len(exported.body))
    print(f"\nnever-reading export clients ({database_url.split(':')[0]}): an export of "
          f"{len(exported.body) / 2**20:.1f} MiB, statuses {statuses}, health and list within {slowest:.2f} s, "
          f"RSS grew {grown / 2**20:.0f} MiB")


def test_serve_raises_the_open_file_limit_to_fit_the_connection_limit():
    script = ("import resource; from leadsvc.serving import SPARE_FILES, raise_open_file_limit; "
              "hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]; "
              "resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard)); raise_open_file_limit(4000); "
              "print(resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard, 4000 + SPARE_FILES)")
    soft, hard, wanted = map(int, subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                                                 check=True).stdout.split())
    assert soft == (wanted if hard < 0 else min(wanted, hard)) and soft > 256


@pytest.mark.slow
def test_thousands_of_idle_connections_leave_healthz_answering(tmp_path):
    with ServedProcess({"LEADSVC_DATABASE_URL": f"sqlite:///{tmp_path}/s.db", "LEADSVC_RATE_LIMITS_ENABLED": "false",
                        "LEADSVC_SERVER_CHANNEL_TIMEOUT": "600"}, tmp_path / "serve.log") as server, ExitStack() as stack:
        for _ in range(1500):
            stack.enter_context(socket.create_connection(("127.0.0.1", server.port), timeout=10))
        assert call(server.url, "GET", "/healthz", timeout=30).status == 200
