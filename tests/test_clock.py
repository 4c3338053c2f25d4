"""The clock: a timer fires once, at or after its time, whatever number of processes tick; a
function that raises delays only its own timer; a tick with nothing due is one query."""

from __future__ import annotations

import itertools
import logging
import os
import re
import subprocess
import threading
from datetime import timedelta

import pytest

import timer_kind
from conftest import WEBHOOK_TEST_ENV, plan
from leadsvc import clock
from leadsvc.clock import Clock
from leadsvc.config import ConfigError, load_settings
from leadsvc.db import database, is_postgres, transaction
from leadsvc.models import Lead, Timer, Workspace, utcnow
from served import ServedProcess, clean_env, wait_until

KIND = timer_kind.KIND


@pytest.fixture
def ticking(app):
    """A clock on the test's own time: tick(now) fires what is due at `now`."""
    # The run's tests share a database: what earlier tests left armed is not this test's.
    Timer.delete().execute()
    timer_kind.failing.clear()
    yield Clock(app.config["LEADSVC"], metrics=app.extensions["leadsvc.metrics"])
    timer_kind.failing.clear()


@pytest.fixture
def leads(ws, make_lead):
    """Integer ids of new leads of `ws`, the subjects of test timers."""
    def make(count: int) -> list[int]:
        public = [make_lead(ws)["id"] for _ in range(count)]
        return [lead.id for lead in Lead.select(Lead.id).where(Lead.public_id.in_(public)).order_by(Lead.id)]
    return make


def workspace_of(ws) -> int:
    return Workspace.get(Workspace.public_id == ws.public_id).id


def arm_all(ws, subjects, at) -> None:
    with transaction():
        for subject in subjects:
            clock.arm(KIND, subject, workspace_of(ws), at)


def test_a_timer_fires_at_its_time_and_not_before(ticking, ws, leads):
    [lead] = leads(1)
    at = utcnow() + timedelta(hours=1)
    arm_all(ws, [lead], at)
    assert ticking.tick(at - timedelta(seconds=1)) == 0 and timer_kind.fired(lead) == []
    assert ticking.tick(at) == 1
    [event] = timer_kind.fired(lead)
    assert event.workspace_id == workspace_of(ws)
    assert Timer.select().count() == 0, "a fired timer is gone"


def test_a_timer_fires_once_when_ticked_again(ticking, ws, leads):
    [lead] = leads(1)
    arm_all(ws, [lead], utcnow())
    later = utcnow() + timedelta(minutes=5)
    assert ticking.tick(later) == 1 and ticking.tick(later) == 0
    assert len(timer_kind.fired(lead)) == 1


def test_arming_again_moves_the_timer_and_the_function_is_told_the_new_time(ticking, ws, leads):
    [lead] = leads(1)
    first, moved = utcnow() + timedelta(hours=1), utcnow() + timedelta(hours=3)
    arm_all(ws, [lead], first)
    arm_all(ws, [lead], moved)
    assert Timer.select().count() == 1, "one timer per kind and subject"
    assert ticking.tick(first + timedelta(minutes=1)) == 0
    assert ticking.tick(moved) == 1
    [event] = timer_kind.fired(lead)
    assert moved.isoformat() in event.body


def test_disarm_cancels_one_or_many_timers(ticking, ws, leads):
    kept, *cancelled = leads(4)
    arm_all(ws, [kept, *cancelled], utcnow())
    with transaction():
        clock.disarm(KIND, cancelled[0])
        clock.disarm(KIND, cancelled[1:])
    assert ticking.tick(utcnow() + timedelta(minutes=1)) == 1
    assert len(timer_kind.fired(kept)) == 1 and not any(timer_kind.fired(lead) for lead in cancelled)


def test_arming_rolls_back_with_the_change_that_armed_it(ticking, ws, leads):
    [lead] = leads(1)
    with pytest.raises(RuntimeError), transaction():
        clock.arm(KIND, lead, workspace_of(ws), utcnow())
        raise RuntimeError("the change failed")
    assert Timer.select().count() == 0


def test_a_function_that_raises_delays_only_its_own_timer_and_is_tried_again(ticking, ws, leads, caplog):
    poisoned, *healthy = leads(4)
    timer_kind.failing.add(poisoned)
    due = utcnow() - timedelta(minutes=1)
    arm_all(ws, [poisoned, *healthy], due)
    now = utcnow()
    with caplog.at_level(logging.ERROR, logger="leadsvc.clock"):
        assert ticking.tick(now) == 3
    assert all(len(timer_kind.fired(lead)) == 1 for lead in healthy)
    assert timer_kind.fired(poisoned) == [], "the failed function's writes are undone"
    assert "a poisoned timer" in caplog.text
    retry = Timer.get(Timer.subject == poisoned)
    assert retry.fire_at > now and retry.due_at == due

    assert ticking.tick(now) == 0, "not tried again within the same tick"
    timer_kind.failing.clear()
    assert ticking.tick(retry.fire_at) == 1
    [event] = timer_kind.fired(poisoned)
    assert due.isoformat() in event.body, "a retried timer is told the time it was armed for"


def test_a_timer_of_a_kind_no_function_fires_is_left_for_later_and_blocks_nothing(ticking, ws, leads):
    [lead] = leads(1)
    with transaction():
        clock.arm("test.unknown", lead, workspace_of(ws), utcnow() - timedelta(hours=1))
        clock.arm(KIND, lead, workspace_of(ws), utcnow() - timedelta(minutes=1))
    now = utcnow()
    assert ticking.tick(now) == 1
    unknown = Timer.get(Timer.kind == "test.unknown")
    assert unknown.fire_at > now


def test_after_downtime_every_timer_in_the_past_fires_in_one_tick_in_batches(ticking, ws, leads):
    subjects = leads(10)
    ticking.batch = 3
    long_ago = utcnow() - timedelta(days=3)
    arm_all(ws, subjects, long_ago)
    assert ticking.tick() == 10
    assert all(len(timer_kind.fired(lead)) == 1 for lead in subjects)
    assert Timer.select().count() == 0


def test_the_oldest_due_timer_fires_first(ticking, ws, leads):
    subjects = leads(4)
    ticking.batch = 1
    start = utcnow() - timedelta(hours=1)
    with transaction():
        for minutes, subject in zip((3, 1, 4, 2), subjects):
            clock.arm(KIND, subject, workspace_of(ws), start + timedelta(minutes=minutes))
    assert ticking.tick() == 4
    by_event = sorted(subjects, key=lambda lead: timer_kind.fired(lead)[0].id)
    assert by_event == [subjects[1], subjects[3], subjects[0], subjects[2]]


def test_two_clocks_ticking_at_once_fire_each_timer_once(ticking, app, ws, leads):
    subjects = leads(30)
    arm_all(ws, subjects, utcnow() - timedelta(minutes=1))
    clocks = [Clock(app.config["LEADSVC"]) for _ in range(2)]
    for each in clocks:
        each.batch = 4
    start = threading.Barrier(len(clocks))
    counts: list[int] = []
    errors: list[BaseException] = []

    def tick(each: Clock) -> None:
        try:
            start.wait(30)
            counts.append(each.tick())
        except BaseException as exc:   # reported by the test thread
            errors.append(exc)
        finally:
            if not database.is_closed():
                database.close()

    threads = [threading.Thread(target=tick, args=(each,)) for each in clocks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    assert sum(counts) == len(subjects)
    assert all(len(timer_kind.fired(lead)) == 1 for lead in subjects)


def test_a_tick_with_nothing_due_is_one_query(ticking, ws, leads, caplog):
    [lead] = leads(1)
    arm_all(ws, [lead], utcnow() + timedelta(days=1))
    ticking.tick()   # connected, and anything left due by others fired
    with caplog.at_level(logging.DEBUG, logger="peewee"):
        assert ticking.tick() == 0
    # peewee logs each statement it sends at DEBUG; other threads' are not this tick's.
    sent = [record for record in caplog.records if record.name == "peewee" and record.thread == threading.get_ident()]
    assert len(sent) == 1, [record.getMessage() for record in sent]
    assert "timer" in sent[0].getMessage() and "fire_at" in sent[0].getMessage()


def test_a_tick_with_nothing_due_reads_the_start_of_the_fire_at_index_in_any_plan(ticking, ws, caplog):
    """psycopg prepares a statement sent often, and PostgreSQL may then keep one plan for any value
    of its parameters: that plan too must read the fire_at index from its start, not the table."""
    later = utcnow() + timedelta(days=1)
    with transaction():
        clock.arm_all([(KIND, subject, workspace_of(ws), later) for subject in range(1, 5001)])
    with caplog.at_level(logging.DEBUG, logger="peewee"):
        assert ticking.tick() == 0
    [(statement, params)] = [record.msg for record in caplog.records
                             if record.name == "peewee" and record.thread == threading.get_ident()]
    if is_postgres():
        from psycopg import sql

        database.execute_sql("ANALYZE timer")
        numbered = re.sub("%s", lambda _, n=itertools.count(1): f"${next(n)}", statement)
        with transaction():
            database.execute_sql(f"PREPARE nothing_due AS {numbered}")
            database.execute_sql("SET LOCAL plan_cache_mode = force_generic_plan")
            values = sql.SQL(", ").join(map(sql.Literal, params)).as_string(database.connection())
            generic = str(database.execute_sql(f"EXPLAIN (FORMAT JSON) EXECUTE nothing_due({values})").fetchone()[0])
            database.execute_sql("DEALLOCATE nothing_due")
        assert "timer_fire_at" in generic and "Seq Scan" not in generic, (statement, generic)
    else:
        assert "timer_fire_at" in plan(statement, params)
    Timer.delete().execute()


def test_fired_timers_are_counted_in_metrics(ticking, client, ws, leads):
    subjects = leads(2)
    timer_kind.failing.add(subjects[0])
    arm_all(ws, subjects, utcnow())
    ticking.tick(utcnow() + timedelta(seconds=1))
    page = client.get("/metrics").get_data(as_text=True)
    assert f'leadsvc_timers_total{{kind="{KIND}",outcome="fired"}}' in page
    assert f'leadsvc_timers_total{{kind="{KIND}",outcome="failed"}}' in page
    assert "leadsvc_timers_due 0.0" in page


def test_a_running_clock_fires_a_timer_armed_already_due_without_waiting_its_interval(ticking, ws, leads):
    [lead] = leads(1)
    running = ticking.start()
    try:
        arm_all(ws, [lead], utcnow() - timedelta(seconds=1))
        wait_until(lambda: timer_kind.fired(lead), 10, "the timer fired")
    finally:
        running.stop()
    assert not running.thread.is_alive()


# --- settings -------------------------------------------------------------------------------

@pytest.mark.parametrize("environ,message", [
    ({"LEADSVC_CLOCK_INTERVAL": "0"}, "clock.interval must be from 1 to 60 seconds"),
    ({"LEADSVC_CLOCK_INTERVAL": "61"}, "clock.interval must be from 1 to 60 seconds"),
    ({"LEADSVC_CLOCK_INTERVAL": "soon"}, "LEADSVC_CLOCK_INTERVAL must be a whole number"),
    ({"LEADSVC_CLOCK_IN_SERVE": "maybe"}, "LEADSVC_CLOCK_IN_SERVE must be true or false"),
])
def test_bad_clock_settings_stop_start_up_saying_what_is_wrong(environ, message):
    with pytest.raises(ConfigError, match=message):
        load_settings(os.devnull, environ=environ)


def test_clock_settings_default_to_serve_running_it_every_15_seconds():
    settings = load_settings(os.devnull, environ={})
    assert settings["clock"] == {"in_serve": True, "interval": 15}


def test_check_says_who_runs_the_clock(run_cli):
    assert "`leadsvc serve` and `leadsvc worker` run the clock" in run_cli("check").stdout
    assert "only `leadsvc worker` runs (clock.in_serve = false)" in run_cli(
        "check", env={"LEADSVC_CLOCK_IN_SERVE": "false"}).stdout


# --- processes ------------------------------------------------------------------------------

def environment(database_url: str, **extra: str) -> dict[str, str]:
    return {"LEADSVC_DATABASE_URL": database_url, "LEADSVC_RATE_LIMITS_ENABLED": "false", **WEBHOOK_TEST_ENV, **extra}


@pytest.mark.slow
@pytest.mark.parametrize("in_serve", [True, False])
def test_serve_runs_the_clock_unless_clock_in_serve_is_false(app, database_url, tmp_path, in_serve):
    log = tmp_path / "serve.log"
    with ServedProcess(environment(database_url, LEADSVC_CLOCK_IN_SERVE=str(in_serve).lower()), log):
        # The clock starts before the server listens: the answering server has logged it or never will.
        started = "the clock runs in this process" in log.read_text()
    assert started is in_serve


@pytest.mark.slow
def test_two_workers_fire_each_timer_once(ticking, ws, leads, database_url, tmp_path):
    subjects = leads(60)
    logs = [tmp_path / f"worker-{i}.log" for i in (1, 2)]
    env = clean_env(**environment(database_url, LEADSVC_CLOCK_INTERVAL="1"))
    workers = []
    for log in logs:
        with open(log, "ab") as out:
            workers.append(subprocess.Popen(timer_kind.WORKER_COMMAND, env=env, stdout=out, stderr=subprocess.STDOUT))
    try:
        for log, worker in zip(logs, workers):
            wait_until(lambda: worker.poll() is None and "the clock runs in this process" in log.read_text(), 60,
                       f"the worker started; log: {log}")
        arm_all(ws, subjects, utcnow())
        wait_until(lambda: Timer.select().count() == 0, 60, "every timer fired")
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            assert worker.wait(60) == 0
    assert all(len(timer_kind.fired(lead)) == 1 for lead in subjects), "each timer fired once"
    for log in logs:
        assert "Traceback" not in log.read_text()
