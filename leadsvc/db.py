"""The database: one proxy for the models, the connection lifecycle, write transactions, plain
rows for what is only read, migrations and failure mapping."""

from __future__ import annotations

import collections
import contextlib
import functools
import importlib.util
import operator
import sqlite3
import threading
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Hashable, Iterator, Sequence
from urllib.parse import unquote, urlsplit

import peewee as pw
from flask import Flask
from playhouse.migrations import Migration, Runner
from playhouse.pool import MaxConnectionsExceeded, PooledPostgresqlDatabase

from . import jsoncodec

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

SQLITE_MIN_VERSION = (3, 38, 0)   # the JSON functions peewee's JSONField relies on
_MIGRATION_LOCK = 74_657_100      # pg_advisory_xact_lock key: one migrating process at a time
_databases: dict[str, pw.Database] = {}
_databases_lock = threading.Lock()


class Turns:
    """Writers that would wait for each other in the database wait here instead, one key at a
    time, in the order they came: the next starts as soon as the last one's transaction ends.

    SQLite takes one writer at a time: a connection that finds the lock taken sleeps in its busy
    handler and looks again after a growing pause, so under load the lock sits free while writers
    sleep. On PostgreSQL a workspace's creates all lock one row, routing's rotation; waiting
    there, each holds a transaction open, and the next to get the row is not always the one that
    waited longest, so a few wait many turns. Other processes still meet the database's waiting."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._queues: dict[Hashable, collections.deque[threading.Event]] = {}

    def take(self, key: Hashable, timeout: float) -> bool:
        """Wait for the key's turn (False: it did not come within timeout seconds)."""
        mine = threading.Event()
        with self._guard:
            queue = self._queues.setdefault(key, collections.deque())
            queue.append(mine)
            if len(queue) == 1:
                return True
        if mine.wait(timeout):
            return True
        with self._guard:
            if mine.is_set():   # the turn came as the wait ended
                return True
            self._queues[key].remove(mine)
            return False

    def give_back(self, key: Hashable) -> None:
        """End the key's turn: the next in line, if any, starts."""
        with self._guard:
            queue = self._queues[key]
            queue.popleft()
            if queue:
                queue[0].set()
            else:
                del self._queues[key]


_turns = Turns()
# How long a writer waits for its turn before a 503: SQLite's busy timeout, PostgreSQL's pool timeout.
_turn_waits: dict[pw.Database, float] = {}


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
        path = str(Path(unquote(url[len("sqlite:///"):])))
        # IMMEDIATE makes a write transaction take SQLite's write lock when it begins, so two
        # writers never both read and then fail to upgrade. Each serving thread keeps its own
        # connection and page cache: a small cache each keeps a process's memory bounded by its
        # thread count, and the operating system's file cache serves the rest.
        db = pw.SqliteDatabase(path, lock_type="IMMEDIATE", pragmas={
            "journal_mode": "wal", "foreign_keys": 1, "busy_timeout": busy_timeout_ms,
            "synchronous": "normal", "cache_size": -8000, "temp_store": "memory",
        })
        _turn_waits[db] = busy_timeout_ms / 1000
        return db
    # psycopg's documented hook for reading json and jsonb columns; process-wide, like the pool.
    from psycopg.types.json import set_json_loads
    set_json_loads(jsoncodec.decode)
    db = PooledPostgresqlDatabase(
        unquote(parts.path.lstrip("/")), user=unquote(parts.username or "") or None,
        password=unquote(parts.password or "") or None, host=parts.hostname, port=parts.port,
        max_connections=pool_size, timeout=pool_timeout, stale_timeout=300,
        connect_timeout=max(1, pool_timeout), prefer_psycopg3=True,
    )
    _turn_waits[db] = pool_timeout
    return db


@contextlib.contextmanager
def transaction(turn: int | None = None) -> Iterator[None]:
    """A write transaction (database.atomic()), in its turn among the process's writers.

    Every write that touches several rows goes through here. On SQLite every writer takes turns;
    on PostgreSQL the transactions that create leads in a workspace (`turn`: its id) do, as
    routing's rotation would make them wait for each other anyway. The turn is taken as the
    transaction begins, before it holds any lock, so a writer in its turn never waits for a lock
    that one in line holds. Nested (a savepoint of the outer transaction), it takes none.
    """
    db = database.obj
    key = db if isinstance(db, pw.SqliteDatabase) else None if turn is None else ("workspace", turn)
    if key is None or database.in_transaction():
        with database.atomic():
            yield
        return
    if not _turns.take(key, _turn_waits[db]):
        raise pw.OperationalError("database is locked (another write of this process held it too long)")
    try:
        with database.atomic():
            yield
    finally:
        _turns.give_back(key)


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
    @app.teardown_request
    def close_connection(exc: BaseException | None) -> None:
        if database.is_closed():
            return
        if isinstance(database.obj, pw.SqliteDatabase) and not database.in_transaction():
            # Each serving thread keeps its idle SQLite connection: opening one (file, pragmas,
            # schema) costs more than a page of leads.
            return
        database.close()   # with a pool this returns the connection


def close() -> None:
    """Close this thread's connection and, on PostgreSQL, every pooled one (at shutdown)."""
    db = database.obj
    if db is None:
        return
    if not db.is_closed():
        db.close()
    if isinstance(db, PooledPostgresqlDatabase):
        db.close_all()


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


# PostgreSQL's row lock that keeps other writers of a row out but lets rows that refer to it be
# written meanwhile (their foreign key check takes KEY_SHARE, which only FOR UPDATE, a delete's
# lock, waits for).
NO_KEY_UPDATE = "FOR NO KEY UPDATE"
KEY_SHARE = "FOR KEY SHARE"   # the row must stay until the transaction ends; waits only for a delete


def for_update(query: pw.Select, mode: str = "FOR UPDATE") -> pw.Select:
    """Lock the selected rows until the transaction ends (SQLite already serializes writers)."""
    return query.for_update(mode) if database.for_update else query


def any_of(clauses: list[pw.Expression]) -> pw.Expression:
    """clause OR clause OR ...; the clauses must not be empty."""
    return functools.reduce(operator.or_, clauses)


def _conversion(field: pw.Field, sqlite: bool) -> Callable[[Any], Any] | None:
    """What turns a column's value, as the driver gives it, into the field's value; None when the
    driver already gives that (text, numbers, and on PostgreSQL times and JSON too). SQLite's
    times are the ISO text peewee writes, and its JSON is text."""
    if sqlite and isinstance(field, pw.DateTimeField):
        return datetime.fromisoformat
    if sqlite and isinstance(field, pw.JSONField):
        return jsoncodec.decode
    if isinstance(field, (pw.DecimalField, pw.BooleanField)):
        return field.python_value
    if isinstance(field, pw.CharField) and type(field).python_value is not pw.CharField.python_value:
        return field.python_value   # text that the field reads as something else (models.RegionsField)
    return None


_row_readers: dict[tuple, Callable[[tuple], Any]] = {}


def _row_reader(columns: tuple[pw.Field, ...], sqlite: bool) -> Callable[[tuple], Any]:
    key = (sqlite, *map(id, columns))   # by identity: a Field's == builds an SQL expression
    if key not in _row_readers:
        _row_readers[key] = _make_row_reader(columns, sqlite)
    return _row_readers[key]


def _make_row_reader(columns: tuple[pw.Field, ...], sqlite: bool) -> Callable[[tuple], Any]:
    names = [f.object_id_name if isinstance(f, pw.ForeignKeyField) else f.name for f in columns]
    row_type = collections.namedtuple("Row", [f"{f.model.__name__.lower()}_{name}" for f, name in zip(columns, names)]
                                      if len(set(names)) < len(names) else names)
    conversions = [(i, convert) for i, f in enumerate(columns) if (convert := _conversion(f, sqlite))]

    def read(raw: tuple) -> Any:
        values = list(raw)
        for i, convert in conversions:
            if values[i] is not None:
                values[i] = convert(values[i])
        return row_type._make(values)

    return read


def read_rows(columns: Sequence[pw.Field], sql: str, params: Sequence[Any]) -> list[Any]:
    """The rows of SQL that selects exactly `columns`, as named tuples of the fields' values
    (`source_id` for a foreign key; `model_name` when two models share a name).

    For rows that are only read, such as a page of leads, this skips what peewee does for each
    row of a model query (an instance per row, a conversion per column) and converts only the
    columns the driver does not already give as the field would.
    """
    read = _row_reader(tuple(columns), not is_postgres())
    return [read(row) for row in database.execute_sql(sql, params).fetchall()]


def insert_rows(model: type[pw.Model], rows: Sequence[dict[str, Any]]) -> None:
    """INSERT rows of a model, each a dict by field name, all naming the same fields; a model
    with a public id gets a new one for each row that does not name it.

    For the small rows a change writes beside it (history, name parts), building a peewee query
    per call costs more than the database's work: the statement is written once per kind of
    database, fields and row count, and each value goes through its field's db_value as peewee's own
    inserts do, but for JSON, sent as its text (peewee wraps it in an SQL function call, which a
    statement written once cannot hold). Nothing is returned (no ids)."""
    if not rows:
        return
    names = list(rows[0])
    fields = [getattr(model, name) for name in names]
    public_id = getattr(model, "public_id", None)
    make_public_id = public_id is not None and "public_id" not in rows[0]
    if make_public_id:
        fields.append(public_id)
    params = []
    for row in rows:
        params += [_insert_param(field, row[name]) for field, name in zip(fields, names)]
        if make_public_id:
            params.append(public_id.default())
    # By the database's kind (its SQL dialect) and the fields' identity, as _row_reader's.
    key = (type(database.obj), len(rows), *map(id, fields))
    if key not in _insert_sqls:
        sql, values = model.insert_many([(None,) * len(fields)] * len(rows), fields=fields).sql()
        assert len(values) == len(params), "every value is a parameter"
        _insert_sqls[key] = sql
    database.execute_sql(_insert_sqls[key], params)


_insert_sqls: dict[tuple, str] = {}


def _insert_param(field: pw.Field, value: Any) -> Any:
    if isinstance(field, pw.JSONField):
        return None if value is None else jsoncodec.text(value)
    return field.db_value(value)


def statement(build: Callable[[], pw.Query]) -> str:
    """The SQL of a query that `build` makes, written once per kind of database and `build`: for
    a lookup made on every request, peewee's building costs more than the database's work. Its
    parameters are given at each execution, in the order the built query's placeholders take them."""
    key = (type(database.obj), build)   # a kind of database writes one dialect
    if key not in _statements:
        _statements[key] = build().sql()[0]
    return _statements[key]


_statements: dict[tuple, str] = {}


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


def migrate(db: pw.Database | None = None, announce: Callable[[list[str]], None] | None = None) -> list[str]:
    """Apply pending migrations in one transaction, one process at a time; return their names.
    `announce` is told the names first, when there are any."""
    db = db or database.obj
    if isinstance(db, pw.SqliteDatabase):
        Path(db.database).parent.mkdir(parents=True, exist_ok=True)
    with db.atomic():
        if is_postgres(db):
            db.execute_sql("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
        # SQLite: the IMMEDIATE transaction already holds the write lock.
        runner = MigrationRunner(db, table_name="schema_migration")
        if announce is not None and (pending := [m.name for m in runner.status() if not m.applied]):
            announce(pending)
        return runner.up()


def pending_migrations(db: pw.Database | None = None) -> list[str]:
    db = db or database.obj
    return [m.name for m in MigrationRunner(db, table_name="schema_migration").status() if not m.applied]
