"""The database: one proxy for the models, the connection lifecycle, migrations and failure mapping."""

from __future__ import annotations

import collections
import functools
import importlib.util
import itertools
import json
import logging
import math
import operator
import sqlite3
import threading
import time
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any, Callable
from urllib.parse import unquote, urlsplit

import peewee as pw
from flask import Flask
from playhouse.migrations import Migration, Runner
from playhouse.pool import MaxConnectionsExceeded, PooledPostgresqlDatabase

from .current import current_request

log = logging.getLogger("leadsvc")

# Every model binds to this proxy; create_app points it at the configured database.
database = pw.DatabaseProxy()

# What a database that is down, locked past its timeout or out of connections raises.
# MaxConnectionsExceeded is a ValueError, not a PeeweeException.
UNAVAILABLE_ERRORS: tuple[type[Exception], ...] = (
    pw.OperationalError, pw.InterfaceError, MaxConnectionsExceeded,
)

# SQLite reports its own misuse (a missing table, bad SQL) as OperationalError too; only these
# messages mean "busy or unreachable".
_SQLITE_UNAVAILABLE = ("locked", "busy", "unable to open", "disk i/o")

READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})   # requests that never write (SQLite: see _QueuedSqlite)

SQLITE_MIN_VERSION = (3, 38, 0)   # the JSON functions peewee's JSONField relies on
_MIGRATION_LOCK = 74_657_100      # pg_advisory_xact_lock key: one migrating process at a time
_databases: dict[str, pw.Database] = {}
_databases_lock = threading.Lock()


def make_database(url: str, *, pool_size: int = 16, pool_timeout: int = 5,
                  busy_timeout_ms: int = 5000) -> pw.Database:
    """A database for the URL, made once per process and URL so that pools are shared."""
    with _databases_lock:
        if url not in _databases:
            _databases[url] = _open(url, pool_size, pool_timeout, busy_timeout_ms)
        return _databases[url]


def _open(url: str, pool_size: int, pool_timeout: int, busy_timeout_ms: int) -> pw.Database:
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        if sqlite3.sqlite_version_info < SQLITE_MIN_VERSION:
            raise RuntimeError(f"SQLite {sqlite3.sqlite_version} is too old; leadsvc needs 3.38 or newer.")
        path = Path(unquote(url[len("sqlite:///"):]))
        # IMMEDIATE makes writers queue on busy_timeout instead of failing a lock upgrade. Each
        # serving thread keeps its connection, so the page cache is per thread: 8 MB each keeps a
        # process well under 200 MB, and the OS's file cache serves the rest.
        return _QueuedSqlite(
            str(path), lock_type="IMMEDIATE", check_same_thread=False, busy_timeout_ms=busy_timeout_ms,
            pragmas={"journal_mode": "wal", "foreign_keys": 1, "busy_timeout": busy_timeout_ms,
                     "synchronous": "normal", "cache_size": -8000, "temp_store": "memory"},
        )
    return _PooledPostgres(
        unquote(parts.path.lstrip("/")), user=unquote(parts.username or "") or None,
        password=unquote(parts.password or "") or None, host=parts.hostname, port=parts.port,
        max_connections=pool_size, timeout=pool_timeout, stale_timeout=300,
        connect_timeout=max(1, pool_timeout), prefer_psycopg3=True,
    )


_TRANSACTION_IDLE = 0   # psycopg.pq.TransactionStatus.IDLE (psycopg is only there with the postgres extra)
_ENDED: Any = object()   # in place of a transaction's BEGIN: its last statement ran on its own


class _PooledPostgres(PooledPostgresqlDatabase):
    """The pool, with jsonb read by the C JSON scanner: psycopg's loader (bytes, json.loads and
    its layers per value) cost more than the rest of fetching a page of leads.

    peewee pings every connection it takes from the pool (a SELECT 1 round trip, 6% of a create's
    CPU); here only one that has been idle for PING_IDLE_SECONDS or more, as HikariCP does (its
    aliveBypassWindowMs). A connection the server dropped within that window fails its request
    with 503 and is not put back: its status is then no longer idle.
    """

    PING_IDLE_SECONDS = 0.5

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._begin = threading.local()   # .statement: the BEGIN not sent yet (see begin)
        self._client_cursor = self._raw_cursor = None   # psycopg's, set with the first connection

    def begin(self, isolation_level: Any = None) -> None:
        """BEGIN, sent with the transaction's first statement rather than on its own: the two go
        as `BEGIN; <statement>` in one message of PostgreSQL's simple query protocol, the
        statement's parameters bound by psycopg's ClientCursor (_with_begin). A create makes four
        or five round trips, and each costs the serving process CPU and context switches while it
        waits for the answer and then for the GIL. Anything that takes a cursor first (cursor, a
        raw kept statement) sends BEGIN on its own; commit or rollback before any
        statement sends nothing."""
        if self.is_closed():
            self.connect()   # now: connecting later would reset peewee's stack of transactions
        level = self._isolation_level if isolation_level is None else isolation_level
        self._begin.statement = (f"BEGIN TRANSACTION ISOLATION LEVEL {self._adapter.isolation_level_str(level)}"
                                 if level else "BEGIN")

    def _take_begin(self) -> str | None:
        """The BEGIN still to be sent, if any, for the caller to send with its statement."""
        statement = getattr(self._begin, "statement", None)
        if statement is _ENDED:
            raise pw.InterfaceError("The transaction ended with a statement run on its own as its last "
                                    "(execute_kept(last=True)): nothing may follow it.")
        self._begin.statement = None
        return statement

    def _end(self) -> bool:
        """Forget the transaction's BEGIN; whether the transaction is open on the server."""
        statement = getattr(self._begin, "statement", None)
        self._begin.statement = None
        return statement is None

    def cursor(self, named_cursor: Any = None) -> Any:
        cursor = super().cursor(named_cursor)
        self._send_begin(self._take_begin())
        return cursor

    def _send_begin(self, statement: str | None) -> None:
        """Send the transaction's BEGIN on its own, if it is still to go."""
        if statement is not None:
            with pw.__exception_wrapper__:
                self._state.conn.execute(statement)

    def _execute_cursor(self, sql: str, params: Any, **cursor_options: Any) -> Any:
        statement = self._take_begin()
        if statement is None:
            return super()._execute_cursor(sql, params, **cursor_options)
        conn = self.connection()
        self._log_query(sql, params)
        return self._with_begin(self._client_cursor(conn), f"{statement}; {sql}", params)

    @staticmethod
    def _with_begin(cursor: Any, text: str, params: Any) -> Any:
        """Run `BEGIN; <statement>` on a ClientCursor; the cursor, on the statement's result.

        The simple query protocol takes no parameters, so the ClientCursor binds them (as
        literals, quoted by libpq) and the server plans the statement anew. psycopg's pipeline
        mode, which sent BEGIN beside a statement bound and prepared by the server, cost more
        CPU in the serving process than the round trip it saved."""
        with pw.__exception_wrapper__:
            cursor.execute(text, params or ())
            cursor.nextset()   # past BEGIN's result
        return cursor

    def execute_kept(self, sql: str, params: Any = (), *, raw: bool = False, plain_read: bool = False,
                     last: bool = False) -> Any:
        """Run a statement built once and run on most requests (a Prepared query, a create's
        INSERT, a rotation) on a cursor kept for it on this thread's connection, and return that
        cursor: read its rows at once, since the statement's next run on this connection
        replaces them. A cursor that runs the same query string again keeps psycopg's Transformer
        (the columns' loaders, the parameters' dumpers), which a new cursor makes afresh for each
        query: a quarter of such a statement's CPU. `raw`: the SQL has `$1, $2, ...` placeholders
        (psycopg's RawCursor); BEGIN, if due, then goes on its own.

        The first statement of a transaction need not start it. `plain_read`: the statement only
        reads, and locks nothing; at READ COMMITTED (PostgreSQL's default, which leadsvc is
        written for) it sees what it would see just after BEGIN, so it runs on its own and leaves
        BEGIN to the next statement. `last`: nothing follows it in the transaction; when nothing
        has been sent yet, it runs on its own, atomic as any single statement, and the
        transaction needs neither BEGIN nor COMMIT (it then takes no further statement). A
        duplicate's activity, or a lead routed without a lock, is one round trip instead of two."""
        conn = self.connection()
        pending = getattr(self._begin, "statement", None)
        if pending is not None and pending is not _ENDED and (last or (plain_read and pending == "BEGIN")):
            statement = None   # on its own: BEGIN stays for the next statement, or is never needed
            if last:
                self._begin.statement = _ENDED
        else:
            statement = self._take_begin()
            if raw:   # $1 placeholders: no simple-protocol message to carry BEGIN
                self._send_begin(statement)
                statement = None
        key = (sql, raw, statement)
        kept = conn._leadsvc_kept.get(key)
        if kept is None:
            if raw:
                kept = (self._raw_cursor(conn), sql)
            elif statement is not None:
                kept = (self._client_cursor(conn), f"{statement}; {sql}")
            else:
                kept = (conn.cursor(), sql)
            conn._leadsvc_kept[key] = kept
        cursor, text = kept
        self._log_query(sql, params)
        if statement is not None:
            return self._with_begin(cursor, text, params)
        with pw.__exception_wrapper__:
            cursor.execute(text, params)
        return cursor

    def commit(self) -> None:
        if not self._end():   # nothing was sent, or one statement on its own: nothing to commit
            return
        if self.is_closed():
            raise pw.InterfaceError("Cannot commit, database connection not open.")
        with pw.__exception_wrapper__:
            self._state.conn.commit()   # COMMIT without the cursor peewee makes for it

    def rollback(self) -> None:
        if self._end():
            super().rollback()

    def close(self) -> bool:
        self._end()   # a BEGIN noted but never sent must not reach the next statement
        return super().close()

    def _initialize_connection(self, conn: Any) -> None:
        super()._initialize_connection(conn)
        if not hasattr(conn, "_leadsvc_kept"):   # once per connection, not per checkout
            from psycopg import ClientCursor, RawCursor   # psycopg is only there with the postgres extra

            self._client_cursor, self._raw_cursor = ClientCursor, RawCursor
            conn.adapters.register_loader("jsonb", _jsonb_loader())
            conn._leadsvc_kept = {}   # execute_kept's cursors

    def _is_closed(self, conn: Any) -> bool:
        if (time.monotonic() - getattr(conn, "_leadsvc_returned_at", -math.inf) < self.PING_IDLE_SECONDS
                and not conn.closed and conn.info.transaction_status == _TRANSACTION_IDLE):
            return False
        return super()._is_closed(conn)

    def _close(self, conn: Any, close_conn: bool = False) -> None:
        conn._leadsvc_returned_at = time.monotonic()
        super()._close(conn, close_conn)


class _QueuedSqlite(pw.SqliteDatabase):
    """SQLite whose write transactions queue on a mutex within the process.

    SQLite has one writer at a time; a connection that finds the lock taken sleeps in its busy
    handler for 1, 2, 5, ... up to 100 ms before it looks again, so under load the lock sits free
    while the waiters sleep (creates at 8 connections: p99 over a second). Threads of one process
    wait here instead, and the next starts the moment the last commits; other processes still
    meet SQLite's busy handler. Either wait ends after busy_timeout_ms as "database is locked".

    The write transactions of the process all run on one connection, handed to the thread that
    holds the mutex. A connection's page cache is dropped whenever another connection has written
    since its last transaction, so with a connection per thread each write began cold and read
    every index page it touched again (about 100 reads per create); the writer's cache stays warm.
    Reads outside a write transaction stay on the thread's own connection, side by side.

    A write request (any method but GET, HEAD and OPTIONS) takes the turn for the whole request
    (init_app): its token lookup reads through the writer's warm cache, and the other write
    requests wait on the mutex instead of running their Python beside it. Under the GIL that
    overlap bought nothing: the thread holding the write lock waited for the GIL after each
    statement while the others parsed and authenticated (creates at 8 connections, served:
    30 -> 22 context switches and about 10% less CPU per create).

    The WAL is checkpointed in two steps after a commit, not inside it (SQLite's
    wal_autocheckpoint, turned off here): a checkpoint copies pages back into the database file
    and syncs it, and under `leadsvc serve` the writes queue for one thread
    (serving.WritesInOrder), which would wait for all of it. When one is due, a thread of its
    own copies and syncs what the WAL holds then, on a connection of its own, beside the writes;
    the first commit after it has finished copies the little written meanwhile (_checkpoint_if_due).
    That second step matters: a checkpoint that only ever runs beside the writes never finds the
    WAL wholly copied when a write begins, so SQLite never starts the WAL over, and every page
    read searches a WAL that grows without end (in-process creates: 446 MB of WAL after 4,000,
    and a fifth more CPU each). Served creates at 8 connections: p99 64 -> 27 ms, 4% more.
    """

    CHECKPOINT_SECONDS = 10.0   # at most this long between checkpoints while writes go on
    CHECKPOINT_COMMITS = 1000   # or after this many commits of the process, whichever comes first

    def __init__(self, *args: Any, busy_timeout_ms: int, **kwargs: Any):
        kwargs["pragmas"] = {**kwargs.get("pragmas", {}), "wal_autocheckpoint": 0}
        super().__init__(*args, **kwargs)
        self._writer = threading.Lock()
        self._writer_conn: sqlite3.Connection | None = None   # made by the first write, used under _writer
        self._holder = threading.local()
        self._wait_seconds = busy_timeout_ms / 1000
        self._commits, self._checkpointed_at = 0, time.monotonic()
        self._aside: threading.Thread | None = None
        self._aside_lock = threading.Lock()

    def execute_kept(self, sql: str, params: Any = (), *, plain_read: bool = False, last: bool = False) -> Any:
        """execute_sql: sqlite3 keeps each connection's statements itself, and a write transaction
        has begun before its first statement (_PooledPostgres.execute_kept)."""
        return self.execute_sql(sql, params)

    def begin(self, lock_type: str | None = None) -> None:
        if not getattr(self._holder, "holds", False):
            self._take_writer()
        try:
            super().begin(lock_type)
        except BaseException:
            self._release()
            raise

    def commit(self) -> None:
        try:
            super().commit()
        except BaseException:
            # SQLite may keep the transaction open after a failed COMMIT (a full disk, an I/O
            # error): end it on the writer connection before that goes to the next writer.
            self._discard_write()
            raise
        finally:
            self._release()
        self._commits += 1   # unlocked: a lost count only moves a checkpoint by one commit
        if not getattr(self._holder, "holds", False):
            self._checkpoint_if_due()

    def _checkpoint_if_due(self) -> None:
        """Start a checkpoint aside when one is due, or finish the one that ran aside."""
        aside = self._aside
        if aside is not None:
            if aside.is_alive() or not self._aside_lock.acquire(blocking=False):
                return
            try:
                if self._aside is aside:
                    self._aside = None
                    self._checkpoint(self.cursor())   # the rest, which leaves the WAL wholly copied
            finally:
                self._aside_lock.release()
            return
        if (self._commits >= self.CHECKPOINT_COMMITS
                or time.monotonic() - self._checkpointed_at >= self.CHECKPOINT_SECONDS):
            with self._aside_lock:
                if self._aside is not None:
                    return
                self._commits, self._checkpointed_at = 0, time.monotonic()
                self._aside = threading.Thread(target=self._checkpoint_aside, name="leadsvc-checkpoint", daemon=True)
                self._aside.start()

    def truncate_wal(self) -> None:
        """Copy the whole WAL into the database file and empty it (after a bulk load). A
        checkpoint still running aside is waited for first: SQLite refuses a second checkpoint
        at once (busy) while one runs, and the process could then end with its data left in the
        WAL and the one aside cut off."""
        with self._aside_lock:
            if self._aside is not None:
                self._aside.join()
                self._aside = None
            busy, _, _ = self.execute_sql("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        if busy:
            log.warning("The WAL could not be wholly copied into the database (a reader held on); "
                        "the next checkpoint goes on.")

    def _checkpoint_aside(self) -> None:
        """The bulk of a checkpoint, on a thread and connection of its own (sqlite3 lets the GIL go meanwhile)."""
        try:
            conn = self._connect()
        except sqlite3.Error as exc:
            log.warning("WAL checkpoint failed (the next commit tries again): %s", exc)
            return
        try:
            self._checkpoint(conn.cursor())
        finally:
            conn.close()

    @staticmethod
    def _checkpoint(cursor: Any) -> None:
        try:   # PASSIVE: copies what no reader still needs, and never waits for a lock
            cursor.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except (sqlite3.Error, pw.PeeweeException) as exc:   # the commit stands: its request must not fail now
            log.warning("WAL checkpoint failed (the next commit tries again): %s", exc)

    def rollback(self) -> None:
        if not getattr(self._holder, "holds", False):
            return   # the write is over: a failed COMMIT ended it (peewee rolls back after one)
        try:
            if self._state.conn.in_transaction:
                super().rollback()
        finally:
            self._release()

    def hold_writer(self) -> None:
        """Take the process's write turn for the rest of a request, and run all of the request's
        statements on the writer connection (release_writer gives both back)."""
        if not getattr(self._holder, "holds", False):
            self._take_writer()
            self._holder.request = True

    def release_writer(self) -> None:
        """End hold_writer's turn (a transaction left open is rolled back), then checkpoint if due."""
        if getattr(self._holder, "request", False):
            self._holder.request = False
            self._discard_write()
            self._release()
            self._checkpoint_if_due()

    def writer_pragmas(self, values: dict[str, Any]) -> dict[str, Any]:
        """Set PRAGMAs of the connection that runs the process's writes (a bulk load tunes it),
        between writes; the values they replace."""
        self._take_turn()
        try:
            conn = self._writer_connection()
            replaced = {name: conn.execute(f"PRAGMA {name}").fetchone()[0] for name in values}
            for name, value in values.items():
                conn.execute(f"PRAGMA {name} = {value}")
            return replaced
        finally:
            self._holder.holds = False
            self._writer.release()

    def _take_writer(self) -> None:
        """Take the turn, and put the writer connection in place of this thread's own (or none
        yet), which comes back in _release."""
        self._take_turn()
        try:
            self._holder.own = (self._state.conn, self._state.closed)
            self._state.conn, self._state.closed = self._writer_connection(), False
        except BaseException:
            self._holder.holds = False
            self._writer.release()
            raise

    def _take_turn(self) -> None:
        if not self._writer.acquire(timeout=self._wait_seconds):
            raise pw.OperationalError("database is locked (another write of this process held it too long)")
        self._holder.holds = True

    def _writer_connection(self) -> sqlite3.Connection:
        """The shared writer connection (under the mutex), opened by the first write."""
        if self._writer_conn is None:
            with pw.__exception_wrapper__:   # sqlite3's errors as peewee's, as for any connection
                self._writer_conn = self._connect()
        return self._writer_conn

    def _discard_write(self) -> None:
        conn = self._writer_conn
        try:
            if conn is not None and conn.in_transaction:
                conn.execute("ROLLBACK")
        except sqlite3.Error as exc:   # unusable: the next write opens another connection
            log.warning("the SQLite writer connection failed to roll back and is replaced: %s", exc)
            conn.close()
            self._writer_conn = None

    def _release(self) -> None:
        if getattr(self._holder, "holds", False) and not getattr(self._holder, "request", False):
            self._state.conn, self._state.closed = self._holder.own
            self._holder.holds = False
            self._writer.release()

    def close_all(self) -> None:
        """Close the shared writer connection (each thread closes its own with close()); left
        open if a write still holds it after busy_timeout_ms. A checkpoint running aside ends first."""
        if not self._writer.acquire(timeout=self._wait_seconds):
            log.warning("the SQLite writer connection is still in use; it was left open")
            return
        try:
            if self._aside is not None:
                self._aside.join(self._wait_seconds)
            if self._writer_conn is not None:
                self._writer_conn.close()
                self._writer_conn = None
        finally:
            self._writer.release()


@functools.cache
def _jsonb_loader() -> type:
    from psycopg.adapt import Loader   # psycopg is only there with the postgres extra

    class JsonbLoader(Loader):
        def load(self, data: Any) -> Any:
            return _json_text(bytes(data).decode())

    return JsonbLoader


def is_postgres(db: pw.Database | pw.DatabaseProxy = database) -> bool:
    return isinstance(getattr(db, "obj", db), pw.PostgresqlDatabase)


def init_app(app: Flask) -> None:
    """Point the models at the app's database and close each request's connection when it ends."""
    cfg = app.config["LEADSVC"]["database"]
    database.initialize(make_database(cfg["url"], pool_size=cfg["pool_size"],
                                      pool_timeout=cfg["pool_timeout"],
                                      busy_timeout_ms=cfg["busy_timeout_ms"]))

    # No before_request connect: peewee connects on the first query, so /healthz never needs
    # the database.
    @app.before_request
    def queue_write_request() -> None:
        if current_request().method not in READ_METHODS and isinstance(database.obj, _QueuedSqlite):
            database.obj.hold_writer()

    @app.teardown_request
    def close_connection(exc: BaseException | None) -> None:
        if isinstance(database.obj, _QueuedSqlite):
            database.obj.release_writer()
        if database.is_closed():
            return
        if (isinstance(database.obj, pw.SqliteDatabase) and not database.in_transaction()
                and not database.connection().in_transaction):
            # Each serving thread keeps its idle SQLite connection: opening one (file, pragmas,
            # schema) and closing it cost more than a page of leads, under a lock all threads share.
            return
        database.close()   # with a pool this returns the connection


def is_unavailable(exc: BaseException) -> bool:
    """Whether an error means the database is down, busy past its timeout or out of connections."""
    if isinstance(exc, MaxConnectionsExceeded):
        return True
    if not isinstance(exc, (pw.OperationalError, pw.InterfaceError)):
        return False
    return is_postgres() or any(text in str(exc).lower() for text in _SQLITE_UNAVAILABLE)


def sqlstate(exc: BaseException) -> str | None:
    """The PostgreSQL SQLSTATE behind a peewee error (peewee keeps the driver's error as the context)."""
    for candidate in (exc, exc.__cause__, exc.__context__, *getattr(exc, "args", ())[:1]):
        code = getattr(candidate, "sqlstate", None)
        if isinstance(code, str):
            return code
    return None


def for_update(query: pw.Select) -> pw.Select:
    """Lock the selected rows until the transaction ends (SQLite already serializes writers)."""
    return query.for_update() if database.for_update else query


def any_of(clauses: list[pw.Expression]) -> pw.Expression:
    """clause OR clause OR ...; the clauses must not be empty."""
    return functools.reduce(operator.or_, clauses)


# --- inserts on the write path --------------------------------------------------------------

def _insert_text(model: type[pw.Model], fields: list[pw.Field], tuples: list[list[str]]) -> str:
    """INSERT INTO the model's table, the fields' columns, VALUES the tuples (of SQL fragments)."""
    columns = ", ".join(f'"{field.column_name}"' for field in fields)
    values = ", ".join("(" + ", ".join(slots) + ")" for slots in tuples)
    return f'INSERT INTO "{model._meta.table_name}" ({columns}) VALUES {values}'


Convert = Callable[[Any], Any]
_insert_sql: dict[tuple, tuple[str, list[Convert]]] = {}


def _insert_statement(model: type[pw.Model], names: tuple[str, ...], rows: int = 1, *,
                      returning_id: bool = False) -> tuple[str, list[Convert]]:
    """An INSERT of `rows` rows of the named fields, and what turns each field's value into its
    parameter (_to_parameter), in parameter order per row: made once per database and shape."""
    key = (id(database.obj), model, names, rows, returning_id)
    if key not in _insert_sql:
        fields = [model._meta.fields[name] for name in names]
        sql = _insert_text(model, fields, [[database.param] * len(fields)] * rows)
        _insert_sql[key] = (sql + (' RETURNING "id"' if returning_id else ""), _to_parameters(fields))
    return _insert_sql[key]


def insert_row(model: type[pw.Model], values: dict[str, Any], *, last: bool = False) -> int:
    """INSERT one row and return its id: the SQL is written once per model and set of columns.
    `last`: nothing follows it in its transaction (_PooledPostgres.execute_kept).

    peewee writes an INSERT afresh each time, and on the create path that costs more than the
    database's own work; the values still become what each field's db_value gives, as with peewee.
    """
    postgres = is_postgres()
    sql, converts = _insert_statement(model, tuple(values), returning_id=postgres)
    cursor = database.execute_kept(sql, [convert(value) for convert, value in zip(converts, values.values())],
                                   last=last)
    return cursor.fetchone()[0] if postgres else cursor.lastrowid


class _FirstRowId:
    def __repr__(self) -> str:
        return "FIRST_ROW_ID"


# In a row given to insert_rows, the id of the first row it inserts (a new lead, for its history).
FIRST_ROW_ID: Any = _FirstRowId()

_insert_rows_sql: dict[tuple, tuple[str, list[pw.Field]]] = {}


def insert_rows(rows: list[tuple[type[pw.Model], dict[str, Any]]], *, last: bool = False) -> int:
    """INSERT rows of any tables, in their order, and return the first one's id; a value
    FIRST_ROW_ID in a later row stands for that id. On PostgreSQL it is one statement: the first
    row, then each run of rows of the same model and columns (one multi-row INSERT, ids in
    order), each a data-modifying WITH query (each runs exactly once), selecting the first id,
    with PostgreSQL's own placeholders ($1, $2, ...) run through a kept RawCursor
    (_PooledPostgres.execute_kept): psycopg parses a query written with %s for its placeholders
    on every run once it has more than 50 parameters (its cache of parsed queries stops there),
    and a create's has 57. `last`: nothing follows that statement in its transaction. SQLite runs
    in-process: there the first row is inserted alone (for its id), then each run as one
    multi-row INSERT. The SQL is written once per shape of the rows."""
    if not is_postgres():
        first_id = insert_row(*rows[0])
        for model, names, run in _runs(rows[1:]):
            values = [first_id if value is FIRST_ROW_ID else value for row in run for value in row.values()]
            sql, converts = _insert_statement(model, names, len(run))
            database.execute_sql(sql, [convert(value) for convert, value in zip(itertools.cycle(converts), values)])
        return first_id
    runs = [(rows[0][0], tuple(rows[0][1]), 1)] + [(model, names, len(run)) for model, names, run in _runs(rows[1:])]
    params = [value for _, values in rows for value in values.values()]
    first_id_at = frozenset(i for i, value in enumerate(params) if value is FIRST_ROW_ID)
    key = (id(database.obj), first_id_at, *runs)
    if key not in _insert_rows_sql:
        positions = itertools.count()
        queries, fields = [], []
        for model, names, count in runs:
            columns = [model._meta.fields[name] for name in names]
            tuples = []
            for _ in range(count):
                slots = []
                for field in columns:
                    if next(positions) in first_id_at:
                        slots.append('(SELECT "id" FROM "run0")')
                    else:
                        fields.append(field)
                        slots.append(f"${len(fields)}")
                tuples.append(slots)
            queries.append(_insert_text(model, columns, tuples))
        queries[0] += ' RETURNING "id"'
        with_queries = ", ".join(f'"run{i}" AS ({query})' for i, query in enumerate(queries))
        _insert_rows_sql[key] = (f'WITH {with_queries} SELECT "id" FROM "run0"', _to_parameters(fields))
    sql, converts = _insert_rows_sql[key]
    values = [value for value in params if value is not FIRST_ROW_ID]
    parameters = [convert(value) for convert, value in zip(converts, values, strict=True)]
    return database.obj.execute_kept(sql, parameters, raw=True, last=last).fetchone()[0]


def _runs(rows: list[tuple[type[pw.Model], dict[str, Any]]]) -> list[tuple[type[pw.Model], tuple[str, ...], list[dict]]]:
    """The rows as runs of consecutive rows of one model and set of columns: (model, the
    columns' field names, each row's values)."""
    return [(model, names, [values for _, values in run])
            for (model, names), run in itertools.groupby(rows, key=lambda row: (row[0], tuple(row[1])))]


def _to_parameters(fields: list[pw.Field]) -> list[Convert]:
    """Per field, what turns a value into the parameter the driver is given: what field.db_value
    gives (and on SQLite what sqlite3's adapter makes of a datetime), with a shortcut for a value
    already of the column's plain type (an int id, a str): db_value's calls for each of a
    create's 48 parameters cost more than the shortcut's check."""
    sqlite = not is_postgres()
    return [_to_parameter(field, sqlite) for field in fields]


def _to_parameter(field: pw.Field, sqlite: bool) -> Convert:
    db_value = field.db_value
    if isinstance(field, pw.JSONField):
        # Its db_value is an SQL expression (json(?) on SQLite); its text is the parameter.
        dumps = field._dumps
        return lambda value: None if value is None else dumps(value)
    if sqlite and isinstance(field, pw.DateTimeField):
        # sqlite3's default adapter for datetime (Python 3.11) is isoformat(" ").
        return lambda value: value.isoformat(" ") if value.__class__ is datetime else db_value(value)
    if isinstance(field, pw.IntegerField) or (isinstance(field, pw.ForeignKeyField)
                                              and isinstance(field.rel_field, pw.IntegerField)):
        plain: type = int
    elif isinstance(field, (pw.CharField, pw.TextField)):
        plain = str
    else:
        return db_value
    return lambda value: value if value is None or value.__class__ is plain else db_value(value)


def _as_is(value: Any) -> Any:
    return value


# --- prepared queries ------------------------------------------------------------------------

class Prepared:
    """A model query whose SQL is generated once per database and then run with new values.

    peewee builds a query's SQL anew on every run, which for a join of three models costs more
    than running it; a query run on every request is worth building once. `build` makes the query
    from placeholders (compare columns with them; they reach the SQL as parameters, untouched by
    the fields' conversions), and each call swaps the real values in, as the database takes them.
    A query without FOR UPDATE is a plain read: first in a transaction, it leaves BEGIN to the
    next statement (_PooledPostgres.execute_kept).
    """

    def __init__(self, build: Callable[..., pw.ModelSelect], arity: int = 1):
        self.build = build
        self.placeholders = tuple(f"\x00prepared:{i}\x00" for i in range(arity))
        self.compiled: dict[int, tuple[pw.ModelSelect, str, list[tuple[int | None, Any]], bool]] = {}
        # Rows of whole models joined by the root's foreign keys are built without peewee's cursor
        # wrapper (see _instance_maker); None: a query of another shape, which peewee builds.
        self.makers: dict[int, Callable[[tuple], pw.Model] | None] = {}

    def __call__(self, *values: Any) -> list[Any]:
        """The rows, as the query would give them (models, with joined models attached)."""
        key = id(database.obj)
        if key not in self.compiled:
            query = self.build(*(pw.Value(p, converter=_as_is) for p in self.placeholders))
            sql, params = query.sql()
            if sorted(p for p in params if p in self.placeholders) != sorted(self.placeholders):
                raise ValueError("every placeholder must be a query parameter")
            index = {p: i for i, p in enumerate(self.placeholders)}
            # Each parameter: (index of the value that replaces it, None) or (None, its own value).
            slots = [(index[p], None) if isinstance(p, str) and p in index else (None, p) for p in params]
            self.compiled[key] = (query, sql, slots, not query._for_update)
            self.makers[key] = _instance_maker(query, sqlite=not is_postgres())
        query, sql, slots, plain_read = self.compiled[key]
        bound = [own if i is None else values[i] for i, own in slots]
        cursor = database.execute_kept(sql, bound, plain_read=plain_read)
        make = self.makers[key]
        if make is not None:
            return [make(row) for row in cursor.fetchall()]
        return list(query._get_cursor_wrapper(cursor))


# Fields whose values _conversion turns into what peewee would give (the others need nothing).
_MADE_FIELDS = (pw.IntegerField, pw.FloatField, pw.CharField, pw.TextField, pw.ForeignKeyField, pw.BooleanField,
                pw.DecimalField, pw.DateTimeField, pw.JSONField)


def _instance_maker(query: pw.ModelSelect, sqlite: bool) -> Callable[[tuple], pw.Model] | None:
    """For a query of whole models, the root's and those it inner-joins through its own foreign
    keys (a token with its member and workspace), a function from a row to the root instance with
    the joined ones attached, as peewee would give it: instances made from their column values,
    with the same conversions as plain rows. peewee's cursor wrapper sets each column through the
    field's descriptor, and for the token lookup that was a third of the query's cost. None for
    any other shape, which peewee's cursor wrapper then builds."""
    fields = list(query._returning)
    if (query._row_type not in (None, pw.ROW.MODEL) or not fields
            or not all(isinstance(f, _MADE_FIELDS) and not isinstance(f, (pw.FieldAlias, pw.TimestampField))
                       for f in fields)):
        return None
    root = query.model
    models = list(dict.fromkeys(field.model for field in fields))
    joins = {dest: attr for dest, attr, _, kind in query._joins.get(root, []) if kind == pw.JOIN.INNER}
    if (models[0] is not root or set(query._joins) - {root}
            or any(model not in joins or not isinstance(root._meta.fields.get(joins[model]), pw.ForeignKeyField)
                   for model in models[1:])):
        return None
    parts = []   # per model: its class, its fields' names, the slice of the row, conversions
    for model in models:
        indexes = [i for i, field in enumerate(fields) if field.model is model]
        if indexes != list(range(indexes[0], indexes[-1] + 1)):
            return None
        names = tuple(fields[i].name for i in indexes)
        conversions = [(fields[i].name, convert) for i in indexes if (convert := _conversion(fields[i], sqlite))]
        parts.append((model, names, indexes[0], indexes[-1] + 1, conversions))
    links = [(joins[model], index) for index, model in enumerate(models) if index]

    def make(row: tuple) -> pw.Model:
        instances = []
        for model, names, start, end, conversions in parts:
            data = dict(zip(names, row[start:end]))
            for name, convert in conversions:
                if data[name] is not None:
                    data[name] = convert(data[name])
            instance = model.__new__(model)
            instance.__data__, instance._dirty, instance.__rel__ = data, set(), {}
            instances.append(instance)
        for attr, index in links:
            instances[0].__rel__[attr] = instances[index]
        return instances[0]

    return make


# --- plain rows ------------------------------------------------------------------------------

_json_scan = json.JSONDecoder().scan_once   # the C scanner json.loads ends in, without its layers


def _json_text(text: str) -> Any:
    try:
        return _json_scan(text, 0)[0]
    except StopIteration:   # leading whitespace or invalid: let json.loads say which
        return json.loads(text)


_row_makers: dict[tuple[int, ...], Callable[[tuple], Any]] = {}


def _conversion(field: pw.Field, sqlite: bool) -> Callable[[Any], Any] | None:
    """What turns a column's raw value into the field's value, or None when it is already that.
    SQLite gives datetimes and JSON as text; PostgreSQL's driver already gives both decoded."""
    if isinstance(field, (pw.DecimalField, pw.BooleanField)):
        return field.python_value
    if sqlite and isinstance(field, pw.DateTimeField):
        return lambda value: datetime.fromisoformat(value) if value.__class__ is str else value
    if sqlite and isinstance(field, pw.JSONField):
        return lambda value: _json_text(value) if value.__class__ is str else value
    return None


def _row_maker(fields: tuple[pw.Field, ...], sqlite: bool) -> Callable[[tuple], Any]:
    """A function from a database row to a named tuple of the fields' values, made once per
    selection: only the columns that need a conversion get one."""
    key = (sqlite, *map(id, fields))
    if key not in _row_makers:
        names = tuple(f.object_id_name if isinstance(f, pw.ForeignKeyField) else f.name for f in fields)
        row_type = collections.namedtuple("Row", names, rename=True)
        conversions = [(i, convert) for i, f in enumerate(fields) if (convert := _conversion(f, sqlite))]

        def make(raw: tuple) -> Any:
            values = list(raw)
            for i, convert in conversions:
                if values[i] is not None:
                    values[i] = convert(values[i])
            return row_type._make(values)

        _row_makers[key] = make
    return _row_makers[key]


def plain_rows(query: pw.ModelSelect) -> list[Any]:
    """A model query's rows as named tuples with the model's attribute names (`source_id` for a
    foreign key) and the values its fields would give, without building model instances: for a
    page of rows that is most of the cost. Queries that select anything but the model's own
    fields come back as models."""
    fields = tuple(query._returning)
    if not all(isinstance(f, pw.Field) and f.model is query.model for f in fields):
        return list(query)
    make = _row_maker(fields, sqlite=not is_postgres())
    return [make(row) for row in database.execute(query).fetchall()]


def ping() -> None:
    """Raise one of UNAVAILABLE_ERRORS unless the database answers a query."""
    database.execute_sql("SELECT 1").fetchone()


# --- migrations ------------------------------------------------------------------------------

def migrations_dir() -> Any:
    """db/migrations: copied into the package by a wheel install, else beside it (a checkout, the .pyz)."""
    installed = resources.files("leadsvc") / "migrations"
    return installed if installed.is_dir() else resources.files("leadsvc").parent / "db" / "migrations"


class _ResourceMigration(Migration):
    """A migration read through importlib.resources, so it also loads from inside a zip."""

    def load(self):
        spec = importlib.util.spec_from_loader(self.name, loader=None)
        module = importlib.util.module_from_spec(spec)
        exec(compile(self.path.read_text(encoding="utf-8"), str(self.path), "exec"), module.__dict__)
        return module


class MigrationRunner(Runner):
    def migrations(self) -> list[Migration]:
        folder = migrations_dir()
        if not folder.is_dir():
            raise RuntimeError(f"The migrations folder {folder} is missing; reinstall leadsvc.")
        found = [
            _ResourceMigration(int(item.name.split("_", 1)[0]), item.name[:-3], item, None)
            for item in folder.iterdir()
            if item.name[:1].isdigit() and item.name.endswith(".py")
        ]
        return sorted(found)


def migrate(db: pw.Database | None = None) -> list[str]:
    """Apply pending migrations in one transaction, one process at a time; return their names."""
    db = db or database.obj
    if isinstance(db, pw.SqliteDatabase):
        Path(db.database).parent.mkdir(parents=True, exist_ok=True)
    with db.atomic():
        if is_postgres(db):
            db.execute_sql("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
        # SQLite: the IMMEDIATE transaction already holds the write lock.
        return MigrationRunner(db, table_name="schema_migration").up()


def pending_migrations(db: pw.Database | None = None) -> list[str]:
    db = db or database.obj
    return [m.name for m in MigrationRunner(db, table_name="schema_migration").status() if not m.applied]

