"""Acceptance: dist/leadsvc.pyz runs with a clean Python, outside the checkout, from setup to HTTP."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import PROCESS_SETUP_TOML, bearer
from served import ServedProcess, call, clean_env

ROOT = Path(__file__).resolve().parent.parent
# The interpreter the venv was made from; -I ignores PYTHON* variables and the user's site,
# -S leaves out its site-packages: nothing of the project's venv, nor of the base install, is
# importable but the standard library and what is inside the .pyz.
BASE_PYTHON = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
CLEAN_PYTHON = [str(BASE_PYTHON) if BASE_PYTHON.exists() else sys.executable, "-I", "-S"]


@pytest.fixture(scope="session")
def pyz(tmp_path_factory) -> Path:
    """dist/leadsvc.pyz built once per session, by the same script as `make dist`."""
    output = tmp_path_factory.mktemp("dist") / "leadsvc.pyz"
    subprocess.run([sys.executable, str(ROOT / "tools" / "build_pyz.py"), "--output", str(output)], check=True,
                   cwd=ROOT)
    return output


def run_pyz(pyz: Path, cwd: Path, *args: str) -> dict:
    result = subprocess.run([*CLEAN_PYTHON, str(pyz), *args], cwd=cwd, env=clean_env(), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_the_clean_python_cannot_import_the_projects_packages(tmp_path):
    for module in ("flask", "peewee", "leadsvc", "click"):
        probe = subprocess.run([*CLEAN_PYTHON, "-c", f"import {module}"], cwd=tmp_path, env=clean_env(),
                               capture_output=True)
        assert probe.returncode != 0, f"{module} is importable without the pyz"


@pytest.mark.slow
def test_pyz_sets_up_issues_a_token_and_serves_leads_from_outside_the_checkout(pyz, tmp_path):
    work = tmp_path / "elsewhere"
    work.mkdir()
    app_file = work / "leadsvc.pyz"
    app_file.write_bytes(pyz.read_bytes())
    assert not work.resolve().is_relative_to(ROOT)
    (work / "acme.toml").write_text(PROCESS_SETUP_TOML)

    ids = run_pyz(app_file, work, "setup", "acme.toml", "--json")   # migrations load from inside the zip
    token = run_pyz(app_file, work, "tokens", "create", "--member", ids["members"]["admin@t.test"],
                    "--abilities", "*", "--json")["token"]
    assert (work / "var" / "leadsvc.sqlite3").is_file(), "the default database, relative to the working directory"

    server = ServedProcess({}, work / "serve.log", command=[*CLEAN_PYTHON, str(app_file), "serve", "--port", "{port}"],
                           cwd=work)
    with server:
        base = server.url
        reply = call(base, "POST", "/api/v1/leads", headers=bearer(token),
                     json_body={"first_name": "Asha", "phone": "98765 43210", "source": ids["sources"]["Website"]})
        status, created = reply.status, reply.json()
        assert status == 201 and created["data"]["contact"]["phone"] == "+919876543210"
        reply = call(base, "GET", "/api/v1/leads", headers=bearer(token))
        status, listed = reply.status, reply.json()
        assert status == 200 and [lead["id"] for lead in listed["data"]] == [created["data"]["id"]]
        # Templates and docs assets come out of the zip too.
        assert call(base, "GET", "/docs/api/problems/conflict").status == 200
        assert call(base, "GET", "/docs/assets/swagger_ui/vendor/swagger-ui-bundle.js").status == 200
        assert server.stop() == 0
