"""A webhook receiver on 127.0.0.1 for the tests: records every request, answers as the test says."""

from __future__ import annotations

import json
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


class Receiver:
    """A threaded HTTP server that records POSTs and answers with `respond(request)`."""

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

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
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
