"""Delivering webhooks: the retry schedule on an injected clock, disabling, the deliveries log and
replay, where deliveries may go, metrics, and receivers that are slow, silent or broken. Receivers
are real HTTP servers on 127.0.0.1."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from conftest import ADDRESS, deliveries_of, lead_body, register_webhook
from leadsvc.delivery import SCHEDULE, Deliverer
from leadsvc.models import Delivery, Event, Webhook, utcnow
from receiver import RawReceiver, Receiver
from served import wait_until

# --- retries, disabling, the log and replay ------------------------------------------------------

def answering(*answers):
    """A receiver's answers in turn (the last one repeats)."""
    queue = list(answers)

    def respond(request):
        return queue.pop(0) if len(queue) > 1 else queue[0]
    return respond


def test_failures_are_retried_on_the_schedule_then_dead(client, ws, deliverer, clock):
    with Receiver(answering((500, {}, b"boom"))) as failing:
        hook = register_webhook(client, ws, failing.url, ["webhook.test"])
        client.post(f"/api/v1/webhooks/{hook['id']}/test", headers=ws.headers())
        for step, delay in enumerate(SCHEDULE, start=1):
            assert deliverer.deliver_due() == 1
            row = deliveries_of(hook["id"])[0]
            assert row.state == "failed" and row.attempts == step and row.last_status == 500
            assert row.last_response == "boom"
            assert row.next_attempt_at == clock.now + timedelta(seconds=delay), "rng 0.5: no jitter"
            clock.advance(seconds=delay - 1)
            assert deliverer.deliver_due() == 0, "not before it is due"
            clock.advance(seconds=1)
        assert deliverer.deliver_due() == 1
        row = deliveries_of(hook["id"])[0]
        assert row.state == "dead" and row.attempts == len(SCHEDULE) + 1 and row.next_attempt_at is None
        ids = {request.headers["webhook-id"] for request in failing.received}
        assert len(failing.received) == len(SCHEDULE) + 1 and len(ids) == 1, "the same webhook-id on every attempt"


def test_the_schedule_jitters_by_at_most_20_percent(app, client, ws, clock):
    with Receiver(answering((500, {}, b""))) as failing:
        hook = register_webhook(client, ws, failing.url, ["webhook.test"])
        for rng, factor in ((lambda: 0.0, 0.8), (lambda: 1.0, 1.2)):
            client.post(f"/api/v1/webhooks/{hook['id']}/test", headers=ws.headers())
            Deliverer(app.config["LEADSVC"], version="test", clock=clock, rng=rng).deliver_due()
            row = deliveries_of(hook["id"])[-1]
            assert row.next_attempt_at == clock.now + timedelta(seconds=SCHEDULE[0] * factor)


def test_retry_after_on_429_and_503_is_honoured(client, ws, deliverer, clock):
    with Receiver(answering((429, {"Retry-After": "120"}, b""), (503, {"Retry-After": "7"}, b""), (204, {}, b""))) as busy:
        hook = register_webhook(client, ws, busy.url, ["webhook.test"])
        client.post(f"/api/v1/webhooks/{hook['id']}/test", headers=ws.headers())
        deliverer.deliver_due()
        assert deliveries_of(hook["id"])[0].next_attempt_at == clock.now + timedelta(seconds=120)
        clock.advance(seconds=120)
        deliverer.deliver_due()
        assert deliveries_of(hook["id"])[0].next_attempt_at == clock.now + timedelta(seconds=7)
        clock.advance(seconds=7)
        deliverer.deliver_due()
        assert deliveries_of(hook["id"])[0].state == "succeeded"


@pytest.mark.parametrize("value", ["\u00b2", "\u00b9\u00b2\u00b3", "soon", "-5", "1e3"])
def test_a_retry_after_that_is_no_number_of_seconds_keeps_the_schedule(client, ws, deliverer, clock, value):
    # "\u00b2" is a digit to str.isdigit() but not to float(): raised there, the attempt would go
    # unrecorded and be claimed again after every lease, for ever.
    with Receiver(answering((503, {"Retry-After": value}, b""))) as busy:
        hook = register_webhook(client, ws, busy.url, ["webhook.test"])
        client.post(f"/api/v1/webhooks/{hook['id']}/test", headers=ws.headers())
        assert deliverer.deliver_due() == 1
        row = deliveries_of(hook["id"])[0]
        assert row.state == "failed" and row.last_status == 503
        assert row.next_attempt_at == clock.now + timedelta(seconds=SCHEDULE[0])


def test_a_nul_character_in_a_receivers_answer_is_recorded_without_it(client, ws, deliverer, clock):
    # PostgreSQL refuses NUL in text: stored as sent, the outcome would go unrecorded and the
    # delivery be claimed again after every lease, for ever.
    def broken_status_line(sock):
        sock.sendall(b"HTTP/1.1 2\x000 OK\r\nContent-Length: 0\r\n\r\n")

    with Receiver(answering((500, {}, b"bad\x00answer"))) as nul_body, RawReceiver(broken_status_line) as nul_status:
        # By the ids registered here: an earlier test's webhook may hold a receiver's URL (its port) too.
        hook_ids = [register_webhook(client, ws, receiver.url, ["webhook.test"])["id"]
                    for receiver in (nul_body, nul_status)]
        for hook_id in hook_ids:
            client.post(f"/api/v1/webhooks/{hook_id}/test", headers=ws.headers())
        assert deliverer.deliver_due() == 2
        for hook_id in hook_ids:
            listed = client.get(f"/api/v1/webhooks/{hook_id}/deliveries", headers=ws.headers()).json["data"]
            assert [row["state"] for row in listed] == ["failed"] and listed[0]["attempts"] == 1
            assert "\x00" not in (listed[0]["last_response"] or "") + (listed[0]["last_error"] or "")
        assert deliveries_of(hook_ids[0])[0].last_response == "bad\ufffdanswer"


def test_redirects_are_not_followed(client, ws, deliverer):
    with Receiver() as target:
        with Receiver(answering((302, {"Location": target.url}, b""))) as redirecting:
            hook = register_webhook(client, ws, redirecting.url, ["webhook.test"])
            client.post(f"/api/v1/webhooks/{hook['id']}/test", headers=ws.headers())
            deliverer.deliver_due()
            row = deliveries_of(hook["id"])[0]
            assert row.state == "failed" and row.last_status == 302
            assert len(redirecting.received) == 1 and target.received == []


def test_410_disables_the_webhook(client, ws, deliverer):
    with Receiver(answering((500, {}, b""), (410, {}, b"gone"))) as gone:
        hook = register_webhook(client, ws, gone.url, ["webhook.test"])
        for _ in range(2):   # the first fails and is scheduled again; the second gets the 410
            client.post(f"/api/v1/webhooks/{hook['id']}/test", headers=ws.headers())
            deliverer.deliver_due()
        read = client.get(f"/api/v1/webhooks/{hook['id']}", headers=ws.headers()).json["data"]
        assert read["active"] is False and "410" in read["disabled_reason"]
        assert [row.state for row in deliveries_of(hook["id"])] == ["dead", "dead"]
        again = client.patch(f"/api/v1/webhooks/{hook['id']}", json={"active": True}, headers=ws.headers())
        assert again.json["data"]["active"] is True and again.json["data"]["disabled_reason"] is None


def test_each_failed_attempt_logs_one_warning_naming_the_webhook_event_attempt_and_answer(client, ws, deliverer,
                                                                                          caplog):
    import logging

    with Receiver(answering((500, {}, b""), (410, {}, b"gone"))) as gone:
        hook = register_webhook(client, ws, gone.url, ["lead.created"])
        lead = client.post("/api/v1/leads", json=lead_body(ws, email="private.person@example.com"),
                           headers=ws.headers()).json["data"]
        event = Event.select().order_by(Event.id.desc()).first().public_id
        with caplog.at_level(logging.WARNING, logger="leadsvc.delivery"):
            deliverer.deliver_due()
            first = [r.getMessage() for r in caplog.records if r.name == "leadsvc.delivery"]
            caplog.clear()
            Delivery.update(next_attempt_at=utcnow()).where(
                Delivery.id.in_([row.id for row in deliveries_of(hook["id"])])).execute()
            deliverer.deliver_due()
            second = [r.getMessage() for r in caplog.records if r.name == "leadsvc.delivery"]
    assert first == [f"webhook {hook['id']}: event {event}, attempt 1 failed: HTTP 500"]
    assert second == [f"webhook {hook['id']}: event {event}, attempt 2 failed: HTTP 410",
                      f"webhook {hook['id']} disabled: The endpoint answered 410 Gone.",
                      f"webhook {hook['id']}: event {event} given up after attempt 2"]
    assert not any(secret in line for line in first + second
                   for secret in (lead["contact"]["email"], lead["contact"]["phone"], lead["id"]))


def test_three_days_of_failures_disable_the_webhook(client, ws, deliverer, clock):
    with Receiver(answering((500, {}, b""))) as failing:
        hook = register_webhook(client, ws, failing.url, ["webhook.test"])
        for hours in (0, 30, 30, 11):
            clock.advance(hours=hours)
            client.post(f"/api/v1/webhooks/{hook['id']}/test", headers=ws.headers())
            deliverer.deliver_due()
        read = client.get(f"/api/v1/webhooks/{hook['id']}", headers=ws.headers()).json["data"]
        assert read["active"] is True, "71 hours of failures"
        clock.advance(hours=1)
        client.post(f"/api/v1/webhooks/{hook['id']}/test", headers=ws.headers())
        deliverer.deliver_due()
        read = client.get(f"/api/v1/webhooks/{hook['id']}", headers=ws.headers()).json["data"]
        assert read["active"] is False and "3 days" in read["disabled_reason"]
        assert {row.state for row in deliveries_of(hook["id"])} == {"dead"}


def test_a_success_restarts_the_three_days(client, ws, deliverer, clock):
    with Receiver() as flaky:
        hook = register_webhook(client, ws, flaky.url, ["webhook.test"])
        for hours, status in ((0, 500), (40, 204), (40, 500), (39, 500)):
            clock.advance(hours=hours)
            flaky.respond = answering((status, {}, b""))
            client.post(f"/api/v1/webhooks/{hook['id']}/test", headers=ws.headers())
            deliverer.deliver_due()
        assert Webhook.get(Webhook.public_id == hook["id"]).active is True, "119 hours, but 39 since the success"


def test_the_deliveries_log_is_newest_first_with_state_filter_and_cursor(client, ws, receiver, deliverer):
    hook = register_webhook(client, ws, receiver.url, ["webhook.test"])
    sent = [client.post(f"/api/v1/webhooks/{hook['id']}/test", headers=ws.headers()).json["data"]["id"]
            for _ in range(3)]
    first = client.get(f"/api/v1/webhooks/{hook['id']}/deliveries?page[size]=2", headers=ws.headers())
    assert first.status_code == 200 and first.json["meta"]["has_more"] is True
    rest = client.get(first.json["links"]["next"], headers=ws.headers())
    assert [d["id"] for d in first.json["data"] + rest.json["data"]] == sent[::-1]
    deliverer.deliver_due()
    done = client.get(f"/api/v1/webhooks/{hook['id']}/deliveries?filter[state]=succeeded", headers=ws.headers())
    assert {d["state"] for d in done.json["data"]} == {"succeeded"}
    assert client.get(f"/api/v1/webhooks/{hook['id']}/deliveries?filter[state]=lost",
                      headers=ws.headers()).status_code == 422


def test_a_replay_is_the_same_delivery_as_its_next_attempt(client, ws, receiver, deliverer, clock):
    hook = register_webhook(client, ws, receiver.url, ["webhook.test"])
    client.post(f"/api/v1/webhooks/{hook['id']}/test", headers=ws.headers())
    deliverer.deliver_due()
    row = deliveries_of(hook["id"])[0]
    clock.advance(seconds=30)
    replayed = client.post(f"/api/v1/webhooks/{hook['id']}/deliveries/{row.public_id}/replay", headers=ws.headers())
    assert replayed.status_code == 202 and replayed.json["data"]["id"] == row.public_id
    deliverer.deliver_due()
    first, second = receiver.received
    assert first.headers["webhook-id"] == second.headers["webhook-id"]
    assert int(second.headers["webhook-timestamp"]) == int(first.headers["webhook-timestamp"]) + 30
    assert first.body == second.body
    assert deliveries_of(hook["id"])[0].attempts == 2
    assert client.post(f"/api/v1/webhooks/{hook['id']}/deliveries/dlv_{'x' * 20}/replay",
                       headers=ws.headers()).status_code == 404


def test_deactivating_gives_up_scheduled_deliveries(client, ws, deliverer):
    with Receiver(answering((500, {}, b""))) as failing:
        hook = register_webhook(client, ws, failing.url, ["webhook.test"])
        client.post(f"/api/v1/webhooks/{hook['id']}/test", headers=ws.headers())
        deliverer.deliver_due()
        client.patch(f"/api/v1/webhooks/{hook['id']}", json={"active": False}, headers=ws.headers())
        assert [row.state for row in deliveries_of(hook["id"])] == ["dead"]
        assert client.post(f"/api/v1/webhooks/{hook['id']}/test", headers=ws.headers()).status_code == 409


# --- where deliveries go --------------------------------------------------------------------------

def test_the_destination_is_checked_again_at_each_send(client, ws, receiver, app, clock):
    hook = register_webhook(client, ws, receiver.url, ["webhook.test"])
    client.post(f"/api/v1/webhooks/{hook['id']}/test", headers=ws.headers())
    settings = {**app.config["LEADSVC"], "webhooks": {**app.config["LEADSVC"]["webhooks"],
                                                      "allow_private_networks": False}}
    Deliverer(settings, version="test", clock=clock).deliver_due()
    row = deliveries_of(hook["id"])[0]
    assert row.state == "failed" and "not allowed" in row.last_error and receiver.received == []


def test_a_refused_destination_at_send_leaves_no_address_in_last_error(client, ws, receiver, app, clock):
    port = receiver.url.split(":")[2].split("/")[0]
    hook = register_webhook(client, ws, f"http://localhost:{port}/hook", ["webhook.test"])
    client.post(f"/api/v1/webhooks/{hook['id']}/test", headers=ws.headers())
    settings = {**app.config["LEADSVC"], "webhooks": {**app.config["LEADSVC"]["webhooks"],
                                                      "allow_private_networks": False}}
    Deliverer(settings, version="test", clock=clock).deliver_due()
    logged = client.get(f"/api/v1/webhooks/{hook['id']}/deliveries", headers=ws.headers()).json["data"][0]
    assert logged["state"] == "failed" and "localhost is not allowed" in logged["last_error"]
    assert not ADDRESS.search(logged["last_error"]), logged["last_error"]


def test_the_connection_goes_to_the_checked_address_with_the_host_name(client, ws, receiver, deliverer):
    port = receiver.url.split(":")[2].split("/")[0]
    hook = register_webhook(client, ws, f"http://localhost:{port}/hook?source=leadsvc", ["webhook.test"])
    client.post(f"/api/v1/webhooks/{hook['id']}/test", headers=ws.headers())
    deliverer.deliver_due()
    assert receiver.received[0].headers["host"] == f"localhost:{port}"
    assert receiver.received[0].path == "/hook?source=leadsvc"


# --- metrics ------------------------------------------------------------------------------------

def test_metrics_count_deliveries_backlog_and_lag(client, ws, receiver, deliverer):
    hook = register_webhook(client, ws, receiver.url, ["webhook.test"])
    client.post(f"/api/v1/webhooks/{hook['id']}/test", headers=ws.headers())
    assert "leadsvc_webhook_backlog 1" in client.get("/metrics").get_data(as_text=True)
    deliverer.deliver_due()
    text = client.get("/metrics").get_data(as_text=True)
    assert 'leadsvc_webhook_deliveries_total{outcome="succeeded"}' in text
    assert "leadsvc_webhook_backlog 0" in text
    count = next(line for line in text.splitlines() if line.startswith("leadsvc_webhook_lag_seconds_count"))
    assert float(count.split()[1]) >= 1


def test_the_example_receiver_accepts_only_signed_deliveries(client, ws, deliverer, monkeypatch):
    """examples/webhook_receiver.py, which the README runs, mounted behind a real receiver's socket."""
    import importlib.util
    from pathlib import Path

    hook = register_webhook(client, ws, "http://127.0.0.1:9/unused", ["webhook.test"])
    monkeypatch.setenv("WEBHOOK_SECRET", hook["secret"])
    path = Path(__file__).resolve().parent.parent / "examples" / "webhook_receiver.py"
    spec = importlib.util.spec_from_file_location("webhook_receiver", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    forwarded = example.app.test_client()

    def through_the_example(request):
        answer = forwarded.post("/hooks/leadsvc", data=request.body, headers=request.headers)
        return answer.status_code, {}, answer.get_data()

    with Receiver(through_the_example) as receiver:
        client.patch(f"/api/v1/webhooks/{hook['id']}", json={"url": receiver.url}, headers=ws.headers())
        client.post(f"/api/v1/webhooks/{hook['id']}/test", headers=ws.headers())
        deliverer.deliver_due()
        assert deliveries_of(hook["id"])[0].last_status == 204
        forged = forwarded.post("/hooks/leadsvc", data=receiver.received[0].body,
                                headers={**receiver.received[0].headers, "webhook-signature": "v1,Zm9yZ2Vk"})
        assert forged.status_code == 400


def test_a_replay_during_an_attempt_is_not_lost_when_that_attempt_is_recorded(client, ws, receiver, deliverer):
    hook = register_webhook(client, ws, receiver.url, ["webhook.test"])
    client.post(f"/api/v1/webhooks/{hook['id']}/test", headers=ws.headers())
    [claimed] = deliverer.claim(8)
    row = deliveries_of(hook["id"])[0]
    client.post(f"/api/v1/webhooks/{hook['id']}/deliveries/{row.public_id}/replay", headers=ws.headers())
    deliverer.attempt(claimed)   # the attempt under way when the replay came in ends now
    assert deliveries_of(hook["id"])[0].state == "pending", "the replay is still to be sent"
    assert deliverer.deliver_due() == 1 and deliveries_of(hook["id"])[0].state == "succeeded"
    assert len(receiver.received) == 2


def test_a_receiver_that_does_not_answer_holds_up_no_request(app, client, ws):
    release = threading.Event()

    def stuck(request):
        release.wait(60)
        return 204, {}, b""

    with Receiver(stuck) as receiver:
        register_webhook(client, ws, receiver.url, ["lead.created"])
        running = Deliverer(app.config["LEADSVC"], version="test").start()
        try:
            assert client.post("/api/v1/leads", json=lead_body(ws), headers=ws.headers()).status_code == 201
            wait_until(lambda: receiver.received, 30, "a delivery waiting on the receiver")
            created = [client.post("/api/v1/leads", json=lead_body(ws), headers=ws.headers()).status_code
                       for _ in range(20)]
            assert created == [201] * 20, "creates answer while deliveries wait on the receiver"
        finally:
            release.set()
            running.stop()


@pytest.mark.slow
@pytest.mark.parametrize("slow_tenants", [1, 4], ids=["one-workspace", "one-host-for-four-workspaces"])
def test_slow_receivers_of_other_workspaces_keep_a_workspaces_lag_within_its_bound(app, client, make_workspace,
                                                                                  slow_tenants):
    # 16 receivers that accept and never answer, in one workspace or spread over four (all on one
    # host and port). Every attempt ends within the timeout (T), and those tenants hold at most
    # per_workspace (W) and per_host of the 8 sender slots: another workspace's delivery waits for
    # no slot, so its lag stays under T (docs/design.md). Without the caps, oldest first, the 48
    # attempts of three leads would take every slot for T each.
    import time

    timeout = 1.0
    settings = {**app.config["LEADSVC"], "webhooks": {**app.config["LEADSVC"]["webhooks"], "timeout": timeout,
                                                      "per_workspace": 2, "per_host": 2}}
    slow = [make_workspace() for _ in range(slow_tenants)]
    fast = make_workspace()
    stop = threading.Event()
    Delivery.update(next_attempt_at=None).execute()
    with RawReceiver(lambda sock: stop.wait(30)) as tarpit, Receiver() as receiver:
        for n in range(16):
            register_webhook(client, slow[n % slow_tenants], tarpit.url, ["lead.created"])
        register_webhook(client, fast, receiver.url, ["lead.created"])
        running = Deliverer(settings, version="test").start()
        try:
            for n in range(3):
                tenant = slow[n % slow_tenants]
                client.post("/api/v1/leads", json=lead_body(tenant), headers=tenant.headers())
            wait_until(lambda: Delivery.select().where(Delivery.attempts > 0).count() >= 2, 10, "tarpits busy")
            lags = []
            for n in range(6):
                started = time.time()
                assert client.post("/api/v1/leads", json=lead_body(fast), headers=fast.headers()).status_code == 201
                wait_until(lambda: len(receiver.received) > n, 30, "the other workspace's event")
                lags.append(receiver.received[n].at - started)
                time.sleep(0.2)
        finally:
            stop.set()
            running.stop()
    assert max(lags) < timeout, f"lags {[round(lag, 2) for lag in lags]} s, bound {timeout} s"


@pytest.mark.slow
def test_a_delivery_another_process_wrote_behind_a_capped_backlog_is_claimed_within_the_poll_interval(
        app, client, make_workspace):
    # A claim reads the oldest due deliveries. When they all belong to a workspace at its cap, it
    # also looks past that backlog: at once after a commit in this process, and once a poll
    # interval for what other processes wrote. Without that look the other workspace's delivery
    # would wait for the whole backlog (80 attempts of T, two at a time).
    import time

    timeout = 1.0
    settings = {**app.config["LEADSVC"], "webhooks": {**app.config["LEADSVC"]["webhooks"], "timeout": timeout,
                                                      "per_workspace": 2, "per_host": 2}}
    slow, other = make_workspace(), make_workspace()
    stop = threading.Event()
    Delivery.update(next_attempt_at=None).execute()
    with RawReceiver(lambda sock: stop.wait(30)) as tarpit, Receiver() as receiver:
        hook = register_webhook(client, other, receiver.url, ["lead.created"])
        client.post("/api/v1/leads", json=lead_body(other), headers=other.headers())
        [written] = deliveries_of(hook["id"])
        Delivery.update(next_attempt_at=None).where(Delivery.id == written.id).execute()   # not due yet
        for _ in range(16):
            register_webhook(client, slow, tarpit.url, ["lead.created"])
        for _ in range(5):
            client.post("/api/v1/leads", json=lead_body(slow), headers=slow.headers())
        running = Deliverer(settings, version="test").start()
        try:
            wait_until(lambda: Delivery.select().where(Delivery.attempts > 0).count() >= 2, 10, "tarpits busy")
            time.sleep(2 * running.poll)   # past the look of the first claims
            started = time.time()
            # Due now, as another process's commit makes it: nothing in this process wakes the claims.
            Delivery.update(next_attempt_at=utcnow()).where(Delivery.id == written.id).execute()
            wait_until(lambda: receiver.received, 30, "the other workspace's event")
            lag = receiver.received[0].at - started
        finally:
            stop.set()
            running.stop()
    assert lag < timeout, f"lag {lag:.2f} s; the poll interval is {running.poll} s"


class CountingReceiver(RawReceiver):
    """Answers 200 after `delay` seconds, counting the requests it holds at once."""

    def __init__(self, delay: float):
        self.held = self.most_held = self.answered = 0
        self.counting = threading.Lock()
        super().__init__(self.answer_later)
        self.delay = delay

    def answer_later(self, sock) -> None:
        import time

        with self.counting:
            self.held += 1
            self.most_held = max(self.most_held, self.held)
        time.sleep(self.delay)
        with self.counting:
            self.held -= 1
            self.answered += 1
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")


def caps_of_two(app) -> dict:
    return {**app.config["LEADSVC"], "webhooks": {**app.config["LEADSVC"]["webhooks"], "timeout": 3,
                                                  "per_workspace": 2, "per_host": 2}}


@pytest.mark.slow
def test_a_lone_workspaces_backlog_to_a_quick_receiver_borrows_spare_slots_past_its_caps(app, client, ws):
    # Caps bound what a workspace holds when others need the slots; with nobody else due, a
    # receiver that answers quickly gets every slot but one workspace's share.
    Delivery.update(next_attempt_at=None).execute()
    with CountingReceiver(delay=0.1) as receiver:
        register_webhook(client, ws, receiver.url, ["lead.created"])
        for _ in range(40):
            client.post("/api/v1/leads", json=lead_body(ws), headers=ws.headers())
        running = Deliverer(caps_of_two(app), version="test").start()
        try:
            wait_until(lambda: receiver.answered >= 40, 30, "the backlog delivered")
        finally:
            running.stop()
    assert 2 < receiver.most_held <= running.senders - 2


@pytest.mark.slow
def test_slots_lent_to_a_busy_workspace_leave_another_workspace_a_slot_at_once(app, client, make_workspace):
    # While a busy workspace borrows, one workspace's share of the slots stays free: another
    # workspace's delivery is claimed at once, not after a lent attempt ends.
    import time

    busy, other = make_workspace(), make_workspace()
    Delivery.update(next_attempt_at=None).execute()
    with CountingReceiver(delay=0.5) as slowish, Receiver() as receiver:
        register_webhook(client, busy, slowish.url, ["lead.created"])
        register_webhook(client, other, receiver.url, ["lead.created"])
        for _ in range(60):
            client.post("/api/v1/leads", json=lead_body(busy), headers=busy.headers())
        running = Deliverer(caps_of_two(app), version="test").start()
        try:
            wait_until(lambda: slowish.most_held > 2, 10, "the busy workspace borrowing")
            lags = []
            for n in range(4):
                started = time.time()
                client.post("/api/v1/leads", json=lead_body(other), headers=other.headers())
                wait_until(lambda: len(receiver.received) > n, 10, "the other workspace's event")
                lags.append(receiver.received[n].at - started)
        finally:
            running.stop()
    assert max(lags) < 0.5, f"lags {[round(lag, 2) for lag in lags]} s; a lent attempt takes 0.5 s"


def test_a_receiver_that_trickles_its_answer_cannot_hold_an_attempt_past_its_timeout(app, client, ws, clock):
    # A socket's timeout bounds each read: a byte every 0.2 s (timeout 0.5 s) would keep the
    # attempt, and its sender thread, for as long as the receiver liked, past the claim (another
    # process would send it again), and a few such receivers would take every sender thread.
    import time

    stop = threading.Event()

    def trickle(sock):   # for 20 s at most, so that the test ends even when the attempt is not cut
        sock.sendall(b"HTTP/1.1 200 OK\r\n")
        for _ in range(100):
            if stop.wait(0.2):
                return
            sock.sendall(b"X")

    settings = {**app.config["LEADSVC"], "webhooks": {**app.config["LEADSVC"]["webhooks"], "timeout": 0.5}}
    quick = Deliverer(settings, version="test", clock=clock, rng=lambda: 0.5)
    Delivery.update(next_attempt_at=None).execute()
    try:
        with RawReceiver(trickle) as receiver:
            hook = register_webhook(client, ws, receiver.url, ["webhook.test"])
            client.post(f"/api/v1/webhooks/{hook['id']}/test", headers=ws.headers())
            started = time.monotonic()
            assert quick.deliver_due() == 1
            took = time.monotonic() - started
    finally:
        stop.set()
    assert took < 0.5 + 1, f"the attempt took {took:.1f} s"   # the timeout and the watchdog's tick, with room
    assert quick.lease.total_seconds() > 0.5 + 1
    row = deliveries_of(hook["id"])[0]
    assert row.state == "failed" and row.last_status is None and "0.5 s" in row.last_error, "cut off, never a success"
