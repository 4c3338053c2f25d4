"""PostgreSQL: a transaction's BEGIN goes with its first statement, in one round trip (db._PooledPostgres)."""

from __future__ import annotations

import peewee as pw
import psycopg
import pytest

from leadsvc.db import database
from leadsvc.models import Team, Workspace

pytestmark = pytest.mark.only_on("postgresql")


@pytest.fixture
def pipelines(monkeypatch):
    """How many times psycopg's pipeline mode was entered."""
    entered = []
    pipeline = psycopg.Connection.pipeline

    def counted(self, *args, **kwargs):
        entered.append(1)
        return pipeline(self, *args, **kwargs)

    monkeypatch.setattr(psycopg.Connection, "pipeline", counted)
    return entered


def workspace_id(tenant) -> int:
    return Workspace.get(Workspace.public_id == tenant.public_id).id


def status() -> psycopg.pq.TransactionStatus:
    return database.connection().info.transaction_status


def test_begin_goes_with_the_first_statement_and_the_rest_commit_together(app, ws, pipelines):
    with database.atomic():
        assert status() == psycopg.pq.TransactionStatus.IDLE, "BEGIN is not sent on its own"
        Team.create(workspace=workspace_id(ws), name="First")
        assert status() == psycopg.pq.TransactionStatus.INTRANS
        Team.create(workspace=workspace_id(ws), name="Second")
    assert pipelines == [1]
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


def test_a_transaction_without_statements_sends_nothing(app, pipelines):
    with database.atomic():
        pass
    with pytest.raises(RuntimeError), database.atomic():
        raise RuntimeError("before any statement")
    assert pipelines == []
    assert status() == psycopg.pq.TransactionStatus.IDLE


def test_a_cursor_taken_first_gets_the_begin_on_its_own(app, ws, pipelines):
    with database.atomic():
        database.cursor().execute("SELECT 1")
        assert status() == psycopg.pq.TransactionStatus.INTRANS
        Team.create(workspace=workspace_id(ws), name="After a cursor")
    assert pipelines == []
    assert Team.select().where(Team.name == "After a cursor").exists()
