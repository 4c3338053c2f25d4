"""Real servers for the tests that need a socket: the one HTTP client for real requests (it never
raises on a status), the one in-thread server (waitress), the one launcher of server processes,
and a TCP proxy the test can cut."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import urlsplit

import waitress
from waitress import wasyncore

DEADLINE = 90   # seconds: generous, the machine may be busy; nothing here measures speed


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def call(base_url: str, method: str, path: str, *, json_body: Any = None, headers: dict[str, str] | None = None,
         timeout: float = 30) -> Reply:
    """One HTTP request on a fresh connection; OSError if the server cannot be reached or its
    answer breaks off (a server killed mid-response)."""
    parts = urlsplit(base_url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        body = None if json_body is None else json.dumps(json_body).encode()
        sent = dict(headers or {})
        if body is not None:
            sent.setdefault("Content-Type", "application/json")
        connection.request(method, path, body=body, headers=sent)
        response = connection.getresponse()
        return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
    except http.client.HTTPException as exc:
        raise ConnectionError(f"the answer broke off: {exc!r}") from exc
    finally:
        connection.close()


def wait_until(check: Callable[[], Any], deadline_seconds: float, what: str, interval: float = 0.05) -> Any:
    """Poll check() until it returns something truthy; fail with `what` after the deadline."""
    deadline = time.monotonic() + deadline_seconds
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except OSError as exc:
            last_error = exc
        time.sleep(interval)
    raise AssertionError(f"not within {deadline_seconds}s: {what} (last error: {last_error})")


def refuses_connections(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return False
    except OSError:
        return True


def clean_env(**settings: str) -> dict[str, str]:
    """The environment without any LEADSVC_* of the caller, plus these settings."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("LEADSVC_")}
    env.update(settings)
    return env


def leadsvc(env: dict[str, str], cwd: Any, *args: str) -> str:
    """Run a `leadsvc` command in a child process; its output, or fail with its errors."""
    result = subprocess.run([sys.executable, "-m", "leadsvc.cli", *args], env=env, cwd=cwd, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout


def race(base_url: str, racers: int, method: str, path: str, each: Callable[[int], dict] | None = None,
         **kwargs) -> list[Reply]:
    """`racers` requests released at the same moment, each on its own connection: identical, or
    racer n's with the arguments each(n) adds."""
    barrier = threading.Barrier(racers)
    replies: list[Reply] = []

    def run(n: int) -> None:
        barrier.wait()
        replies.append(call(base_url, method, path, **kwargs, **(each(n) if each else {})))

    threads = [threading.Thread(target=run, args=(n,)) for n in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return replies


@contextmanager
def held_in_another_thread(acquire: Callable[[], Any], release: Callable[[], Any]) -> Iterator[None]:
    """acquire() in another thread (a lock, a connection, a transaction), held there while the block
    runs, then release() in that thread."""
    acquired, done = threading.Event(), threading.Event()

    def hold() -> None:
        acquire()
        acquired.set()
        done.wait(60)
        release()

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert acquired.wait(30), "the other thread could not acquire"
        yield
    finally:
        done.set()
        thread.join()


class InProcessServer:
    """The app served by waitress in a thread of the test process (same database, same models)."""

    def __init__(self, app, threads: int = 4, **options: Any):
        """options: waitress settings besides these (serving.waitress_options gives the service's own)."""
        self.map: dict = {}   # the server's sockets, which the loop below watches
        self.server = waitress.create_server(app, map=self.map, host="127.0.0.1", port=0,
                                             **{"threads": threads, "ident": "leadsvc-test", **options})
        self.url = f"http://127.0.0.1:{self.server.effective_port}"
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        # waitress's own run() loops until its sockets close; this loop also stops when asked,
        # and closes them from its own thread.
        while not self.stopping.is_set():
            wasyncore.loop(timeout=0.05, map=self.map, count=1)
        self.server.task_dispatcher.shutdown()
        wasyncore.close_all(self.map)

    def __enter__(self) -> "InProcessServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        self.thread.join(30)


@dataclass
class ServedProcess:
    """A server in a child process, configured by LEADSVC_* variables only (none of the caller's):
    `leadsvc serve` by default, or `command`, where "{port}" stands for the port to listen on."""

    environment: dict[str, str]
    log_path: Path
    command: list[str] | None = None
    cwd: Path | None = None
    port: int = field(default_factory=free_port)
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, ready_within: float = DEADLINE) -> "ServedProcess":
        command = self.command or [sys.executable, "-m", "leadsvc.cli", "--config", os.devnull, "serve",
                                   "--host", "127.0.0.1", "--port", "{port}"]
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen([part.replace("{port}", str(self.port)) for part in command],
                                        env=clean_env(**self.environment), cwd=self.cwd,
                                        stdout=log, stderr=subprocess.STDOUT)
        log.close()
        wait_until(lambda: self.alive() and call(self.url, "GET", "/healthz", timeout=2).status == 200,
                   ready_within, f"the server answering on {self.url}; log: {self.log_path}")
        return self

    def alive(self) -> bool:
        if self.process is None or self.process.poll() is not None:
            raise AssertionError(f"the server exited; log:\n{self.log_path.read_text(errors='replace')[-3000:]}")
        return True

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, as in a power cut or an OOM kill."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(30)

    def stop(self) -> int | None:
        """SIGTERM, then the exit code (killing it if it does not stop within the deadline)."""
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(DEADLINE)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.process.returncode if self.process else None

    def __enter__(self) -> "ServedProcess":
        try:
            return self.start()
        except BaseException:
            self.stop()   # a server that never answered is not left running
            raise

    def __exit__(self, *exc) -> None:
        self.stop()


class TcpProxy:
    """A TCP relay to an upstream address that the test can cut (refuse and drop everything) and restore."""

    def __init__(self, upstream_host: str, upstream_port: int):
        self.upstream = (upstream_host, upstream_port)
        self.port = free_port()
        self.listener: socket.socket | None = None
        self.sockets: set[socket.socket] = set()
        self.lock = threading.Lock()

    def __enter__(self) -> "TcpProxy":
        self.restore()
        return self

    def __exit__(self, *exc) -> None:
        self.cut()

    def restore(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        """Close the listener and every relayed connection: the database is gone, as far as the client knows."""
        with self.lock:
            listener, self.listener = self.listener, None
            doomed, self.sockets = self.sockets, set()
        for sock in ([listener] if listener else []) + list(doomed):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self.lock:
                if self.listener is not listener:   # cut meanwhile
                    client.close()
                    upstream.close()
                    return
                self.sockets.update((client, upstream))
            for source, target in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, target), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                target.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock in (source, target):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()
            with self.lock:
                self.sockets.difference_update((source, target))
