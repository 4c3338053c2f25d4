"""Task reminders: `task.due` at remind_at and `task.overdue` at due_at, each fired once per time by
the clock (on the test's own time), again when that time moves, never for a closed task or an
erased lead; and by real `leadsvc worker` processes, once each, also after they were down."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime, timedelta

import pytest

from conftest import WEBHOOK_TEST_ENV, register_webhook
from leadsvc import jsoncodec
from leadsvc.clock import Clock
from leadsvc.fields import rfc3339
from leadsvc.models import Event, Timer, utcnow
from served import clean_env, wait_until

REMINDERS = ["task.due", "task.overdue"]
# `leadsvc worker`, reading no config file but the environment's settings.
WORKER = [sys.executable, "-c", "from leadsvc.cli import cli; cli(prog_name='leadsvc')", "--config", os.devnull,
          "worker"]


@pytest.fixture
def ticking(app, client, ws):
    """A clock on the test's own time, and a webhook that wants the reminders (events are written
    only for a webhook that wants them)."""
    Timer.delete().execute()   # what earlier tests of the run left armed is not this test's
    register_webhook(client, ws, "http://127.0.0.1:9/reminders", REMINDERS)
    return Clock(app.config["LEADSVC"])


def add_task(client, ws, lead_id, due: datetime, **fields):
    body = {"kind": "call", "title": "Call back about the villa", "due_at": rfc3339(due), **fields}
    response = client.post(f"/api/v1/leads/{lead_id}/tasks", json=body, headers=ws.headers())
    assert response.status_code == 201, response.get_json()
    return response.json["data"]


def fired(task_id: str) -> list[tuple[str, dict]]:
    """(type, data) of the reminder events written for the task, oldest first."""
    bodies = [jsoncodec.decode(event.body) for event in Event.select().where(Event.type.in_(REMINDERS))
              .order_by(Event.id)]
    return [(body["type"], body["data"]) for body in bodies if body["data"]["task"]["id"] == task_id]


def test_a_task_fires_task_due_at_its_reminder_and_task_overdue_at_its_due_time_once_each(
        ticking, client, ws, make_lead):
    lead = make_lead(ws, owner="n1@t.test")
    now = utcnow()
    remind, due = now + timedelta(hours=1), now + timedelta(hours=2)
    task = add_task(client, ws, lead["id"], due, remind_at=rfc3339(remind))
    assert ticking.tick(remind - timedelta(seconds=1)) == 0 and fired(task["id"]) == []
    assert ticking.tick(remind) == 1 and ticking.tick(remind + timedelta(minutes=5)) == 0
    assert [kind for kind, _ in fired(task["id"])] == ["task.due"]
    assert ticking.tick(due) == 1 and ticking.tick(due + timedelta(days=1)) == 0
    events = fired(task["id"])
    assert [kind for kind, _ in events] == ["task.due", "task.overdue"]
    for _, data in events:
        assert data["task"]["id"] == task["id"] and data["task"]["state"] == "open"
        assert data["lead"]["id"] == lead["id"] and data["lead"]["open_tasks"] == 1


def test_moving_the_due_time_arms_task_overdue_again_and_other_changes_do_not(ticking, client, ws, make_lead):
    lead = make_lead(ws, owner="n1@t.test")
    due = utcnow() + timedelta(hours=1)
    task = add_task(client, ws, lead["id"], due)
    assert ticking.tick(due) == 1
    retitled = client.patch(f"/api/v1/tasks/{task['id']}", json={"title": "Call at noon"}, headers=ws.headers())
    assert retitled.status_code == 200
    assert ticking.tick(due + timedelta(minutes=1)) == 0
    later = due + timedelta(hours=3)
    moved = client.patch(f"/api/v1/tasks/{task['id']}", json={"due_at": rfc3339(later)}, headers=ws.headers())
    assert moved.status_code == 200
    assert ticking.tick(later - timedelta(seconds=1)) == 0
    assert ticking.tick(later) == 1
    assert [kind for kind, _ in fired(task["id"])] == ["task.overdue", "task.overdue"]


def test_removing_the_reminder_disarms_task_due(ticking, client, ws, make_lead):
    lead = make_lead(ws, owner="n1@t.test")
    now = utcnow()
    task = add_task(client, ws, lead["id"], now + timedelta(hours=2), remind_at=rfc3339(now + timedelta(hours=1)))
    assert client.patch(f"/api/v1/tasks/{task['id']}", json={"remind_at": None},
                        headers=ws.headers()).status_code == 200
    ticking.tick(now + timedelta(hours=3))
    assert [kind for kind, _ in fired(task["id"])] == ["task.overdue"]


def test_a_task_created_past_due_fires_task_overdue_at_the_next_tick(ticking, client, ws, make_lead):
    lead = make_lead(ws, owner="n1@t.test")
    task = add_task(client, ws, lead["id"], utcnow() - timedelta(hours=1))
    assert ticking.tick(utcnow()) == 1
    [(kind, data)] = fired(task["id"])
    assert kind == "task.overdue" and data["task"]["overdue"] is True


def test_completed_and_cancelled_tasks_and_tasks_of_erased_leads_fire_nothing(ticking, client, ws, make_lead):
    due = utcnow() + timedelta(hours=1)
    done, cancelled, kept = (add_task(client, ws, make_lead(ws, owner="n1@t.test")["id"], due,
                                      remind_at=rfc3339(due - timedelta(minutes=30))) for _ in range(3))
    client.post(f"/api/v1/tasks/{done['id']}/complete", json={"outcome": "Spoke to her"}, headers=ws.headers())
    client.post(f"/api/v1/tasks/{cancelled['id']}/cancel", headers=ws.headers())
    erased = client.post(f"/api/v1/leads/{kept['lead']['id']}/erase", json={"reason": "asked"}, headers=ws.headers())
    assert erased.status_code == 200
    ticking.tick(due + timedelta(days=1))
    assert fired(done["id"]) == fired(cancelled["id"]) == fired(kept["id"]) == []
    assert not Timer.select().exists()


@pytest.mark.slow
def test_real_workers_fire_each_reminder_once_also_after_downtime(ticking, client, ws, make_lead, database_url,
                                                                   tmp_path):
    env = clean_env(LEADSVC_DATABASE_URL=database_url, LEADSVC_RATE_LIMITS_ENABLED="false",
                    LEADSVC_CLOCK_INTERVAL="1", **WEBHOOK_TEST_ENV)
    runs = iter(range(100))

    def start_workers(count: int) -> list[tuple[subprocess.Popen, object]]:
        started = []
        for _ in range(count):
            log = tmp_path / f"worker-{next(runs)}.log"
            with open(log, "ab") as out:
                started.append((subprocess.Popen(WORKER, env=env, stdout=out, stderr=subprocess.STDOUT), log))
        for worker, log in started:
            wait_until(lambda: worker.poll() is None and "the clock runs in this process" in log.read_text(), 60,
                       f"the worker started; log: {log}")
        return started

    def stop(workers) -> None:
        for worker, _ in workers:
            worker.terminate()
        for worker, log in workers:
            assert worker.wait(60) == 0
            assert "Traceback" not in log.read_text()

    def overdue_once(tasks) -> bool:
        return all([kind for kind, _ in fired(task["id"])] == ["task.overdue"] for task in tasks)

    # Two workers at once: each reminder falls due while both tick.
    workers = start_workers(2)
    try:
        due = utcnow() + timedelta(seconds=2)
        together = [add_task(client, ws, make_lead(ws, owner="n1@t.test")["id"], due) for _ in range(20)]
        wait_until(lambda: overdue_once(together), 60, "every reminder fired")
    finally:
        stop(workers)
    # Downtime: reminders fall due while no clock runs; the next worker fires them, a restart not again.
    due = utcnow() + timedelta(seconds=1)
    missed = [add_task(client, ws, make_lead(ws, owner="n1@t.test")["id"], due) for _ in range(10)]
    wait_until(lambda: utcnow() > due, 10, "the reminders' time passed")
    assert all(fired(task["id"]) == [] for task in missed)
    workers = start_workers(1)
    try:
        wait_until(lambda: overdue_once(missed), 60, "the missed reminders fired after the downtime")
    finally:
        stop(workers)
    # A restart: its first ticks fire a new reminder (so they ran), and none of those fired before.
    workers = start_workers(1)
    try:
        sentinel = add_task(client, ws, make_lead(ws, owner="n1@t.test")["id"], utcnow())
        wait_until(lambda: overdue_once([sentinel]), 60, "the restarted worker's clock ticked")
    finally:
        stop(workers)
    assert overdue_once(together) and overdue_once(missed), "nothing fired twice"
