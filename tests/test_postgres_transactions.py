"""PostgreSQL: a transaction's BEGIN goes with its first statement, in one round trip, and statements
run on every request keep their cursor (db._PooledPostgres)."""

from __future__ import annotations

import peewee as pw
import psycopg
import pytest

from leadsvc.db import database
from leadsvc.models import Team, Workspace, new_public_id

pytestmark = pytest.mark.only_on("postgresql")


@pytest.fixture
def sent(monkeypatch):
    """The SQL each psycopg cursor was given (ClientCursor and RawCursor are Cursors too)."""
    texts = []
    execute = psycopg.Cursor.execute

    def recorded(self, query, *args, **kwargs):
        texts.append(query)
        return execute(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", recorded)
    return texts


def workspace_id(tenant) -> int:
    return Workspace.get(Workspace.public_id == tenant.public_id).id


def status() -> psycopg.pq.TransactionStatus:
    return database.connection().info.transaction_status


def test_begin_goes_with_the_first_statement_and_the_rest_commit_together(app, ws, sent):
    workspace = workspace_id(ws)
    sent.clear()
    with database.atomic():
        assert status() == psycopg.pq.TransactionStatus.IDLE, "BEGIN is not sent on its own"
        Team.create(workspace=workspace, name="First")
        assert status() == psycopg.pq.TransactionStatus.INTRANS
        Team.create(workspace=workspace, name="Second")
    assert len(sent) == 2 and sent[0].startswith('BEGIN; INSERT INTO "team"') and sent[1].startswith("INSERT")
    assert status() == psycopg.pq.TransactionStatus.IDLE
    assert {t.name for t in Team.select().where(Team.workspace == workspace_id(ws))} >= {"First", "Second"}


def test_a_failure_after_the_first_statement_rolls_both_back(app, ws):
    with pytest.raises(RuntimeError), database.atomic():
        Team.create(workspace=workspace_id(ws), name="Rolled back")
        raise RuntimeError("halfway")
    assert not Team.select().where(Team.name == "Rolled back").exists()
    assert status() == psycopg.pq.TransactionStatus.IDLE


def test_a_first_statement_that_fails_raises_peewees_error_and_the_next_transaction_works(app, ws):
    Team.create(workspace=workspace_id(ws), name="Taken")
    with pytest.raises(pw.IntegrityError), database.atomic():
        Team.create(workspace=workspace_id(ws), name="Taken")   # unique per workspace
    assert status() == psycopg.pq.TransactionStatus.IDLE
    with database.atomic():
        Team.create(workspace=workspace_id(ws), name="Next")
    assert Team.select().where(Team.name == "Next").exists()


def test_a_transaction_without_statements_sends_nothing(app, sent):
    with database.atomic():
        pass
    with pytest.raises(RuntimeError), database.atomic():
        raise RuntimeError("before any statement")
    assert sent == []
    assert status() == psycopg.pq.TransactionStatus.IDLE


def test_a_cursor_taken_first_gets_the_begin_on_its_own(app, ws, sent):
    workspace = workspace_id(ws)
    sent.clear()
    with database.atomic():
        database.cursor().execute("SELECT 1")
        assert status() == psycopg.pq.TransactionStatus.INTRANS
        Team.create(workspace=workspace, name="After a cursor")
    assert sent[:2] == ["BEGIN", "SELECT 1"] and sent[2].startswith("INSERT")
    assert Team.select().where(Team.name == "After a cursor").exists()


def test_a_kept_statement_reuses_its_cursor_and_gives_each_runs_rows(app, ws):
    sql = 'SELECT "name" FROM "team" WHERE "workspace_id" = %s AND "name" = %s'
    Team.create(workspace=workspace_id(ws), name="Kept A")
    Team.create(workspace=workspace_id(ws), name="Kept B")
    first = database.execute_kept(sql, [workspace_id(ws), "Kept A"])
    assert first.fetchall() == [("Kept A",)]
    second = database.execute_kept(sql, [workspace_id(ws), "Kept B"])
    assert second is first
    assert second.fetchall() == [("Kept B",)]
    assert database.execute_kept(sql, [workspace_id(ws), "None such"]).fetchall() == []


def test_a_kept_statement_first_in_a_transaction_carries_the_begin(app, ws, sent):
    workspace = workspace_id(ws)
    sql = 'INSERT INTO "team" ("workspace_id", "public_id", "name") VALUES (%s, %s, %s) RETURNING "name"'
    sent.clear()
    with pytest.raises(RuntimeError), database.atomic():
        row = database.execute_kept(sql, [workspace, new_public_id("team_"), "Kept, rolled back"]).fetchone()
        assert row == ("Kept, rolled back",)
        assert status() == psycopg.pq.TransactionStatus.INTRANS
        raise RuntimeError("halfway")
    assert sent == [f"BEGIN; {sql}", "ROLLBACK"]
    assert not Team.select().where(Team.name == "Kept, rolled back").exists()
    with database.atomic():
        database.execute_kept(sql, [workspace, new_public_id("team_"), "Kept, committed"])
    assert Team.select().where(Team.name == "Kept, committed").exists()


def test_a_raw_kept_statement_sends_the_begin_on_its_own(app, ws, sent):
    workspace = workspace_id(ws)
    sql = 'INSERT INTO "team" ("workspace_id", "public_id", "name") VALUES ($1, $2, $3) RETURNING "id"'
    sent.clear()
    with pytest.raises(RuntimeError), database.atomic():
        database.execute_kept(sql, [workspace, new_public_id("team_"), "Raw, rolled back"], raw=True).fetchone()
        raise RuntimeError("halfway")
    assert sent == ["BEGIN", sql, "ROLLBACK"]
    assert not Team.select().where(Team.name == "Raw, rolled back").exists()


def test_a_kept_statement_that_fails_raises_peewees_error_and_runs_again(app, ws):
    sql = 'INSERT INTO "team" ("workspace_id", "public_id", "name") VALUES (%s, %s, %s)'
    database.execute_kept(sql, [workspace_id(ws), new_public_id("team_"), "Unique"])
    with pytest.raises(pw.IntegrityError), database.atomic():
        database.execute_kept(sql, [workspace_id(ws), new_public_id("team_"), "Unique"])   # unique per workspace
    assert status() == psycopg.pq.TransactionStatus.IDLE
    database.execute_kept(sql, [workspace_id(ws), new_public_id("team_"), "Unique too"])
    assert Team.select().where(Team.name == "Unique too").exists()


def test_commit_makes_the_transaction_visible_to_other_connections(app, ws):
    with database.atomic():
        Team.create(workspace=workspace_id(ws), name="Committed")
    with psycopg.connect(**{k: v for k, v in database.connect_params.items() if k != "prefer_psycopg3"},
                         dbname=database.database, autocommit=True) as other:
        assert other.execute("SELECT 1 FROM team WHERE name = 'Committed'").fetchone() == (1,)
