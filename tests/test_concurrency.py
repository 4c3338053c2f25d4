"""Concurrency: one lead per identity, rotations in step, cursors that never repeat, writers that queue."""

import random
import sqlite3
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import bulk_leads, http, lead_body, standard_setup
from served import wait_until
from leadsvc.db import _QueuedSqlite, database, make_database, migrate
from leadsvc.models import Lead, Workspace
from leadsvc.provision import apply_setup, parse_setup
from test_routing import owner_email, with_rules


def test_16_identical_creates_at_once_make_one_lead(live_server, ws):
    body = lead_body(ws, email="race@example.com")
    headers = ws.headers()
    start = threading.Barrier(16)

    def post(_):
        start.wait()
        return http("POST", f"{live_server}/api/v1/leads", body, headers)

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(post, range(16)))
    statuses = Counter(status for status, _ in results)
    assert statuses == {201: 1, 200: 15}, results
    assert len({payload["data"]["id"] for _, payload in results}) == 1
    assert all(payload["duplicate"] for status, payload in results if status == 200)
    assert Lead.select().where(Lead.email == "race@example.com").count() == 1


def test_20_creates_at_once_keep_each_rotation_and_count_exact(live_server, make_workspace):
    # Creates routed by one rule take turns on its row; the least-open rule's counts move in step.
    ws = make_workspace(with_rules(
        {"name": "Referrals", "when": {"source": ["Referral"]}, "assign": {"team": "South", "strategy": "least_open"}},
        {"name": "North", "assign": {"team": "North", "strategy": "round_robin"}},
        members=lambda members: members + [{"name": "Sue Agent", "email": "s2@t.test", "role": "agent", "team": "South"}]))
    headers = ws.headers()
    start = threading.Barrier(20)

    def post(n):
        start.wait()
        source = ws.ids.sources["Referral" if n % 2 else "Website"]
        return http("POST", f"{live_server}/api/v1/leads", lead_body(ws, source=source), headers)

    with ThreadPoolExecutor(20) as pool:
        results = list(pool.map(post, range(20)))
    assert [status for status, _ in results] == [201] * 20, results
    owners = Counter(owner_email(ws, payload["data"]) for _, payload in results)
    assert owners == {"n1@t.test": 5, "n2@t.test": 5, "s1@t.test": 5, "s2@t.test": 5}


@pytest.mark.parametrize("sort", ["-created_at", "score", "-last_activity_at"])
def test_a_cursor_walk_during_inserts_repeats_nothing_and_misses_nothing(client, live_server, ws, sort):
    bulk_leads(ws, 1000, random.Random(7))
    existing = {row.public_id for row in Lead.select(Lead.public_id).join(Workspace)
                .where(Workspace.public_id == ws.public_id)}
    headers = ws.headers()
    stop = threading.Event()
    inserted = []

    def keep_inserting():
        while not stop.is_set():
            status, payload = http("POST", f"{live_server}/api/v1/leads", lead_body(ws), headers)
            assert status == 201
            inserted.append(payload["data"]["id"])

    writer = threading.Thread(target=keep_inserting)
    writer.start()
    seen, url = [], f"/api/v1/leads?sort={sort}&page[size]=7"
    try:
        while url:
            response = client.get(url, headers=headers)
            assert response.status_code == 200
            seen += [lead["id"] for lead in response.json["data"]]
            url = response.json["links"]["next"]
    finally:
        stop.set()
        writer.join()
    assert inserted, "leads were inserted during the walk"
    assert len(seen) == len(set(seen)), "no lead twice"
    assert existing <= set(seen), "none missed that existed when the walk began"


def test_a_write_that_fails_halfway_lets_the_next_writer_in(app, ws):
    # SQLite's writers queue on a mutex in the process: a rollback must hand it on, as a commit does.
    with pytest.raises(ZeroDivisionError):
        with database.atomic():
            Workspace.update(name="never").where(Workspace.public_id == ws.public_id).execute()
            1 / 0
    renamed = threading.Event()

    def write():
        with database.atomic():
            Workspace.update(name="renamed").where(Workspace.public_id == ws.public_id).execute()
        database.close()
        renamed.set()

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    writer.join(30)
    assert renamed.is_set(), "the second writer never got in"
    assert Workspace.get(Workspace.public_id == ws.public_id).name == "renamed"


class CheckpointFails:
    """A cursor (or connection) whose WAL checkpoints fail as on a disk error."""

    def __init__(self, inner):
        self.inner = inner

    def execute(self, sql, *args):
        if sql.startswith("PRAGMA wal_checkpoint"):
            raise sqlite3.OperationalError("disk I/O error")
        return self.inner.execute(sql, *args)

    def cursor(self, *args):
        return CheckpointFails(self.inner.cursor(*args))

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _checkpointed_database(make_app, tmp_path, monkeypatch, name: str):
    """A migrated SQLite database whose WAL is checkpointed only when the test says so, and a
    check whether a workspace of a given name is in the main file alone, without the WAL."""
    url = f"sqlite:///{tmp_path}/{name}.sqlite3"
    monkeypatch.setattr(_QueuedSqlite, "CHECKPOINT_SECONDS", 10**9)
    monkeypatch.setattr(_QueuedSqlite, "CHECKPOINT_COMMITS", 10**9)
    migrate(make_database(url))
    make_app(database={"url": url})

    def in_database_file(workspace: str) -> bool:
        with sqlite3.connect(f"file:{tmp_path}/{name}.sqlite3?immutable=1", uri=True) as reader:
            if not reader.execute("SELECT 1 FROM sqlite_master WHERE name = 'workspace'").fetchone():
                return False   # not even the schema yet
            return reader.execute("SELECT 1 FROM workspace WHERE name = ?", (workspace,)).fetchone() is not None

    return in_database_file


def _aside_done() -> bool:
    aside = database.obj._aside
    return aside is None or not aside.is_alive()


@pytest.mark.only_on("sqlite")
def test_sqlite_checkpoints_aside_then_finishes_on_the_next_commit(make_app, backend, tmp_path, monkeypatch):
    # wal_autocheckpoint is off. A due checkpoint copies the WAL on a thread of its own; the next
    # commit after it copies the rest on the committing thread, so the WAL is wholly copied.
    in_database_file = _checkpointed_database(make_app, tmp_path, monkeypatch, "checkpoints")
    apply_setup(parse_setup(standard_setup("Only in the WAL")))
    assert not in_database_file("Only in the WAL")

    ran_on = []
    checkpoint = _QueuedSqlite._checkpoint
    monkeypatch.setattr(_QueuedSqlite, "_checkpoint",
                        staticmethod(lambda cursor: ran_on.append(threading.current_thread().name) or checkpoint(cursor)))
    monkeypatch.setattr(_QueuedSqlite, "CHECKPOINT_COMMITS", 1)
    with database.atomic():
        Workspace.update(name="Copied aside").where(Workspace.name == "Only in the WAL").execute()
    wait_until(_aside_done, 30, "the checkpoint aside finished")
    assert ran_on == ["leadsvc-checkpoint"]
    assert in_database_file("Copied aside")

    with database.atomic():
        Workspace.update(name="Copied by the next commit").where(Workspace.name == "Copied aside").execute()
    assert ran_on == ["leadsvc-checkpoint", threading.current_thread().name]
    assert in_database_file("Copied by the next commit")
    database.close()


@pytest.mark.only_on("sqlite")
def test_a_failed_checkpoint_leaves_the_commit_before_it_standing(make_app, backend, tmp_path, monkeypatch, caplog):
    _checkpointed_database(make_app, tmp_path, monkeypatch, "failing-checkpoint")
    queued = type(database.obj)
    open_cursor, connect = queued.cursor, queued._connect
    monkeypatch.setattr(queued, "cursor", lambda self, *args, **kwargs: CheckpointFails(open_cursor(self, *args, **kwargs)))
    monkeypatch.setattr(queued, "_connect", lambda self: CheckpointFails(connect(self)))
    monkeypatch.setattr(queued, "CHECKPOINT_COMMITS", 1)
    with caplog.at_level("WARNING", logger="leadsvc"):
        apply_setup(parse_setup(standard_setup("Kept")))   # starts a checkpoint aside, which fails
        wait_until(_aside_done, 30, "the checkpoint aside finished")
        apply_setup(parse_setup(standard_setup("Kept too")))   # the inline step fails too
    assert Workspace.get(Workspace.name == "Kept") and Workspace.get(Workspace.name == "Kept too")
    assert caplog.text.count("WAL checkpoint failed") >= 2
    database.close()


@pytest.mark.only_on("sqlite")
def test_truncating_the_wal_waits_for_a_checkpoint_aside_and_leaves_the_wal_empty(make_app, backend, tmp_path,
                                                                                  monkeypatch):
    # After a bulk load: SQLite refuses a second checkpoint at once while one runs aside, and the
    # process could end with its rows still in the WAL (leadsvc demo --leads left 3.5 GB there).
    in_database_file = _checkpointed_database(make_app, tmp_path, monkeypatch, "truncated")
    apply_setup(parse_setup(standard_setup("Bulk loaded")))
    release, aside_started = threading.Event(), threading.Event()
    checkpoint = _QueuedSqlite._checkpoint

    def held(cursor):
        if threading.current_thread().name == "leadsvc-checkpoint":
            aside_started.set()
            release.wait(30)
        checkpoint(cursor)

    monkeypatch.setattr(_QueuedSqlite, "_checkpoint", staticmethod(held))
    monkeypatch.setattr(_QueuedSqlite, "CHECKPOINT_COMMITS", 1)
    with database.atomic():   # due: starts the checkpoint aside, held until released
        Workspace.update(name="Bulk loaded, renamed").where(Workspace.name == "Bulk loaded").execute()
    assert aside_started.wait(30)
    truncating = threading.Thread(target=lambda: (database.obj.truncate_wal(), database.close()))
    truncating.start()
    truncating.join(0.3)
    assert truncating.is_alive(), "it waits for the checkpoint aside"
    release.set()
    truncating.join(30)
    assert not truncating.is_alive() and database.obj._aside is None
    assert in_database_file("Bulk loaded, renamed")
    assert (tmp_path / "truncated.sqlite3-wal").stat().st_size == 0
    database.close()


@pytest.mark.only_on("sqlite")
def test_sqlite_keeps_its_temporary_files_in_memory_for_writes_and_reads(app, ws):
    # A lead's INSERT touches 14 B-trees; its statement journal would otherwise go to a file.
    assert database.execute_sql("PRAGMA temp_store").fetchone()[0] == 2   # MEMORY
    with database.atomic():
        assert database.execute_sql("PRAGMA temp_store").fetchone()[0] == 2   # on the writer connection


@pytest.mark.only_on("sqlite")
def test_sqlite_writes_of_every_thread_share_one_connection_and_reads_keep_their_own(app, ws):
    # A connection's page cache is dropped whenever another one wrote: the writes share one
    # connection so that its cache stays warm; reads outside a write stay side by side.
    seen = {}

    def write(name):
        own = database.connection()
        with database.atomic():
            Workspace.update(name=name).where(Workspace.public_id == ws.public_id).execute()
            seen[name] = database.connection()
        assert database.connection() is own, "the thread's own connection is back after the write"
        database.close()

    threads = [threading.Thread(target=write, args=(f"thread {n}",)) for n in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(seen) == 3 and len({id(conn) for conn in seen.values()}) == 1
    assert database.connection() is not seen["thread 0"]
    assert Workspace.get(Workspace.public_id == ws.public_id).name.startswith("thread ")
    with pytest.raises(ZeroDivisionError):
        with database.atomic():
            assert database.connection() is seen["thread 0"]
            1 / 0
    assert database.connection() is not seen["thread 0"], "a rollback gives the thread its own back too"


@pytest.mark.only_on("sqlite")
def test_a_failed_commit_is_rolled_back_on_the_shared_writer_connection(app, ws, monkeypatch):
    # SQLite may keep a transaction open after its COMMIT failed (a full disk, an I/O error); the
    # next writer must not find the shared connection inside it.
    import peewee as pw

    monkeypatch.setattr(pw.SqliteDatabase, "commit", lambda self: (_ for _ in ()).throw(
        pw.OperationalError("disk I/O error")), raising=False)
    with pytest.raises(pw.OperationalError, match="disk I/O error"):
        with database.atomic():
            Workspace.update(name="never committed").where(Workspace.public_id == ws.public_id).execute()
    monkeypatch.undo()
    assert Workspace.get(Workspace.public_id == ws.public_id).name != "never committed"
    with database.atomic():
        Workspace.update(name="committed after").where(Workspace.public_id == ws.public_id).execute()
    assert Workspace.get(Workspace.public_id == ws.public_id).name == "committed after"


@pytest.mark.only_on("sqlite")
def test_writer_pragmas_set_the_connection_that_runs_the_writes(app):
    before = database.obj.writer_pragmas({"cache_size": -12345})
    try:
        with database.atomic():
            assert database.execute_sql("PRAGMA cache_size").fetchone()[0] == -12345
        assert database.execute_sql("PRAGMA cache_size").fetchone()[0] != -12345, "a thread's own connection"
    finally:
        database.obj.writer_pragmas(before)


@pytest.mark.only_on("sqlite")
def test_a_write_request_holds_the_sqlite_write_turn_from_its_first_statement_to_its_teardown(app, ws):
    # Write requests of a process run one at a time on the writer connection (its warm cache
    # serves the token lookup too); a commit inside one does not end its turn, its teardown does,
    # and a transaction it left open is rolled back then. Reads never take the turn.
    turn = database.obj._writer
    with app.test_request_context("/api/v1/leads", method="GET", headers=ws.headers()):
        app.preprocess_request()
        assert not turn.locked()
    with app.test_request_context("/api/v1/leads", method="POST", headers=ws.headers()):
        app.preprocess_request()
        assert turn.locked()
        writer = database.connection()
        with database.atomic():
            assert database.connection() is writer
            Workspace.update(name="committed").where(Workspace.public_id == ws.public_id).execute()
        assert turn.locked() and database.connection() is writer, "the commit left the turn with the request"
        database.begin()
        Workspace.update(name="left open").where(Workspace.public_id == ws.public_id).execute()
        blocked = threading.Event()

        def other_write():
            with database.atomic():
                blocked.set()
            database.close()

        other = threading.Thread(target=other_write, daemon=True)
        other.start()
        other.join(0.3)
        assert not blocked.is_set(), "another thread's write waits for the request"
    other.join(30)
    assert blocked.is_set() and not turn.locked()
    assert database.connection() is not writer
    assert Workspace.get(Workspace.public_id == ws.public_id).name == "committed"
