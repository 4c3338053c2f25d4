"""PostgreSQL: a transaction's BEGIN goes with its first statement, in one round trip, and statements
run on every request keep their cursor (db._PooledPostgres)."""

from __future__ import annotations

import peewee as pw
import psycopg
import pytest

from conftest import lead_body, new_phone
from leadsvc.db import database
from leadsvc.models import Activity, Lead, Team, Workspace, new_public_id

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


TEAM_BY_NAME = 'SELECT "name" FROM "team" WHERE "workspace_id" = %s AND "name" = %s'
NEW_TEAM = 'INSERT INTO "team" ("workspace_id", "public_id", "name") VALUES (%s, %s, %s) RETURNING "id"'


def test_a_plain_read_first_in_a_transaction_leaves_begin_to_the_next_statement(app, ws, sent):
    workspace = workspace_id(ws)
    sent.clear()
    with database.atomic():
        assert database.execute_kept(TEAM_BY_NAME, [workspace, "Read first"], plain_read=True).fetchall() == []
        assert status() == psycopg.pq.TransactionStatus.IDLE, "the read went on its own"
        database.execute_kept(NEW_TEAM, [workspace, new_public_id("team_"), "Read first"])
        assert status() == psycopg.pq.TransactionStatus.INTRANS
        database.execute_kept(NEW_TEAM, [workspace, new_public_id("team_"), "Read first, second"])
    assert sent == [TEAM_BY_NAME, f"BEGIN; {NEW_TEAM}", NEW_TEAM]
    assert Team.select().where(Team.name.startswith("Read first")).count() == 2


def test_a_plain_read_goes_inside_a_transaction_of_another_isolation_level(app, ws, sent):
    workspace = workspace_id(ws)
    sent.clear()
    with database.atomic("REPEATABLE READ"):
        database.execute_kept(TEAM_BY_NAME, [workspace, "Repeatable"], plain_read=True).fetchall()
        assert status() == psycopg.pq.TransactionStatus.INTRANS, "its snapshot is the transaction's"
    assert sent == [f"BEGIN TRANSACTION ISOLATION LEVEL REPEATABLE READ; {TEAM_BY_NAME}"]


def test_a_last_statement_sent_first_runs_on_its_own_and_nothing_may_follow(app, ws, sent):
    workspace = workspace_id(ws)
    sent.clear()
    with pytest.raises(pw.InterfaceError, match="nothing may follow"), database.atomic():
        database.execute_kept(NEW_TEAM, [workspace, new_public_id("team_"), "Alone"], last=True)
        assert status() == psycopg.pq.TransactionStatus.IDLE, "no BEGIN, and committed by itself"
        database.execute_kept(NEW_TEAM, [workspace, new_public_id("team_"), "After the last"])
    assert sent == [NEW_TEAM], "neither BEGIN, nor the statement after it, nor ROLLBACK"
    assert Team.select().where(Team.name == "Alone").exists()
    assert not Team.select().where(Team.name == "After the last").exists()
    with database.atomic():   # the next transaction begins as usual
        database.execute_kept(NEW_TEAM, [workspace, new_public_id("team_"), "Next"])
    assert sent[-1] == f"BEGIN; {NEW_TEAM}"


def test_a_last_statement_after_others_commits_with_them(app, ws, sent):
    workspace = workspace_id(ws)
    sent.clear()
    with pytest.raises(pw.IntegrityError), database.atomic():
        database.execute_kept(NEW_TEAM, [workspace, new_public_id("team_"), "Together"])
        database.execute_kept(NEW_TEAM, [workspace, new_public_id("team_"), "Together"], last=True)   # unique
    assert sent == [f"BEGIN; {NEW_TEAM}", NEW_TEAM, "ROLLBACK"]
    assert not Team.select().where(Team.name == "Together").exists(), "the first insert rolled back with it"
    assert status() == psycopg.pq.TransactionStatus.IDLE


def test_a_last_statement_that_fails_on_its_own_leaves_nothing_and_the_connection_idle(app, ws):
    workspace = workspace_id(ws)
    Team.create(workspace=workspace, name="Taken alone")
    with pytest.raises(pw.IntegrityError), database.atomic():
        database.execute_kept(NEW_TEAM, [workspace, new_public_id("team_"), "Taken alone"], last=True)
    assert status() == psycopg.pq.TransactionStatus.IDLE
    with database.atomic():
        database.execute_kept(NEW_TEAM, [workspace, new_public_id("team_"), "After a failure"], last=True)
    assert Team.select().where(Team.name == "After a failure").exists()


def test_a_duplicate_submission_is_a_read_and_one_insert_without_begin_or_commit(client, ws, sent):
    phone = new_phone()
    assert client.post("/api/v1/leads", json=lead_body(ws, phone=phone), headers=ws.headers()).status_code == 201
    sent.clear()
    again = client.post("/api/v1/leads", json=lead_body(ws, phone=phone), headers=ws.headers())
    assert again.status_code == 200 and again.json["duplicate"] is True
    writes = [sql for sql in sent if not sql.startswith("SELECT")]
    assert len(writes) == 1 and writes[0].startswith('INSERT INTO "activity"'), sent
    assert not any("BEGIN" in sql for sql in sent)
    lead = Lead.get(Lead.public_id == again.json["data"]["id"])
    assert [a.kind for a in Activity.select().where(Activity.lead == lead.id)].count("duplicate_submission") == 1
