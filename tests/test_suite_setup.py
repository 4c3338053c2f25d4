"""`make test` on a stock PostgreSQL: the suite makes its own database from the `postgres` one,
and a run without a reachable server says so in its summary, with how to point it at one."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
UNREACHABLE = "postgresql://postgres@127.0.0.1:1/postgres"   # nothing listens on port 1


def environment(**changes: str | None) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "CI"}
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def test_by_default_the_suite_connects_to_the_postgres_database_every_server_has():
    found = subprocess.run([sys.executable, "-c", "import conftest; print(conftest.POSTGRES_BASE_URL)"],
                           cwd=ROOT / "tests", env=environment(LEADSVC_TEST_POSTGRES_URL=None),
                           capture_output=True, text=True, timeout=60)
    assert found.stdout.strip() == "postgresql://postgres@127.0.0.1:5432/postgres", found.stderr


@pytest.mark.slow
def test_a_run_without_postgresql_says_so_in_its_summary_with_how_to_point_it_at_one():
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                          "tests/test_reference.py::test_reference_data_needs_a_token", "-k", "postgresql"],
                         cwd=ROOT, env=environment(LEADSVC_TEST_POSTGRES_URL=UNREACHABLE),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    summary = run.stdout[run.stdout.index("PostgreSQL"):]
    assert f"The PostgreSQL half of the suite did not run: {UNREACHABLE} is unreachable" in summary, run.stdout
    assert "LEADSVC_TEST_POSTGRES_URL=postgresql://USER@HOST:PORT/postgres" in summary


@pytest.mark.slow
def test_on_ci_a_run_without_postgresql_fails():
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                          "tests/test_reference.py::test_reference_data_needs_a_token", "-k", "postgresql"],
                         cwd=ROOT, env={**environment(LEADSVC_TEST_POSTGRES_URL=UNREACHABLE), "CI": "true"},
                         capture_output=True, text=True, timeout=300)
    assert run.returncode != 0 and "CI=true requires it" in run.stdout


@pytest.mark.slow
def test_a_run_with_postgresql_says_that_half_ran_with_its_counts(postgres_server):
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                          "tests/test_reference.py::test_reference_data_needs_a_token"],
                         cwd=ROOT, env=environment(LEADSVC_TEST_POSTGRES_URL=postgres_server),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    ran = re.search(r"The PostgreSQL half of the suite ran: (\d+) passed, 0 failed; the SQLite half: (\d+) passed, "
                    r"0 failed\.", run.stdout)
    assert ran and int(ran[1]) == int(ran[2]) > 0, run.stdout   # the test's every case, once on each database
