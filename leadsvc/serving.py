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
import time
from typing import Any, Mapping

from flask import Flask
from waitress import wasyncore
from waitress.server import create_server

from .db import database

log = logging.getLogger("leadsvc")

PROXY_HEADERS = {"x-forwarded-for", "x-forwarded-proto", "x-forwarded-host", "x-forwarded-port"}


def waitress_options(app: Flask, server: Mapping[str, Any]) -> dict[str, Any]:
    """waitress settings from the [server] section; proxy headers only when a proxy is named."""
    options: dict[str, Any] = {
        "threads": server["threads"], "connection_limit": server["connection_limit"],
        "channel_timeout": server["channel_timeout"], "ident": "leadsvc",
        # Above Flask's MAX_CONTENT_LENGTH, so an oversized body gets our 413 problem document.
        "max_request_body_size": app.config["MAX_CONTENT_LENGTH"] * 16,
    }
    if server["trusted_proxy"]:
        options.update(trusted_proxy=server["trusted_proxy"], trusted_proxy_count=server["trusted_proxy_count"],
                       trusted_proxy_headers=PROXY_HEADERS, clear_untrusted_proxy_headers=True)
    return options


class CannotListen(Exception):
    """The address is taken, or not one of this machine's."""


def serve(app: Flask, host: str, port: int) -> None:
    """Serve until SIGTERM or SIGINT, then finish the requests in flight and close the pool."""
    settings = app.config["LEADSVC"]["server"]
    try:
        server = create_server(app, host=host, port=port, **waitress_options(app, settings))
    except OSError as exc:
        raise CannotListen(f"Cannot listen on {host}:{port}: {exc.strerror or exc}.") from None

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
