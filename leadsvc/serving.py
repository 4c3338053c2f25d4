"""`leadsvc serve`: waitress, with a graceful stop on SIGTERM and SIGINT.

Left to itself waitress stops at once on SIGTERM (no handler). Here a signal ends the event loop
(which this module turns, over the server's socket map), the listening socket is closed (new connections are refused, so a load balancer moves on),
and the worker threads finish the requests they are serving, for at most
`server.shutdown_timeout`; then the server and the database pool are closed. A worker thread
writes its response to the socket itself, so those answers go out with the event loop stopped;
only what the socket cannot take at once (a large export to a slow client) would wait for the
loop, and is cut. Requests received but not yet started are not served: their connections close.
"""

from __future__ import annotations

import gc
import logging
import resource
import signal
import sys
from dataclasses import dataclass
from typing import Any, Mapping

from flask import Flask
from waitress import wasyncore
from waitress.server import create_server

from . import db

log = logging.getLogger("leadsvc")

PROXY_HEADERS = {"x-forwarded-for", "x-forwarded-proto", "x-forwarded-host", "x-forwarded-port"}
# Open files a serving process needs besides its client connections: the listening socket,
# waitress's wake-up pipe, database connections, logs, temporary files of large bodies and exports.
SPARE_FILES = 256


def waitress_options(app: Flask, server: Mapping[str, Any]) -> dict[str, Any]:
    """waitress settings from the [server] section; proxy headers only when a proxy is named."""
    options: dict[str, Any] = {
        "threads": server["threads"], "connection_limit": server["connection_limit"],
        "channel_timeout": server["channel_timeout"], "ident": "leadsvc",
        # select(), waitress's default, cannot watch a descriptor numbered past 1023: with
        # thousands of connections allowed, poll() is the one that works.
        "asyncore_use_poll": True,
        # No high watermark: with one, a worker thread waits while more than that many bytes of
        # its connection's output are unsent (also before serving a pipelined request), and
        # waitress never times out a connection whose request is running, so a client that stops
        # reading would hold the thread for as long as it stays connected. Unsent output past
        # outbuf_overflow (1 MiB) waits in a temporary file, and a connection that takes nothing
        # for channel_timeout seconds is closed. The one large response, the CSV export, is
        # handed over as a file (export.py).
        "outbuf_high_watermark": sys.maxsize,
        # Above every limit the app applies (extensions.body_limits), so an oversized body gets
        # our 413 problem document.
        "max_request_body_size": max(app.config["MAX_CONTENT_LENGTH"] * 16,
                                     app.config["LEADSVC"]["api"]["max_import_bytes"] * 2),
    }
    if server["trusted_proxy"]:
        options.update(trusted_proxy=server["trusted_proxy"], trusted_proxy_count=server["trusted_proxy_count"],
                       trusted_proxy_headers=PROXY_HEADERS, clear_untrusted_proxy_headers=True)
    return options


class CannotListen(Exception):
    """The address is taken, or not one of this machine's."""


@dataclass
class Listening:
    """A waitress server that listens, and the socket map its event loop watches (create_server's
    `map`): `run` turns that loop itself, so that a signal only has to set a flag."""

    server: Any
    sockets: dict

    @property
    def address(self) -> str:
        """host:port as bound (the port the system chose when asked for 0)."""
        return f"{self.server.effective_host}:{self.server.effective_port}"


def listen(app: Flask, host: str, port: int, wsgi: Any = None, **options: Any) -> Listening:
    """A waitress server for the app (or wsgi, a part of it) with the [server] settings, changed
    by options; listening but not yet serving."""
    sockets: dict = {}
    try:
        server = create_server(wsgi or app, map=sockets, host=host, port=port,
                               **{**waitress_options(app, app.config["LEADSVC"]["server"]), **options})
    except OSError as exc:
        raise CannotListen(f"Cannot listen on {host}:{port}: {exc.strerror or exc}.") from None
    return Listening(server, sockets)


# How long the event loop waits on its sockets before it looks again whether a signal asked it to stop.
LOOP_TICK = 1.0


def raise_open_file_limit(connections: int) -> None:
    """Raise this process's soft limit on open files to fit `connections` and SPARE_FILES, as far
    as the hard limit allows; say so when it does not."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = connections + SPARE_FILES
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if target < wanted:
        log.warning("server.connection_limit is %s, but this process may open only %s files: raise its hard "
                    "limit (ulimit -Hn, or LimitNOFILE in a systemd unit)", connections, hard)


def serve(app: Flask, host: str, port: int) -> None:
    """Serve until SIGTERM or SIGINT, then finish the requests being served and close the pool."""
    raise_open_file_limit(app.config["LEADSVC"]["server"]["connection_limit"])
    listening = listen(app, host, port)
    log.info("serving on http://%s", listening.address)
    # What start-up made (modules, the app, its schemas) lives as long as the process: left out of
    # the garbage collector's full passes, each of which stops every serving thread, they are shorter.
    gc.freeze()
    try:
        run(app, listening)
    finally:
        db.close()


def run(app: Flask, listening: Listening) -> None:
    """Run a listening server (from listen) in this thread, the main one, until SIGTERM or SIGINT;
    then finish the requests being served. The signal handler only sets a flag, which the loop
    reads between two turns: an exception raised from a handler could land inside waitress's own
    `except Exception` (closing a connection, say) and be swallowed, and the server would never
    stop. Only the loop's own thread stops it: a socket closed by another thread while the loop
    polls it is an error in the loop."""
    timeout = app.config["LEADSVC"]["server"]["shutdown_timeout"]
    stopping: list[str] = []

    def stop(signum: int, frame: Any) -> None:
        if stopping:   # a second signal while finishing: stop at once
            raise SystemExit(1)
        stopping.append(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        while not stopping:
            wasyncore.loop(timeout=LOOP_TICK, use_poll=True, map=listening.sockets, count=1)
        log.info("%s: no new connections; finishing the requests in flight", stopping[0])
        finish(listening.server, timeout)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def finish(server: Any, timeout: float) -> None:
    """Refuse new connections, let the worker threads finish their requests, close the server."""
    # The event loop that accepted connections has stopped; closing the listening socket now
    # makes new ones fail at once instead of waiting in the backlog. server.close() comes last:
    # it also closes the pipe the worker threads use to wake the loop.
    server.socket.close()
    server.task_dispatcher.shutdown(cancel_pending=True, timeout=timeout)
    server.close()
    log.info("stopped")
