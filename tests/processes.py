"""Helpers for tests that run leadsvc as real processes: free ports, readiness, HTTP calls, stopping."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from served import free_port  # noqa: F401  (re-exported: the process tests take it from here)

DEADLINE = 90   # seconds: generous, the machine may be busy; nothing here measures speed

# A small workspace for processes started from a setup file: three agents on two teams.
SETUP_TOML = """\
[workspace]
name = "Process Test"

[[teams]]
name = "North"
[[teams]]
name = "South"

[[members]]
name = "Ada Admin"
email = "admin@t.test"
role = "admin"
[[members]]
name = "Neel Agent"
email = "n1@t.test"
role = "agent"
team = "North"
[[members]]
name = "Nora Agent"
email = "n2@t.test"
role = "agent"
team = "North"
[[members]]
name = "Sid Agent"
email = "s1@t.test"
role = "agent"
team = "South"

[[statuses]]
name = "New"
kind = "open"
[[statuses]]
name = "Won"
kind = "won"

[[sources]]
name = "Website"
score = 10
"""


def clean_env(**settings: str) -> dict[str, str]:
    """The environment without any LEADSVC_* of the caller, plus these settings."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("LEADSVC_")}
    env.update(settings)
    return env


def call(method: str, url: str, token: str | None = None, body: Any = None) -> tuple[int, Any]:
    """An HTTP request; the status and the JSON body (or None)."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=DEADLINE) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read()
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode()


def wait_until_serving(process: subprocess.Popen, base: str) -> None:
    """Poll /healthz until it answers 200; fail if the process exits or the deadline passes."""
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the server exited with {process.returncode} before serving")
        try:
            if call("GET", f"{base}/healthz")[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{base} did not come up within {DEADLINE} s")


def refuses_connections(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return False
    except OSError:
        return True


def stop(process: subprocess.Popen) -> int:
    """SIGTERM, then the exit code (killing it if it does not stop within the deadline)."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(DEADLINE)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


def leadsvc(env: dict[str, str], cwd: Any, *args: str) -> str:
    """Run a `leadsvc` command in a child process; its output, or fail with its errors."""
    result = subprocess.run([sys.executable, "-m", "leadsvc.cli", *args], env=env, cwd=cwd, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout
