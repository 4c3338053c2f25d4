"""Webhook delivery by real processes: the outbox survives SIGKILL right after a 201, and two
`leadsvc worker` processes on one database send each event once."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import WEBHOOK_TEST_ENV, lead_body
from leadsvc.models import Delivery, Webhook
from receiver import Receiver
from served import ServedProcess, call, clean_env, free_port, refuses_connections, wait_until

EVENTS = 200


def environment(database_url: str, **extra: str) -> dict[str, str]:
    return {"LEADSVC_DATABASE_URL": database_url, "LEADSVC_RATE_LIMITS_ENABLED": "false", **WEBHOOK_TEST_ENV, **extra}


def only_this_webhook_is_due(hook_id: str) -> None:
    """The run's tests share a database: what earlier tests left scheduled is not this test's."""
    Delivery.update(next_attempt_at=None).where(
        Delivery.webhook.not_in(Webhook.select(Webhook.id).where(Webhook.public_id == hook_id))).execute()


@pytest.mark.slow
def test_a_committed_event_is_delivered_by_the_restarted_service_after_sigkill(client, ws, database_url, tmp_path):
    with Receiver() as receiver:
        hook = client.post("/api/v1/webhooks", json={"url": receiver.url, "events": ["lead.created"]},
                           headers=ws.headers()).json["data"]
        only_this_webhook_is_due(hook["id"])
        # The first process does not deliver, so the event can only come from the restarted one.
        first = ServedProcess(environment(database_url, LEADSVC_WEBHOOKS_DELIVER_IN_SERVE="false"),
                              tmp_path / "serve-1.log").start()
        created = call(first.url, "POST", "/api/v1/leads", json_body=lead_body(ws), headers=ws.headers())
        first.kill()
        assert created.status == 201
        lead_id = created.json()["data"]["id"]
        assert receiver.received == []

        with ServedProcess(environment(database_url), tmp_path / "serve-2.log"):
            wait_until(lambda: receiver.received, 60, "the event delivered after the restart")
        event = receiver.received[0].verified(hook["secret"])
        assert event["type"] == "lead.created" and event["data"]["lead"]["id"] == lead_id


def start_worker(database_url: str, log: Path, *options: str) -> subprocess.Popen:
    env = clean_env(**environment(database_url))
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "leadsvc.cli", "--config", os.devnull, "worker", *options],
                                env=env, stdout=out, stderr=subprocess.STDOUT)


@pytest.mark.slow
def test_two_workers_deliver_each_of_200_events_once(client, ws, database_url, tmp_path):
    def slowly(request):
        time.sleep(0.005)   # a receiver that takes a moment keeps both workers busy at once
        return 204, {}, b""

    with Receiver(slowly) as receiver:
        hook = client.post("/api/v1/webhooks", json={"url": receiver.url, "events": ["lead.created"]},
                           headers=ws.headers()).json["data"]
        only_this_webhook_is_due(hook["id"])
        logs = [tmp_path / f"worker-{i}.log" for i in (1, 2)]
        workers = [start_worker(database_url, log) for log in logs]
        try:
            for log, worker in zip(logs, workers):
                wait_until(lambda: worker.poll() is None and "delivering webhook events" in log.read_text(), 60,
                           f"the worker started; log: {log}")
            for _ in range(EVENTS):
                assert client.post("/api/v1/leads", json=lead_body(ws), headers=ws.headers()).status_code == 201
            wait_until(lambda: len(receiver.received) >= EVENTS, 120, f"{EVENTS} events received")
            ours = Delivery.select().join(Webhook).where(Webhook.public_id == hook["id"])
            wait_until(lambda: ours.where(Delivery.state == "succeeded").count() == EVENTS, 60, "all recorded")
        finally:
            for worker in workers:
                worker.terminate()
            for worker in workers:
                assert worker.wait(60) == 0
        counts = collections.Counter(request.headers["webhook-id"] for request in receiver.received)
        assert len(counts) == EVENTS and set(counts.values()) == {1}, "each event delivered exactly once"
        assert {row.attempts for row in ours} == {1}
        for request in receiver.received[:5]:
            request.verified(hook["secret"])


def metric(text: str, name: str) -> float:
    """The value of one sample line of a Prometheus text page (0 when absent)."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.slow
def test_a_worker_with_metrics_port_serves_its_delivery_metrics_and_nothing_else(client, ws, database_url, tmp_path):
    port = free_port()
    with Receiver() as receiver:
        hook = client.post("/api/v1/webhooks", json={"url": receiver.url, "events": ["lead.created"]},
                           headers=ws.headers()).json["data"]
        only_this_webhook_is_due(hook["id"])
        log = tmp_path / "worker.log"
        worker = start_worker(database_url, log, "--metrics-port", str(port))
        try:
            wait_until(lambda: worker.poll() is None and "delivering webhook events" in log.read_text(), 60,
                       f"the worker started; log: {log}")
            base = f"http://127.0.0.1:{port}"

            def scrape() -> str:
                page = call(base, "GET", "/metrics")
                assert page.status == 200 and page.headers["content-type"].startswith("text/plain"), log.read_text()
                return page.body.decode()

            before = scrape()
            assert "leadsvc_webhook_backlog " in before and "leadsvc_webhook_lag_seconds_count" in before
            for _ in range(3):
                assert client.post("/api/v1/leads", json=lead_body(ws), headers=ws.headers()).status_code == 201
            wait_until(lambda: len(receiver.received) >= 3, 60, "3 events received")

            def counted() -> str | None:
                page = scrape()
                return page if metric(page, 'leadsvc_webhook_deliveries_total{outcome="succeeded"}') >= 3 else None

            after = wait_until(counted, 30, "the worker counted its deliveries")
            assert metric(after, "leadsvc_webhook_lag_seconds_count") >= 3
            api = call(base, "GET", "/api/v1/leads", headers=ws.headers())
            assert api.status == 404 and api.json()["code"] == "not_found", "the worker serves no API"
        finally:
            worker.terminate()
            assert worker.wait(60) == 0, log.read_text()
        assert "Traceback" not in log.read_text()
        assert refuses_connections(port)
