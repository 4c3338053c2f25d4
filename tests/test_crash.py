"""Acceptance 3: a served process killed with SIGKILL while a client creates leads as fast as it can.

After a restart, every lead that was answered 201 (or 200) is there, every lead is whole (its
first transition, its created and assigned activities, its created audit entry), no history row
lacks its lead, and every request sent again with its Idempotency-Key either replays the lead it
made or makes it now: a lead never exists without the record of the request that made it.
"""

from __future__ import annotations

import threading
import uuid

import peewee as pw
import pytest

from leadsvc.models import Activity, AuditEntry, Lead, Transition, Workspace
from served import ServedProcess, call, wait_until

CLIENTS = 4
KILL_AFTER = 40   # acknowledged creates before the kill


@pytest.mark.slow
def test_sigkill_mid_stream_loses_no_acknowledged_lead_and_half_writes_nothing(database_url, ws, tmp_path):
    headers = ws.headers()
    environment = {"LEADSVC_DATABASE_URL": database_url, "LEADSVC_RATE_LIMITS_ENABLED": "false"}
    sent: dict[str, dict] = {}                 # idempotency key -> body
    acknowledged: dict[str, str] = {}          # idempotency key -> lead id answered 201/200
    lock = threading.Lock()
    stop = threading.Event()

    def create_until_the_server_dies(server: ServedProcess, worker: int):
        n = 0
        while not stop.is_set():
            n += 1
            key = f"crash-{worker}-{n}-{uuid.uuid4().hex[:8]}"
            body = {"first_name": "Crash", "email": f"{key}@crash.test"}
            with lock:
                sent[key] = body
            try:
                reply = call(server.url, "POST", "/api/v1/leads", json_body=body,
                             headers={**headers, "Idempotency-Key": key}, timeout=10)
            except OSError:
                return   # the server is gone
            if reply.status in (200, 201):
                with lock:
                    acknowledged[key] = reply.json()["data"]["id"]

    server = ServedProcess(environment, tmp_path / "serve-1.log").start()
    workers = [threading.Thread(target=create_until_the_server_dies, args=(server, i)) for i in range(CLIENTS)]
    for worker in workers:
        worker.start()
    wait_until(lambda: len(acknowledged) >= KILL_AFTER, 120, f"{KILL_AFTER} leads created")
    server.kill()
    stop.set()
    for worker in workers:
        worker.join(30)

    with ServedProcess(environment, tmp_path / "serve-2.log") as restarted:
        for key, lead_id in acknowledged.items():
            assert call(restarted.url, "GET", f"/api/v1/leads/{lead_id}", headers=headers).status == 200, key

        workspace = Workspace.get(Workspace.public_id == ws.public_id)
        leads = {lead.public_id: lead for lead in Lead.select().where(Lead.workspace == workspace.id)}
        assert set(acknowledged.values()) <= set(leads)
        assert_every_lead_is_whole(workspace, leads)

        unanswered = 0
        for key, body in sent.items():
            again = call(restarted.url, "POST", "/api/v1/leads", json_body=body,
                         headers={**headers, "Idempotency-Key": key})
            assert again.status == 201, (key, again.status, again.body[:200])
            if key in acknowledged:
                assert again.headers.get("idempotent-replayed") == "true"
                assert again.json()["data"]["id"] == acknowledged[key]
            unanswered += key not in acknowledged
    print(f"\ncrash test ({database_url.split(':')[0]}): {len(acknowledged)} acknowledged, "
          f"{len(leads)} leads after the restart, {len(sent)} sent, {unanswered} unanswered and retried")


def assert_every_lead_is_whole(workspace: Workspace, leads: dict[str, Lead]) -> None:
    ids = [lead.id for lead in leads.values()]
    first_transitions = {row.lead_id for row in Transition.select(Transition.lead)
                         .where(Transition.lead.in_(ids) & Transition.from_status.is_null())}
    activities: dict[int, set[str]] = {}
    for row in Activity.select(Activity.lead, Activity.kind).where(Activity.lead.in_(ids)):
        activities.setdefault(row.lead_id, set()).add(row.kind)
    audited = {row.lead_id for row in AuditEntry.select(AuditEntry.lead)
               .where(AuditEntry.lead.in_(ids) & (AuditEntry.action == "created"))}
    for public_id, lead in leads.items():
        assert lead.id in first_transitions, f"{public_id} has no first transition"
        assert {"created", "assigned"} <= activities.get(lead.id, set()), f"{public_id} lacks its activities"
        assert lead.id in audited, f"{public_id} has no created audit entry"
    for model in (Transition, Activity, AuditEntry):
        orphans = (model.select(model.id).join(Lead, pw.JOIN.LEFT_OUTER, on=(model.lead == Lead.id))
                   .where((model.workspace == workspace.id) & model.lead.is_null(False) & Lead.id.is_null()))
        assert orphans.count() == 0, f"{model.__name__} rows without their lead"
