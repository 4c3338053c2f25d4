"""Idempotency-Key on every POST: a retry with the same key and body gets the first response again.

Hooked once in create_app, so every POST of every blueprint takes part:

- A key belongs to its caller: the token for requests with a valid token, the client IP for
  requests without an Authorization header (web forms). A request with an invalid token is a 401
  and keeps no key.
- A response recorded for (caller, key) in the last 24 hours is replayed: status, body,
  Content-Type, Location, ETag and Link, plus `Idempotent-Replayed: true`. If it was recorded for
  another method, path or body, the answer is 422 with `errors.Idempotency-Key`.
- Otherwise the request runs in one database transaction that first inserts the key's row. The
  unique index on (scope, key) makes a concurrent request with the same key wait for this one
  and then replay its response; the view's own transactions become savepoints; the response is
  written into the row in the same transaction as the changes it reports, so a crash keeps
  neither, and a retry then runs afresh.
- A view whose class says `commits_in_steps` (the batch) commits its own steps instead, as it does
  without a key: holding one transaction across them would hold SQLite's write lock, and every
  other workspace's writes, for the whole request. Its key's reservation and its recorded
  response are then each a short transaction of their own; a concurrent request with the key is
  409 while the reservation is open, and a reservation its process never finished lapses after
  RESERVED_FOR, so that a retry then runs afresh.
- Recorded: 2xx, and 4xx other than 401, 403 and 429 (those depend on the token or the moment,
  not on the request). A secret shown once (a new webhook's) is recorded as null: a replay
  never shows it again. On a 5xx nothing is recorded, and everything the request did rolls back
  (but the steps a view that commits in steps had committed).
- A request that waits for another with its key longer than LOCK_WAIT_MS gets 409 `conflict`
  on PostgreSQL; SQLite queues all writers on its busy timeout, past which the answer is 503.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Callable

import peewee as pw
from flask import Flask, Response, current_app, g, request

from .auth import current_caller
from .db import any_of, database, is_postgres, sqlstate, transaction
from .limits import caller_key
from .models import IdempotencyKey, utcnow
from .problems import Conflict, ValidationFailed

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
KEY_PATTERN = re.compile(r"[\x21-\x7e]{1,255}")   # printable ASCII without spaces, e.g. a UUID
LEAD_IN_PATH = re.compile(r"<lead_id:(\w+)>")     # a route argument that names a lead
KEEP = timedelta(hours=24)
# How long an unfinished reservation blocks its key: far longer than any request runs.
RESERVED_FOR = timedelta(minutes=10)
REPLAYED_HEADERS = ("Content-Type", "Location", "ETag", "Link")
UNRECORDED_STATUSES = frozenset({401, 403, 429})
LOCK_WAIT_MS = 10_000
# Expired keys each new key deletes: more than the one it adds, so expired keys cannot pile up
# however fast keys come, and each purge stays a short walk of the expires_at index.
PURGE_PER_KEY = 2
_LOCK_NOT_AVAILABLE = "55P03"   # PostgreSQL: lock_timeout expired


class _Rollback(Exception):
    pass


@dataclass
class Reservation:
    """The key's row, and the transaction held open around the request from reserve to record
    (None when the request commits its own steps)."""

    row: IdempotencyKey
    transaction: Any = None

    def keep(self, write: Callable[[], Any]) -> None:
        """Write the outcome into the key's row and commit (errors propagate: with a held
        transaction the request then fails as a whole)."""
        if self.transaction is None:
            with transaction():
                write()
            return
        write()
        self.transaction.__exit__(None, None, None)

    def abandon(self) -> None:
        """Roll back, or free the key of a request that committed its own steps (never raises)."""
        try:
            if self.transaction is None:
                with transaction():
                    IdempotencyKey.delete().where(IdempotencyKey.id == self.row.id).execute()
            else:
                self.transaction.__exit__(_Rollback, _Rollback(), None)
        except pw.PeeweeException:
            pass   # the connection is gone: the transaction with it, and an open reservation lapses


def init_app(app: Flask) -> None:
    """Register after the rate limiter, so that a 429 never reserves a key."""
    app.before_request(reserve)
    app.after_request(record)
    app.teardown_request(release)


def reserve() -> Response | None:
    """Replay a recorded response, or reserve the key (and let the request run in its transaction)."""
    key = request.headers.get(HEADER)
    if request.method != "POST" or key is None or request.routing_exception is not None:
        return None   # no route, no operation to repeat (and unknown routes are not rate limited)
    if current_caller() is None and request.blueprint != "forms":
        return None   # no valid token where one is needed: the view answers 401, never recorded
    if not KEY_PATTERN.fullmatch(key):
        raise ValidationFailed.field(HEADER, "Use 1 to 255 printable ASCII characters without spaces, such as a UUID.")
    scope, digest = caller_key(), request_hash()
    recorded = _recorded(scope, key)
    if recorded is not None:
        return _replay(recorded, digest)
    held = None if _commits_in_steps() else transaction()
    if held is not None:
        held.__enter__()   # the request's own transaction: the reservation is its first write
    try:
        with transaction() if held is None else contextlib.nullcontext():
            row = _insert(scope, key, digest)
    except (pw.IntegrityError, pw.OperationalError) as exc:
        if held is not None:
            Reservation(None, held).abandon()
        if isinstance(exc, pw.OperationalError) and not _lock_wait_expired(exc):
            raise
        recorded = _recorded(scope, key) if isinstance(exc, pw.IntegrityError) else None
        if recorded is None:
            raise Conflict("A request with this Idempotency-Key is still in progress; retry in a moment.",
                           headers={"Retry-After": "1"}) from None
        return _replay(recorded, digest)
    g.idempotency = Reservation(row, held)
    return None


def _commits_in_steps() -> bool:
    """Whether the request's view commits its own steps (see the module's docstring)."""
    view = current_app.view_functions.get(request.endpoint)
    return getattr(getattr(view, "view_class", None), "commits_in_steps", False)


def record(response: Response) -> Response:
    """Keep the response with the key and commit, or roll everything back on a 5xx."""
    reservation = g.pop("idempotency", None)
    if reservation is None:
        return response
    if response.status_code >= 500:
        reservation.abandon()
        return response
    row = reservation.row

    def write() -> None:
        if response.status_code in UNRECORDED_STATUSES or response.is_streamed:
            IdempotencyKey.delete().where(IdempotencyKey.id == row.id).execute()
            return
        row.status = response.status_code
        row.headers = {name: response.headers[name] for name in REPLAYED_HEADERS if name in response.headers}
        row.body = _without_secret(response.get_data()) if g.pop("shows_secret", False) else response.get_data()
        row.expires_at = row.created_at + KEEP
        row.save()

    reservation.keep(write)
    return response


def shows_secret() -> None:
    """The response carries a secret shown once (data.secret): its recorded copy keeps it null."""
    g.shows_secret = True


def _without_secret(body: bytes) -> bytes:
    document = json.loads(body)
    document["data"]["secret"] = None
    return current_app.json.dumps(document).encode()   # replayed as the answer: the app's encoder


def release(exc: BaseException | None) -> None:
    """A request that ended without record() (an error in a later hook) rolls back."""
    reservation = g.pop("idempotency", None)
    if reservation is not None:
        reservation.abandon()


def request_hash() -> str:
    """sha256 of the method, the path with its query and the body (JSON bodies in a canonical form)."""
    body = request.get_data(cache=True)
    if request.is_json:
        try:
            body = json.dumps(json.loads(body), sort_keys=True, separators=(",", ":")).encode()
        except (ValueError, RecursionError):
            pass   # hashed as sent; the parser rejects it with 422
    digest = hashlib.sha256()
    for part in (request.method.encode(), request.full_path.encode(), body):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()


def _recorded(scope: str, key: str) -> IdempotencyKey | None:
    return (IdempotencyKey.select()
            .where((IdempotencyKey.scope == scope) & (IdempotencyKey.key == key)
                   & (IdempotencyKey.expires_at > utcnow()) & (IdempotencyKey.status > 0))
            .first())


def _replay(recorded: IdempotencyKey, digest: str) -> Response:
    if recorded.request_hash != digest:
        raise ValidationFailed.field(HEADER, "This key was already used for another request (method, path or "
                                             "body); use a new key for a new request.")
    response = Response(bytes(recorded.body), status=recorded.status)
    for name, value in recorded.headers.items():
        response.headers[name] = value
    response.headers[REPLAYED_HEADER] = "true"
    return response


def _insert(scope: str, key: str, digest: str) -> IdempotencyKey:
    now = utcnow()
    IdempotencyKey.delete().where((IdempotencyKey.scope == scope) & (IdempotencyKey.key == key)
                                  & (IdempotencyKey.expires_at <= now)).execute()
    _purge_expired(now)
    if is_postgres():
        # Waiting here means another request with this key is running; bound the wait.
        database.execute_sql(f"SET LOCAL lock_timeout = {LOCK_WAIT_MS}")
    try:
        with database.atomic():   # a savepoint: a failed insert leaves the transaction usable
            return IdempotencyKey.create(scope=scope, key=key, request_hash=digest, status=0, headers={},
                                         body=b"", created_at=now, expires_at=now + RESERVED_FOR,
                                         lead_public_id=_lead_named())
    finally:
        if is_postgres():
            database.execute_sql("SET LOCAL lock_timeout TO DEFAULT")


def _lead_named() -> str | None:
    """The public id of the lead the request's route names, if any: the response belongs to it.
    Read from the route's pattern, so every route under /leads/{id} is covered as it is added."""
    named = LEAD_IN_PATH.search(request.url_rule.rule)
    return request.view_args[named.group(1)] if named else None


def forget(lead_public_id: str, terms: list[str]) -> int:
    """Delete the recorded responses of requests that named the lead, and those that hold any of
    the terms (its phone or e-mail: a create's or a batch's answer), in the caller's transaction:
    an erased lead's data must not come back in a replay."""
    held = [_body_holds(term.encode()) for term in (lead_public_id, *terms)]
    return IdempotencyKey.delete().where((IdempotencyKey.lead_public_id == lead_public_id) | any_of(held)).execute()


def _body_holds(term: bytes) -> pw.Expression:
    """Whether a recorded body contains these bytes: a plain substring test (LIKE would read `_` and
    `%` in an e-mail as wildcards, and SQLite's LIKE does not read BLOBs at all)."""
    if is_postgres():
        return pw.NodeList((pw.SQL("position("), pw.Value(term), pw.SQL("IN"), IdempotencyKey.body, pw.SQL(") > 0")))
    return pw.fn.instr(IdempotencyKey.body, term) > 0


def _lock_wait_expired(exc: pw.OperationalError) -> bool:
    return sqlstate(exc) == _LOCK_NOT_AVAILABLE


def _purge_expired(now: datetime) -> None:
    """Delete the PURGE_PER_KEY oldest expired keys (in the reservation's transaction)."""
    expired = (IdempotencyKey.select(IdempotencyKey.id).where(IdempotencyKey.expires_at <= now)
               .order_by(IdempotencyKey.expires_at).limit(PURGE_PER_KEY))
    if is_postgres():
        # Rows another open reservation is deleting are left to it, rather than waited for.
        expired = expired.for_update(skip_locked=True)
    IdempotencyKey.delete().where(IdempotencyKey.id.in_(expired)).execute()
