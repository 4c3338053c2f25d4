"""Concurrency: one lead per identity, rotations in step, cursors that never repeat, writers that take turns."""

import random
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import bulk_leads, lead_body, owner_email, with_rules
from leadsvc.db import Turns, database, is_postgres, transaction
from leadsvc.models import Lead, Workspace
from served import call


def test_16_identical_creates_at_once_make_one_lead(live_server, ws):
    body = lead_body(ws, email="race@example.com")
    headers = ws.headers()
    start = threading.Barrier(16)

    def post(_):
        start.wait()
        reply = call(live_server, "POST", "/api/v1/leads", json_body=body, headers=headers)
        return reply.status, reply.json()

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
        reply = call(live_server, "POST", "/api/v1/leads", json_body=lead_body(ws, source=source), headers=headers)
        return reply.status, reply.json()

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
            reply = call(live_server, "POST", "/api/v1/leads", json_body=lead_body(ws), headers=headers)
            status, payload = reply.status, reply.json()
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
    # SQLite's writers of a process take turns: a rollback must hand the turn on, as a commit does.
    with pytest.raises(ZeroDivisionError):
        with transaction():
            Workspace.update(name="never").where(Workspace.public_id == ws.public_id).execute()
            1 / 0
    renamed = threading.Event()

    def write():
        with transaction():
            Workspace.update(name="renamed").where(Workspace.public_id == ws.public_id).execute()
        database.close()
        renamed.set()

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    writer.join(30)
    assert renamed.is_set(), "the second writer never got in"
    assert Workspace.get(Workspace.public_id == ws.public_id).name == "renamed"


@pytest.mark.only_on("sqlite")
def test_sqlite_writers_of_one_process_take_turns_and_a_nested_write_is_part_of_the_outer(app, ws):
    # A second thread's write waits for the first to commit instead of sleeping in SQLite's busy
    # handler; a write inside a write is a savepoint of it, never a wait on itself.
    inside, release, second_done = threading.Event(), threading.Event(), threading.Event()

    def first():
        with transaction():
            with transaction():
                Workspace.update(name="first").where(Workspace.public_id == ws.public_id).execute()
            inside.set()
            release.wait(30)
        database.close()

    def second():
        with transaction():
            Workspace.update(name="second").where(Workspace.public_id == ws.public_id).execute()
        database.close()
        second_done.set()

    threads = [threading.Thread(target=first, daemon=True), threading.Thread(target=second, daemon=True)]
    threads[0].start()
    assert inside.wait(30)
    threads[1].start()
    assert not second_done.wait(0.3), "the second writer waits for the first"
    release.set()
    for thread in threads:
        thread.join(30)
    assert second_done.is_set()
    assert Workspace.get(Workspace.public_id == ws.public_id).name == "second"


def test_turns_come_in_the_order_asked_and_a_wait_that_ends_leaves_the_line():
    turns, order = Turns(), []
    assert turns.take("w", 1)

    def wait_then_note(n):
        assert turns.take("w", 30)
        order.append(n)
        turns.give_back("w")

    waiters = [threading.Thread(target=wait_then_note, args=(n,), daemon=True) for n in range(4)]
    for waiter in waiters:
        waiter.start()
        time.sleep(0.2)   # in line before the next one comes
    assert turns.take("other key", 1), "another key has its own line"
    assert not turns.take("w", 0.05), "the turn is taken"
    turns.give_back("w")
    for waiter in waiters:
        waiter.join(30)
    assert order == [0, 1, 2, 3]
    assert turns.take("w", 0), "the one that gave up waiting left the line"


def test_a_workspaces_creates_take_turns_and_on_postgresql_another_workspaces_do_not_wait(live_server, ws, other_ws):
    # On SQLite every writer of a process waits for the one in its turn; on PostgreSQL only the
    # creates of the same workspace, which routing's rotation would make wait anyway.
    holding, release = threading.Event(), threading.Event()
    workspace_id = Workspace.get(Workspace.public_id == ws.public_id).id

    def hold_the_turn():
        with transaction(turn=workspace_id):
            holding.set()
            release.wait(30)
        database.close()

    def create(tenant, done):
        reply = call(live_server, "POST", "/api/v1/leads", json_body=lead_body(tenant), headers=tenant.headers())
        done.append(reply.status)

    holder = threading.Thread(target=hold_the_turn, daemon=True)
    holder.start()
    assert holding.wait(30)
    same, other = [], []
    creates = [threading.Thread(target=create, args=(ws, same), daemon=True),
               threading.Thread(target=create, args=(other_ws, other), daemon=True)]
    for thread in creates:
        thread.start()
    creates[1].join(0.5 if not is_postgres() else 30)
    assert other == ([201] if is_postgres() else []), "another workspace's create"
    assert same == [], "the same workspace's create waits for the turn"
    release.set()
    for thread in [holder, *creates]:
        thread.join(30)
    assert same == [201] and other == [201]


@pytest.mark.only_on("sqlite")
def test_sqlite_keeps_its_temporary_files_in_memory(app, ws):
    # A lead's INSERT touches 14 B-trees; its statement journal would otherwise go to a file.
    assert database.execute_sql("PRAGMA temp_store").fetchone()[0] == 2   # MEMORY


def test_a_failed_commit_rolls_the_transaction_back_and_the_next_write_works(app, ws, monkeypatch):
    # SQLite may keep a transaction open after its COMMIT failed (a full disk, an I/O error).
    import peewee as pw

    db_class = type(database.obj)
    monkeypatch.setattr(db_class, "commit", lambda self: (_ for _ in ()).throw(
        pw.OperationalError("disk I/O error")), raising=False)
    with pytest.raises(pw.OperationalError, match="disk I/O error"):
        with transaction():
            Workspace.update(name="never committed").where(Workspace.public_id == ws.public_id).execute()
    monkeypatch.undo()
    assert Workspace.get(Workspace.public_id == ws.public_id).name != "never committed"
    with transaction():
        Workspace.update(name="committed after").where(Workspace.public_id == ws.public_id).execute()
    assert Workspace.get(Workspace.public_id == ws.public_id).name == "committed after"


@pytest.mark.slow
def test_creates_while_webhooks_are_deleted_neither_fail_nor_deadlock(live_server, ws):
    # Each create writes a delivery for every webhook its reference data lists; deletes commit in
    # between. On PostgreSQL a create holding the workspace's row (routing's rotation) and a
    # delete holding the webhook's row would wait for each other: a deadlock, 503 on both.
    headers = ws.headers()
    hooks = [call(live_server, "POST", "/api/v1/webhooks", headers=headers,
                  json_body={"url": f"http://127.0.0.1:9/hook{n}", "events": ["*"]}).json()["data"]["id"]
             for n in range(8)]
    start = threading.Barrier(17)

    def create(_):
        start.wait()
        return [call(live_server, "POST", "/api/v1/leads", json_body=lead_body(ws), headers=headers).status
                for _ in range(4)]

    def delete():
        start.wait()
        return [call(live_server, "DELETE", f"/api/v1/webhooks/{hook}", headers=headers).status for hook in hooks]

    with ThreadPoolExecutor(17) as pool:
        creates = [pool.submit(create, n) for n in range(16)]
        deletes = pool.submit(delete)
        created = Counter(status for future in creates for status in future.result())
    assert created == {201: 64} and deletes.result() == [204] * 8, (created, deletes.result())
    assert call(live_server, "GET", "/api/v1/webhooks", headers=headers).json()["data"] == []
