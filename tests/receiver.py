"""A webhook receiver on 127.0.0.1 for the tests: records every request, answers as the test says."""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from standardwebhooks import Webhook


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    path: str
    at: float

    @property
    def event(self) -> dict[str, Any]:
        return json.loads(self.body)

    def verified(self, secret: str) -> dict[str, Any]:
        """The body, if the signature verifies with this secret (as a receiver checks it)."""
        return Webhook(secret).verify(self.body, self.headers)


# (status, headers, body) a receiver answers with; the default answers every request 204.
Answer = tuple[int, dict[str, str], bytes]


class ReceiverServer(ThreadingHTTPServer):
    daemon_threads = True
    # Two delivering processes connect 16 at a time: past socketserver's backlog of 5 the kernel
    # resets connections, and the deliveries retry them (attempts 2 where a test expects 1).
    request_queue_size = 128


class Receiver:
    """A threaded HTTP server that records POSTs and GETs and answers with `respond(request)`."""

    def __init__(self, respond: Callable[[Received], Answer] | None = None):
        self.received: list[Received] = []
        self.lock = threading.Lock()
        self.respond = respond or (lambda request: (204, {}, b""))
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"   # keep-alive, as a real receiver

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                request = Received({k.lower(): v for k, v in self.headers.items()}, self.rfile.read(length),
                                   self.path, time.time())
                with receiver.lock:
                    receiver.received.append(request)
                status, headers, body = receiver.respond(request)
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST   # a fake API read with GET (the Graph API, IndiaMART's listing) records and answers the same way

            def log_message(self, *args):
                pass

        self.server = ReceiverServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.url = f"{self.base}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "Receiver":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def events(self) -> list[dict[str, Any]]:
        with self.lock:
            return [request.event for request in self.received]

    def of_type(self, event_type: str) -> list[dict[str, Any]]:
        return [event for event in self.events() if event["type"] == event_type]


class RawReceiver:
    """A receiver that answers each request with bytes no HTTP library would write: `answer(sock)`
    writes what it likes (a broken status line, a head trickled a byte at a time), then the
    connection closes."""

    def __init__(self, answer: Callable[[socket.socket], None]):
        self.answer = answer
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)   # accept() looks at `stopping` this often
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/hook"
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while not self.stopping.is_set():
            try:
                connection, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            connection.settimeout(30)
            threading.Thread(target=self._answer, args=(connection,), daemon=True).start()

    def _answer(self, connection: socket.socket) -> None:
        with connection:
            try:
                self._read_request(connection)
                self.answer(connection)
            except OSError:
                pass   # the sender gave up on the connection

    @staticmethod
    def _read_request(connection: socket.socket) -> None:
        """Read the whole request, so that closing the connection does not reset it."""
        received = b""
        while b"\r\n\r\n" not in received:
            received += connection.recv(65536) or b"\r\n\r\n"
        head, _, body = received.partition(b"\r\n\r\n")
        length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        while len(body) < length and (chunk := connection.recv(65536)):
            body += chunk

    def __enter__(self) -> "RawReceiver":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        self.thread.join()
        self.listener.close()
