"""Request ids, the access log and log formatting.

Every response carries `X-Request-ID` (echoed when the client sent a sane one, generated
otherwise), and every log record made while a request runs carries it too. The library never
installs log handlers: `leadsvc serve` calls `configure_logging`, and an app that embeds the
service keeps its own handlers, to which the `leadsvc` logger propagates.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import sys
import time
from typing import Any, Mapping

from flask import Flask, Response, g, has_request_context, request, request_finished


REQUEST_ID_HEADER = "X-Request-ID"
_SANE_REQUEST_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@/+=-]{0,127}$")

# The methods HTTP defines (RFC 9110, PATCH from RFC 5789, and QUERY, the HTTP working group's
# safe method with a body). waitress passes any token as a
# method, so anything else is refused with a 501 and counted and logged under one name: what a
# client makes up must never become a new metric series or a line of its own size.
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT", "QUERY"})
OTHER_METHOD = "OTHER"
# How much of a request's path the access log writes: every route of the service is far shorter,
# and a request line may take hundreds of kilobytes.
LOGGED_PATH_CHARS = 512

log = logging.getLogger("leadsvc")
access_log = logging.getLogger("leadsvc.access")

# The attributes every LogRecord has; anything else on a record came from `extra=` and is logged.
_RECORD_ATTRIBUTES = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}

# Control characters (C0, DEL, C1) and the Unicode line and paragraph separators. Paths, headers
# and exception messages carry what clients sent: raw, these end a log line early (a forged record
# after them) or rewrite a terminal.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_SHORT_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escape_controls(text: str) -> str:
    """The text on one line: each control character as a backslash escape (\\n, \\x1b, \\u2028)."""
    def escaped(match: re.Match[str]) -> str:
        char = match.group()
        return _SHORT_ESCAPES.get(char) or (f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")
    return _CONTROL.sub(escaped, text)


def init_app(app: Flask) -> None:
    @app.before_request
    def assign_request_id() -> None:
        g.request_started = time.perf_counter()
        sent = request.headers.get(REQUEST_ID_HEADER, "")
        g.request_id = sent if _SANE_REQUEST_ID.match(sent) else new_request_id()

    @app.after_request
    def echo_request_id(response: Response) -> Response:
        response.headers[REQUEST_ID_HEADER] = g.get("request_id") or new_request_id()
        return response

    if app.config["LEADSVC"]["logging"]["access_log"]:
        request_finished.connect(log_access, app)


def new_request_id() -> str:
    """32 random hex digits."""
    return secrets.token_hex(16)


def request_method() -> str:
    """The request's method if HTTP defines it, else OTHER."""
    return request.method if request.method in HTTP_METHODS else OTHER_METHOD


def logged_path() -> str:
    """The request's path, cut to LOGGED_PATH_CHARS with an ellipsis when longer."""
    path = request.path
    return path if len(path) <= LOGGED_PATH_CHARS else path[:LOGGED_PATH_CHARS] + "\u2026"


def request_route() -> str:
    """The route template of the current request (`/api/v1/leads/<public_id>`), never its values."""
    rule = request.url_rule
    return rule.rule if rule is not None else "(unmatched)"


def log_access(app: Flask, response: Response, **extra: Any) -> None:
    """Flask's request_finished receiver: sent after every after_request hook, for every answer
    (problem documents, 405s and 501s too), so the line has the final status."""
    if not access_log.isEnabledFor(logging.INFO):   # a level above INFO: no record to build
        return
    started = g.get("request_started")
    caller = g.get("caller")   # only if the request authenticated: never look a token up here
    method, path = request_method(), logged_path()
    access_log.info(
        "%s %s %s", method, path, response.status_code,
        extra={"request_id": g.get("request_id"), "method": method, "path": path,
               "route": request_route(), "status": response.status_code,
               "duration_ms": round((time.perf_counter() - started) * 1000, 2) if started else None,
               "remote_addr": request.remote_addr,
               # the token's public id (tok_...), never its secret or the Authorization header
               "token_id": caller.token.public_id if caller else None},
    )


class RequestIdFilter(logging.Filter):
    """Adds the current request's id to records logged while a request runs."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None and has_request_context():
            record.request_id = g.get("request_id")
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request_id and any `extra` fields."""

    converter = time.gmtime   # times in UTC, as the API's

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update({key: value for key, value in vars(record).items()
                      if key not in _RECORD_ATTRIBUTES and value is not None})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        # json.dumps escapes C0 controls only; the others can stand only inside strings, as \\u escapes.
        return _CONTROL.sub(lambda match: f"\\u{ord(match.group()):04x}",
                            json.dumps(entry, ensure_ascii=False, default=str))


class TextFormatter(logging.Formatter):
    """A readable line, with the request id when there is one. Control characters in it are escaped,
    and a traceback's lines are indented under it, so that every line starting with a time starts
    a record."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        # Formatter.format would reuse a traceback another handler formatted (record.exc_text).
        record.message = record.getMessage()
        record.asctime = self.formatTime(record, self.datefmt)
        line = self.formatMessage(record)
        request_id = getattr(record, "request_id", None)
        parts = [escape_controls(f"{line} [{request_id}]" if request_id else line)]
        if record.exc_info:
            parts.append(self.formatException(record.exc_info))
        if record.stack_info:
            parts.append(self.formatStack(record.stack_info))
        return "\n".join([parts[0], *("  " + escape_controls(text) for part in parts[1:]
                                        for text in part.split("\n"))])


def configure_logging(settings: Mapping[str, Any], stream: Any = None) -> logging.Handler:
    """For `leadsvc serve` and the other commands: one handler on the root logger (waitress logs too)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if settings["format"] == "json" else TextFormatter())
    handler.addFilter(RequestIdFilter())
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "leadsvc", False)]:
        root.removeHandler(old)
    handler.leadsvc = True
    root.addHandler(handler)
    root.setLevel(settings["level"].upper())
    return handler
