"""Acceptance: two `leadsvc serve` processes on one PostgreSQL and one Redis act as one service."""

from __future__ import annotations

import json
import sys
from collections import Counter

import pytest

from conftest import PROCESS_SETUP_TOML, bearer, create_postgres_database, drop_postgres_database
from served import ServedProcess, call, clean_env, leadsvc

PER_TOKEN = 5   # requests per minute per token, across both processes


@pytest.fixture
def two_processes(postgres_server, redis_url, tmp_path):
    """Processes A and B on a fresh PostgreSQL database and the shared Redis; yields (bases, env, cwd)."""
    url = create_postgres_database(postgres_server)
    # Limits are kept per token public id (random per run), so parallel runs never share a key.
    settings = dict(LEADSVC_DATABASE_URL=url, LEADSVC_RATE_LIMITS_STORAGE=redis_url,
                    LEADSVC_RATE_LIMITS_PER_TOKEN=f"{PER_TOKEN}/minute", LEADSVC_SERVER_THREADS="4")
    env = clean_env(**settings)
    (tmp_path / "setup.toml").write_text(PROCESS_SETUP_TOML)
    processes = []
    try:
        ids = json.loads(leadsvc(env, tmp_path, "setup", "setup.toml", "--json"))
        for name in ("a", "b"):
            processes.append(ServedProcess(settings, tmp_path / f"{name}.log", cwd=tmp_path,
                                           command=[sys.executable, "-m", "leadsvc.cli", "serve", "--port", "{port}"]))
        for process in processes:
            process.start()
        yield [process.url for process in processes], ids, (env, tmp_path)
        assert [process.stop() for process in processes] == [0, 0], "both stop gracefully"
    finally:
        for process in processes:
            process.stop()
        drop_postgres_database(url)


def new_token(ids, env_cwd):
    return json.loads(leadsvc(*env_cwd, "tokens", "create", "--member", ids["members"]["admin@t.test"],
                              "--abilities", "*", "--json"))["token"]


@pytest.mark.slow
def test_two_processes_share_one_tokens_rate_limit_and_one_round_robin(two_processes):
    (a, b), ids, env_cwd = two_processes

    # 3 requests to A and 3 to B with one token: together one over the limit of 5.
    token = new_token(ids, env_cwd)
    statuses = [call(base, "GET", "/api/v1/statuses", headers=bearer(token)).status for base in (a, b, a, b, a, b)]
    assert sorted(statuses) == [200] * PER_TOKEN + [429]
    assert statuses[-1] == 429

    # Creates alternating between the processes go round the three agents in turn.
    owners = []
    for batch in range(3):   # three tokens, so the limit of 5 is never reached
        token = new_token(ids, env_cwd)
        for i in range(3):
            n = batch * 3 + i
            reply = call((a, b)[n % 2], "POST", "/api/v1/leads", headers=bearer(token),
                         json_body={"phone": f"+91987650{n:04d}"})
            status, body = reply.status, reply.json()
            assert status == 201, body
            owners.append(body["data"]["owner"]["id"])
    agents = [ids["members"][email] for email in ("n1@t.test", "n2@t.test", "s1@t.test")]
    assert Counter(owners) == {agent: 3 for agent in agents}
    assert all(owners[i] == owners[i % 3] for i in range(len(owners))), "a strict rotation, not two interleaved ones"
