"""Concurrency through a real waitress server: one lead per identity, cursors that never repeat."""

import random
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import bulk_leads, http, lead_body
from leadsvc.models import Lead, Workspace


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
