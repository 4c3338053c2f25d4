"""`leadsvc serve`: waitress, with a graceful stop on SIGTERM and SIGINT.

Left to itself waitress does not stop gracefully: SIGTERM kills the process at once (no handler),
and Ctrl-C stops the event loop first, so responses that worker threads finish afterwards are
never sent. Here a signal stops the loop, the listening socket is closed (new connections are
refused, so a load balancer moves on), and the loop keeps running until every request already
received has been answered and sent, or `server.shutdown_timeout` passes. Then the worker
threads stop and the database pool is closed.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
import warnings
from collections import deque
from typing import Any, Mapping

import peewee as pw
from flask import Flask
from waitress import wasyncore
from waitress.server import create_server
from waitress.task import ThreadedTaskDispatcher

from .db import database

READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

log = logging.getLogger("leadsvc")

PROXY_HEADERS = {"x-forwarded-for", "x-forwarded-proto", "x-forwarded-host", "x-forwarded-port"}

# A response is sent by the thread that made it only once this much of it is waiting, else by the
# event loop when the request is done: a JSON document goes out in one send, not its headers and
# then its body. waitress's default (1, since 1.3) has the worker send each piece at once while
# the event loop, seeing output waiting, wakes over and over to try the same lock: creates on
# PostgreSQL at 8 connections made 20 select() and 95 futex calls each (2 and 70 with 18,000,
# waitress's default before 1.3) and spent 9% more CPU. Deprecated in waitress but kept through
# 3.0, which is pinned.
SEND_BYTES = 18_000


def waitress_options(app: Flask, server: Mapping[str, Any]) -> dict[str, Any]:
    """waitress settings from the [server] section; proxy headers only when a proxy is named."""
    options: dict[str, Any] = {
        "threads": server["threads"], "connection_limit": server["connection_limit"],
        "channel_timeout": server["channel_timeout"], "ident": "leadsvc", "send_bytes": SEND_BYTES,
        # Above Flask's MAX_CONTENT_LENGTH, so an oversized body gets our 413 problem document.
        "max_request_body_size": app.config["MAX_CONTENT_LENGTH"] * 16,
    }
    if server["trusted_proxy"]:
        options.update(trusted_proxy=server["trusted_proxy"], trusted_proxy_count=server["trusted_proxy_count"],
                       trusted_proxy_headers=PROXY_HEADERS, clear_untrusted_proxy_headers=True)
    return options


class WritesInOrder(ThreadedTaskDispatcher):
    """waitress's pool of threads for reads, and one more thread that serves the write requests
    in the order they arrive (SQLite).

    SQLite takes one write at a time, and db._QueuedSqlite queues the writes of a process on a
    mutex. With writes spread over the pool, each write woke a thread that then waited for the
    mutex and, woken again, for the GIL while the previous writer finished its response: creates
    at 8 connections cost 22 context switches each and about a fifth more CPU than when one thread
    served them all (9 switches). Here the pool never sees a write; the writer thread takes the
    next one as soon as it is done with the last. The mutex stays, for the other ways in (the
    CLI, an app that embeds the service), but within `leadsvc serve` nobody waits on it.

    waitress hands a dispatcher a channel (a connection) whose first request is complete; a
    channel that pipelines requests is served where its first one goes, which is still correct:
    reads never need the writer thread, and a write on a pool thread queues on the mutex.
    """

    def __init__(self) -> None:
        super().__init__()
        self.writes: deque = deque()
        self.writes_cv = threading.Condition(self.lock)
        self.writer: threading.Thread | None = None
        self.writer_stopping = False

    def set_thread_count(self, count: int) -> None:
        with self.lock:
            if count and self.writer is None:
                self.writer = threading.Thread(target=self.serve_writes, name="waitress-writer", daemon=True)
                self.writer.start()
        super().set_thread_count(count)

    def add_task(self, task: Any) -> None:
        requests = getattr(task, "requests", None)
        if not requests or requests[0].command in READ_METHODS:
            super().add_task(task)
            return
        with self.lock:
            self.writes.append(task)
            self.writes_cv.notify()

    def serve_writes(self) -> None:
        while True:
            with self.lock:
                while not self.writes and not self.writer_stopping:
                    self.writes_cv.wait()
                if self.writer_stopping:
                    return
                task = self.writes.popleft()
            try:
                task.service()
            except BaseException:
                self.logger.exception("Exception when servicing %r", task)

    def shutdown(self, cancel_pending: bool = True, timeout: float = 5) -> bool:
        started = time.monotonic()
        with self.lock:
            self.writer_stopping = True
            self.writes_cv.notify_all()
        if self.writer is not None:
            self.writer.join(timeout)
            if self.writer.is_alive():
                self.logger.warning("the writer thread is still running")
        with self.lock:
            if cancel_pending and self.writes:
                self.logger.warning("Canceling %d pending write task(s)", len(self.writes))
            while cancel_pending and self.writes:
                self.writes.popleft().cancel()
        return super().shutdown(cancel_pending, max(0.0, timeout - (time.monotonic() - started)))


def task_dispatcher(threads: int) -> ThreadedTaskDispatcher:
    """The dispatcher for the configured database: on SQLite the writes go to a thread of their own."""
    dispatcher = WritesInOrder() if isinstance(database.obj, pw.SqliteDatabase) else ThreadedTaskDispatcher()
    dispatcher.set_thread_count(threads)
    return dispatcher


class CannotListen(Exception):
    """The address is taken, or not one of this machine's."""


def listen(app: Flask, host: str, port: int) -> Any:
    """A waitress server for the app with the [server] settings, listening but not yet serving."""
    options = waitress_options(app, app.config["LEADSVC"]["server"])
    dispatcher = task_dispatcher(options["threads"])
    try:
        # _dispatcher is create_server's parameter for a dispatcher made outside (waitress 3.0 is
        # pinned: WritesInOrder extends its ThreadedTaskDispatcher).
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "send_bytes", DeprecationWarning)   # see SEND_BYTES
            return create_server(app, host=host, port=port, _dispatcher=dispatcher, **options)
    except OSError as exc:
        dispatcher.shutdown()
        raise CannotListen(f"Cannot listen on {host}:{port}: {exc.strerror or exc}.") from None


def serve(app: Flask, host: str, port: int) -> None:
    """Serve until SIGTERM or SIGINT, then finish the requests in flight and close the pool."""
    settings = app.config["LEADSVC"]["server"]
    server = listen(app, host, port)

    stopping: list[str] = []

    def stop(signum: int, frame: Any) -> None:
        if stopping:   # a second signal while draining: stop at once
            raise SystemExit(1)
        stopping.append(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    log.info("serving on http://%s:%s", server.effective_host, server.effective_port)
    try:
        # One poll at a time (at most asyncore_loop_timeout, 1 s), so a signal is seen between polls
        # and never interrupts waitress halfway through handling a socket.
        while not stopping:
            wasyncore.loop(timeout=server.adj.asyncore_loop_timeout, map=server._map,
                           use_poll=server.adj.asyncore_use_poll, count=1)
        log.info("%s: no new connections; finishing the requests in flight", stopping[0])
        drain(server, settings["shutdown_timeout"])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        close_database()


def drain(server: Any, timeout: float) -> None:
    """Stop listening, answer what was received, close idle connections, stop the threads."""
    server.accepting = False
    server.del_channel()
    server.socket.close()
    deadline = time.monotonic() + timeout
    while True:
        busy = 0
        for channel in list(server._map.values()):
            if channel is server.trigger:
                continue
            if channel.requests or channel.total_outbufs_len:
                busy += 1
            else:
                channel.will_close = True   # idle keep-alive connections close now
        if not busy and len(server._map) <= 1:
            break
        if time.monotonic() >= deadline:
            log.warning("shutdown_timeout passed with %d request(s) unfinished", busy)
            break
        wasyncore.loop(timeout=0.05, map=server._map, use_poll=server.adj.asyncore_use_poll, count=1)
    server.task_dispatcher.shutdown(timeout=max(1.0, deadline - time.monotonic()))
    wasyncore.close_all(server._map)
    log.info("stopped")


def close_database() -> None:
    """Close this thread's connection and, on PostgreSQL, every pooled one."""
    db = database.obj
    if db is None:
        return
    if not db.is_closed():
        db.close()
    if hasattr(db, "close_all"):
        db.close_all()
