"""Writing synthetic leads into SQLite or PostgreSQL fast (`leadsvc demo --leads N`, bench/).

Rows are written in chunks, one transaction each, with a prepared multi-row statement
(SQLite) or COPY (PostgreSQL): the ORM's per-row work is many times slower for a large load.
Forked workers generate the next chunks while this process writes.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import multiprocessing
from datetime import datetime
from queue import Empty
from typing import Any, Callable, Iterator, Sequence

import peewee as pw

from . import followups, lead_timers, routing
from .db import database, is_postgres, transaction
from .models import Activity, Lead, LeadNamePart, Task, Transition, Workspace, utcnow
from .synthetic import (ACTIVITY_COLUMNS, CHUNK, LEAD_COLUMNS, NAME_PART_COLUMNS, TASK_COLUMNS, TRANSITION_COLUMNS,
                        Generator,
                        Rows)

log = logging.getLogger("leadsvc")

WORKERS = 2                # processes generating rows while the main one writes
ROWS_PER_INSERT = 100      # SQLite: rows per INSERT statement
SQLITE_MAX_PARAMETERS = 32766


def _table(model: type[pw.Model]) -> str:
    return model._meta.table_name   # Model._meta: peewee's documented table metadata


class _Writer:
    """Multi-row INSERT through executemany (SQLite) or COPY (PostgreSQL), columns by name."""

    def __init__(self) -> None:
        self.postgres = is_postgres()

    def write(self, model: type[pw.Model], columns: Sequence[str], rows: list[tuple]) -> None:
        if not rows:
            return
        table = _table(model)
        names = ", ".join(f'"{c}"' for c in columns)
        cursor = database.cursor()
        if self.postgres:
            with cursor.copy(f'COPY "{table}" ({names}) FROM STDIN') as copy:
                for row in rows:
                    copy.write_row(row)
        else:
            # Many rows per statement: SQLite's per-statement work is a third of a single-row insert.
            values = f'({", ".join("?" * len(columns))})'
            per = max(1, min(ROWS_PER_INSERT, SQLITE_MAX_PARAMETERS // len(columns)))
            whole = len(rows) - len(rows) % per
            if whole:
                cursor.executemany(f'INSERT INTO "{table}" ({names}) VALUES {", ".join([values] * per)}',
                                   [tuple(itertools.chain.from_iterable(rows[i:i + per])) for i in range(0, whole, per)])
            if rows[whole:]:
                cursor.executemany(f'INSERT INTO "{table}" ({names}) VALUES {values}', rows[whole:])

    def reserve_lead_ids(self, count: int) -> int:
        """The first of `count` consecutive new lead ids, reserved (PostgreSQL) or checked per chunk."""
        if self.postgres:
            database.execute_sql('LOCK TABLE "lead" IN SHARE ROW EXCLUSIVE MODE')
            seq = "pg_get_serial_sequence('lead', 'id')"
            first = database.execute_sql(f"SELECT nextval({seq})").fetchone()[0]
            database.execute_sql(f"SELECT setval({seq}, %s)", (first + count - 1,))
            return first
        return self._max_lead_id() + 1

    def check_ids_free(self, first_id: int) -> None:
        """SQLite hands out max(id) + 1: make sure no lead took an id of ours meanwhile."""
        if not self.postgres and self._max_lead_id() >= first_id:
            raise RuntimeError("Leads were added while synthetic leads were written; run the command again.")

    def _max_lead_id(self) -> int:
        return database.execute_sql('SELECT COALESCE(MAX(id), 0) FROM "lead"').fetchone()[0] or 0

def _taken(phones: list[str], emails: list[str], workspace_id: int) -> tuple[set[str], set[str]]:
    """Which of these phones and e-mails leads of the workspace already have."""
    taken_phones: set[str] = set()
    taken_emails: set[str] = set()
    for i in range(0, max(len(phones), len(emails)), 500):
        if phones[i:i + 500]:
            taken_phones.update(p for (p,) in Lead.select(Lead.phone).where(
                (Lead.workspace == workspace_id) & Lead.phone.in_(phones[i:i + 500])).tuples())
        if emails[i:i + 500]:
            taken_emails.update(e for (e,) in Lead.select(Lead.email).where(
                (Lead.workspace == workspace_id) & Lead.email.in_(emails[i:i + 500])).tuples())
    return taken_phones, taken_emails


def add_leads(workspace: Workspace, count: int, *, seed: int = 1, now: datetime | None = None,
              progress: Callable[[int], None] | None = None) -> int:
    """Add `count` synthetic leads to the workspace; returns how many were written."""
    start = Lead.select().where(Lead.workspace == workspace.id).count()
    generator = Generator(workspace, seed=seed, start=start, now=now or utcnow())
    writer = _Writer()
    # Into empty tables, one transaction that builds the indexes after the rows is several times
    # faster than maintaining every secondary index row by row, and all-or-nothing.
    fresh = not Lead.select().exists()
    written = 0
    with _bulk_session():
        with (transaction() if fresh else _nothing()), \
                (_indexes_built_after((Lead, LeadNamePart, Transition, Activity, Task)) if fresh else _nothing()):
            with transaction():
                first_id = writer.reserve_lead_ids(count)
            for out in _generated(generator, count, first_id):
                with transaction():
                    writer.check_ids_free(out["lead"][0][0])
                    if start > 0:   # an empty workspace cannot clash with our own unique numbers
                        out = _without_taken(out, workspace.id)
                    writer.write(Lead, LEAD_COLUMNS, out["lead"])
                    writer.write(LeadNamePart, NAME_PART_COLUMNS, out["name_part"])
                    writer.write(Transition, TRANSITION_COLUMNS, out["transition"])
                    writer.write(Activity, ACTIVITY_COLUMNS, out["activity"])
                    writer.write(Task, TASK_COLUMNS, out["task"])
                written += len(out["lead"])
                if progress:
                    progress(out["size"])
            if fresh:
                routing.recount_open_leads(workspace.id)   # its triggers were set aside
            with transaction():
                followups.arm_reminders_ahead(workspace.id, generator.now)
                lead_timers.arm_ahead(workspace.id, generator.now)
        gather_statistics()
    return written


def gather_statistics() -> None:
    """Statistics for the planner after a bulk load and, on PostgreSQL, the visibility map:
    without it an index-only scan visits the heap for every row, many times slower for a report
    walking a large index; the timers' too, or PostgreSQL, guessing, reads the whole timer table
    for the clock's "is anything due" instead of one entry of its fire_at index. Autovacuum would
    get there eventually; a bulk load should not wait."""
    if is_postgres():
        database.execute_sql("VACUUM (ANALYZE) lead, lead_name_part, transition, activity, task, timer")   # never inside a transaction
        return
    # A full ANALYZE of a large load reads every index whole; a sample of each
    # index is enough for the planner.
    database.execute_sql("PRAGMA analysis_limit = 1000")
    database.execute_sql("ANALYZE")
    database.execute_sql("PRAGMA analysis_limit = 0")   # the default: ANALYZE reads everything


def _produce(generator: Generator, chunks: list[tuple[int, int, list[datetime]]],
             put: Callable[[Rows | None], None]) -> None:
    for index, first_id, times in chunks:
        put(generator.chunk(index, first_id, times))
    put(None)


def _generated(generator: Generator, count: int, first_id: int) -> Iterator[Rows]:
    """The chunks' rows in order, made by forked workers while this process writes (where fork exists)."""
    times = generator.created_times(count)
    chunks = [(index, first_id + offset, times[offset:offset + CHUNK])
              for index, offset in enumerate(range(0, count, CHUNK))]
    if "fork" not in multiprocessing.get_all_start_methods():
        for index, first, chunk_times in chunks:
            yield generator.chunk(index, first, chunk_times)
        return
    context = multiprocessing.get_context("fork")
    workers = []
    for k in range(WORKERS):
        queue = context.Queue(maxsize=2)
        process = context.Process(target=_produce, args=(generator, chunks[k::WORKERS], queue.put), daemon=True)
        process.start()
        workers.append((process, queue))
    try:
        for index in range(len(chunks)):
            process, queue = workers[index % WORKERS]
            while True:
                try:
                    out = queue.get(timeout=5)
                    break
                except Empty:
                    if not process.is_alive():
                        raise RuntimeError(f"A lead generator stopped (exit code {process.exitcode}).") from None
            yield out
    finally:
        for process, _ in workers:
            if process.is_alive():
                process.terminate()
            process.join()


@contextlib.contextmanager
def _nothing() -> Iterator[None]:
    yield


@contextlib.contextmanager
def _indexes_built_after(models: Sequence[type[pw.Model]]) -> Iterator[None]:
    """Set the tables' secondary indexes, triggers (and PostgreSQL's foreign keys, checked by a
    trigger per row) aside, and create them again, exactly as they were, once the rows are in."""
    dropped: list[str] = []
    restore: list[str] = []
    for model in models:
        table = _table(model)
        if is_postgres():
            for name, definition in database.execute_sql(
                    "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
                    "WHERE conrelid = %s::regclass AND contype = 'f'", (f'"{table}"',)).fetchall():
                dropped.append(f'ALTER TABLE "{table}" DROP CONSTRAINT "{name}"')
                restore.append(f'ALTER TABLE "{table}" ADD CONSTRAINT "{name}" {definition}')
            for name, definition in database.execute_sql(
                    "SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = %s::regclass "
                    "AND NOT tgisinternal", (f'"{table}"',)).fetchall():
                dropped.append(f'DROP TRIGGER "{name}" ON "{table}"')
                restore.append(definition)
            rows = database.execute_sql(
                "SELECT i.relname, pg_get_indexdef(i.oid) FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
                "WHERE x.indrelid = %s::regclass AND NOT x.indisprimary", (f'"{table}"',)).fetchall()
        else:
            for name, definition in database.execute_sql(
                    "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = ?", (table,)).fetchall():
                dropped.append(f'DROP TRIGGER "{name}"')
                restore.append(definition)
            rows = database.execute_sql("SELECT name, sql FROM sqlite_master WHERE type = 'index' "
                                        "AND tbl_name = ? AND sql IS NOT NULL", (table,)).fetchall()
        for name, definition in rows:
            dropped.append(f'DROP INDEX "{name}"')
            restore.insert(0, definition)   # indexes before the constraints that use them
    for statement in dropped:
        database.execute_sql(statement)
    yield
    for statement in restore:
        database.execute_sql(statement)


def _without_taken(out: dict[str, list[tuple]], workspace_id: int) -> dict[str, list[tuple]]:
    """Drop generated leads (and their history) whose phone or e-mail a lead already has."""
    phones = [row[5] for row in out["lead"] if row[5]]
    emails = [row[6] for row in out["lead"] if row[6]]
    taken_phones, taken_emails = _taken(phones, emails, workspace_id)
    if not taken_phones and not taken_emails:
        return out
    dropped = {row[0] for row in out["lead"] if row[5] in taken_phones or row[6] in taken_emails}
    return {"lead": [r for r in out["lead"] if r[0] not in dropped],
            "name_part": [r for r in out["name_part"] if r[0] not in dropped],
            "transition": [r for r in out["transition"] if r[2] not in dropped],
            "activity": [r for r in out["activity"] if r[2] not in dropped],
            "task": [r for r in out["task"] if r[2] not in dropped]}


class _bulk_session:
    """SQLite only, for this thread's connection, which runs the writes: no fsync per commit and
    a large page cache while loading; afterwards the whole load is copied from the WAL into the
    database file, so the file is complete on its own."""

    PRAGMAS = {
        "foreign_keys": "OFF",   # the generator makes every reference itself: no lookup per row
        "synchronous": "OFF",
        "cache_size": -1000000,
        "threads": 2,            # CREATE INDEX sorts in parallel
    }

    def __enter__(self):
        if not is_postgres():
            self.saved = {name: database.execute_sql(f"PRAGMA {name}").fetchone()[0] for name in self.PRAGMAS}
            _set_pragmas(self.PRAGMAS)
        return self

    def __exit__(self, *exc):
        if not is_postgres():
            _set_pragmas(self.saved)
            busy, _, _ = database.execute_sql("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            if busy:
                log.warning("The WAL could not be wholly copied into the database (a reader held on); "
                            "SQLite's next checkpoint goes on.")
        return False


def _set_pragmas(values: dict[str, Any]) -> None:
    for name, value in values.items():
        database.execute_sql(f"PRAGMA {name} = {value}")
