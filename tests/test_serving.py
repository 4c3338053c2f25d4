"""serving: on SQLite the writes of `leadsvc serve` go to one thread, in order (WritesInOrder);
a response goes out in one send once its request is done, unless it is large (SEND_BYTES)."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
from flask import Flask
from waitress.channel import HTTPChannel
from waitress.task import ThreadedTaskDispatcher

from leadsvc import serving
from served import InProcessServer
from processes import SETUP_TOML, call, clean_env, free_port, leadsvc, stop, wait_until_serving


class FakeChannel:
    """What waitress hands a dispatcher: a connection whose first request is complete."""

    def __init__(self, method: str, log: list, gate: threading.Event | None = None):
        self.requests = [SimpleNamespace(command=method)]
        self.log, self.gate = log, gate
        self.started, self.done = threading.Event(), threading.Event()
        self.cancelled = False

    def service(self) -> None:
        self.started.set()
        if self.gate is not None:
            assert self.gate.wait(10)
        self.log.append((self.requests[0].command, threading.current_thread().name))
        self.done.set()

    def cancel(self) -> None:
        self.cancelled = True


@pytest.fixture
def dispatcher():
    dispatcher = serving.WritesInOrder()
    dispatcher.set_thread_count(2)
    yield dispatcher
    dispatcher.shutdown(timeout=10)


def test_writes_are_served_by_one_thread_in_the_order_they_arrive_and_reads_by_the_pool(dispatcher):
    log: list = []
    tasks = [FakeChannel(method, log) for method in ("POST", "GET", "PATCH", "DELETE", "HEAD", "POST", "PUT")]
    for task in tasks:
        dispatcher.add_task(task)
    for task in tasks:
        assert task.done.wait(10)
    writes = [entry for entry in log if entry[0] not in ("GET", "HEAD")]
    assert [method for method, _ in writes] == ["POST", "PATCH", "DELETE", "POST", "PUT"]
    assert {thread for _, thread in writes} == {"waitress-writer"}
    assert all(thread != "waitress-writer" for method, thread in log if method in ("GET", "HEAD"))


def test_a_write_in_progress_holds_up_the_next_write_but_no_read(dispatcher):
    log: list = []
    gate = threading.Event()
    slow_write, next_write = FakeChannel("POST", log, gate), FakeChannel("POST", log)
    dispatcher.add_task(slow_write)
    dispatcher.add_task(next_write)
    read = FakeChannel("GET", log)
    dispatcher.add_task(read)
    assert read.done.wait(10), "a read waited for a write"
    assert not next_write.done.is_set()
    gate.set()
    assert next_write.done.wait(10)
    assert [method for method, _ in log] == ["GET", "POST", "POST"]


def test_shutdown_lets_the_write_in_progress_finish_and_cancels_the_queued_ones():
    dispatcher = serving.WritesInOrder()
    dispatcher.set_thread_count(1)
    log: list = []
    gate = threading.Event()
    running, queued = FakeChannel("POST", log, gate), FakeChannel("POST", log)
    dispatcher.add_task(running)
    dispatcher.add_task(queued)
    assert running.started.wait(10)
    threading.Timer(0.2, gate.set).start()
    dispatcher.shutdown(timeout=10)
    assert running.done.is_set() and not running.cancelled
    assert queued.cancelled and not queued.done.is_set()
    assert not dispatcher.writer.is_alive() and not dispatcher.threads


def test_only_sqlite_gets_a_writer_thread(app, database_url):
    dispatcher = serving.task_dispatcher(2)
    try:
        if database_url.startswith("sqlite"):
            assert isinstance(dispatcher, serving.WritesInOrder)
        else:
            assert type(dispatcher) is ThreadedTaskDispatcher
    finally:
        dispatcher.shutdown(timeout=10)


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


def test_a_small_response_goes_out_in_one_send_and_a_large_one_whole(app, monkeypatch):
    site = Flask("sends")
    site.config.update(app.config)   # the [server] settings serving.listen reads
    site.add_url_rule("/small", "small", lambda: "s" * 900)
    site.add_url_rule("/large", "large", lambda: "l" * (3 * serving.SEND_BYTES))
    sends: list[int] = []
    send = HTTPChannel.send

    def counted(channel, data, do_close=True):
        sends.append(len(data))   # before sending: the client may read the response at once
        return send(channel, data, do_close)

    monkeypatch.setattr(HTTPChannel, "send", counted)
    with InProcessServer(site, server=serving.listen(site, "127.0.0.1", 0)) as served:
        connection = http.client.HTTPConnection("127.0.0.1", served.server.effective_port, timeout=10)
        connection.request("GET", "/small")
        small = connection.getresponse()
        assert small.status == 200 and small.read() == b"s" * 900
        assert len(sends) == 1 and sends[0] > 900   # headers and body together
        connection.request("GET", "/large")
        large = connection.getresponse()
        assert large.status == 200 and large.read() == b"l" * (3 * serving.SEND_BYTES)
        connection.close()
