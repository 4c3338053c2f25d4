"""The `leadsvc` command: demo, setup, tokens, openapi, check and migrate, with the JSON shapes the contract gives."""

import json
import os
import re
import shlex
import socket
from datetime import timedelta

import pytest

from conftest import bearer
from leadsvc.models import Token, Webhook, Workspace, utcnow

TOKEN = re.compile(r"^lsk_[0-9A-Za-z]{32,}$")
DEMO_EMAILS = {"admin@demo.test", "asha@demo.test", "vikram@demo.test", "ravi@demo.test", "meera@demo.test",
               "arjun@demo.test", "kavya@demo.test"}


def ok(result):
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    return result


def failed(result, *fragments):
    """The command exited non-zero, printing each fragment and no traceback."""
    assert result.exit_code != 0, result.output
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr
    return result


# --- demo ------------------------------------------------------------------------------------

def test_demo_json_prints_the_workspace_and_a_working_token_per_member(run_cli, client):
    body = json.loads(ok(run_cli("demo", "--json")).stdout)
    assert set(body) == {"workspace", "tokens"} and body["workspace"].startswith("ws_")
    assert set(body["tokens"]) == DEMO_EMAILS
    for email, token in body["tokens"].items():
        assert set(token) == {"id", "token", "member", "role"}
        assert token["id"].startswith("tok_") and token["member"].startswith("mem_") and TOKEN.match(token["token"])
        assert client.get("/api/v1/statuses", headers=bearer(token["token"])).status_code == 200
    assert {t["role"] for t in body["tokens"].values()} == {"admin", "manager", "agent"}


def test_demo_twice_keeps_the_workspace_and_gives_new_working_tokens(run_cli, client):
    first = json.loads(ok(run_cli("demo", "--json")).stdout)
    second = json.loads(ok(run_cli("demo", "--json")).stdout)
    assert second["workspace"] == first["workspace"]
    assert Workspace.select().where(Workspace.name == "Demo Realty").count() == 1
    for email in DEMO_EMAILS:
        assert second["tokens"][email]["member"] == first["tokens"][email]["member"]
        assert second["tokens"][email]["token"] != first["tokens"][email]["token"]
        assert client.get("/api/v1/members", headers=bearer(second["tokens"][email]["token"])).status_code == 200


def test_demo_twice_leaves_one_live_set_of_demo_tokens(run_cli, client):
    first = json.loads(ok(run_cli("demo", "--json")).stdout)
    second = json.loads(ok(run_cli("demo", "--json")).stdout)
    for email in DEMO_EMAILS:
        old = client.get("/api/v1/statuses", headers=bearer(first["tokens"][email]["token"]))
        assert old.status_code == 401 and "revoked" in old.json["detail"]
        assert client.get("/api/v1/statuses", headers=bearer(second["tokens"][email]["token"])).status_code == 200
    workspace = Workspace.get(Workspace.public_id == second["workspace"])
    live = Token.select().where((Token.workspace == workspace.id) & Token.revoked_at.is_null())
    assert sorted(t.public_id for t in live) == sorted(t["id"] for t in second["tokens"].values())


def test_demo_tokens_expire_within_30_days(run_cli):
    body = json.loads(ok(run_cli("demo", "--json")).stdout)
    for token in Token.select().where(Token.public_id.in_([t["id"] for t in body["tokens"].values()])):
        assert token.expires_at is not None and token.expires_at <= utcnow() + timedelta(days=30)


def test_demo_says_it_revoked_the_earlier_tokens_and_until_when_the_new_ones_work(run_cli):
    ok(run_cli("demo"))
    output = ok(run_cli("demo")).stdout
    assert "(the 7 an earlier run printed are revoked)" in output
    assert f"valid until {(utcnow() + timedelta(days=30)).strftime('%Y-%m-%d')}" in output


def test_demo_prints_a_curl_line_that_works(run_cli, client):
    output = ok(run_cli("demo")).stdout
    line = next(line for line in output.splitlines() if line.strip().startswith("curl "))
    words = shlex.split(line)
    header, url = words[words.index("-H") + 1], words[-1]
    assert url == "http://127.0.0.1:8080/api/v1/leads"
    name, _, value = header.partition(": ")
    response = client.get(url.removeprefix("http://127.0.0.1:8080"), headers={name: value})
    assert response.status_code == 200 and "data" in response.json


def test_demo_prints_the_page_url_of_each_demo_form_on_the_configured_host_and_port(run_cli, client):
    output = ok(run_cli("demo", env={"LEADSVC_SERVER_HOST": "127.0.0.2", "LEADSVC_SERVER_PORT": "8123"})).stdout
    urls = re.findall(r"http://127\.0\.0\.2:8123/forms/form_\w+", output)
    assert urls, output
    for url in urls:
        page = client.get(url.removeprefix("http://127.0.0.2:8123"))
        assert page.status_code == 200 and page.mimetype == "text/html"


# --- setup -----------------------------------------------------------------------------------

SETUP_FILE = """\
[workspace]
name = "{name}"

[[teams]]
name = "North"

[[members]]
name = "Asha Rao"
email = "Asha@Acme.test"
role = "manager"
team = "North"

[[statuses]]
name = "New"
kind = "open"

[[statuses]]
name = "Won"
kind = "won"

[[sources]]
name = "Website"
score = 10

[[custom_fields]]
name = "budget_confirmed"
type = "boolean"

[[rules]]
name = "All to Asha"
assign = {{ member = "asha@acme.test" }}

[[forms]]
name = "Enquiry"
source = "Website"

[[lost_reasons]]
name = "Price"
"""


def test_setup_json_prints_every_id_by_name(run_cli, tmp_path):
    path = tmp_path / "acme.toml"
    path.write_text(SETUP_FILE.format(name="CLI Acme"))
    body = json.loads(ok(run_cli("setup", str(path), "--json")).stdout)
    assert list(body) == ["workspace", "teams", "members", "statuses", "sources", "custom_fields", "rules", "forms",
                          "lost_reasons", "connectors"]
    assert body["workspace"].startswith("ws_")
    prefixes = {"teams": "team_", "members": "mem_", "statuses": "st_", "sources": "src_",
                "custom_fields": "cf_", "rules": "rule_", "forms": "form_", "lost_reasons": "lr_"}
    for section, prefix in prefixes.items():
        assert body[section] and all(pid.startswith(prefix) for pid in body[section].values()), section
    assert list(body["members"]) == ["asha@acme.test"]
    assert list(body["statuses"]) == ["New", "Won"]


def test_setup_without_json_names_what_it_set_up(run_cli, tmp_path):
    path = tmp_path / "acme.toml"
    path.write_text(SETUP_FILE.format(name="CLI Acme text"))
    output = ok(run_cli("setup", str(path))).stdout
    assert "is set up from" in output and "statuses: New st_" in output


# --- tokens ----------------------------------------------------------------------------------

def test_tokens_create_json_issues_a_token_with_only_its_abilities(run_cli, client, ws):
    member = ws.ids.members["nmgr@t.test"]
    result = ok(run_cli("tokens", "create", "--member", member, "--abilities", "leads:read, leads:create",
                        "--name", "zapier", "--json"))
    body = json.loads(result.stdout)
    assert set(body) == {"id", "token", "member", "abilities"}
    assert body["member"] == member and body["abilities"] == ["leads:create", "leads:read"]
    assert body["id"].startswith("tok_") and TOKEN.match(body["token"])
    assert client.get("/api/v1/leads", headers=bearer(body["token"])).status_code == 200
    forbidden = client.post("/api/v1/leads/ld_0000000000000000xxxx/status", json={"status": "st_0000000000000000xxxx"},
                            headers=bearer(body["token"]))
    assert forbidden.status_code == 403 and "leads:status" in forbidden.json["detail"]
    assert Token.get(Token.public_id == body["id"]).name == "zapier"


def test_tokens_create_with_expiry(run_cli, ws):
    body = json.loads(ok(run_cli("tokens", "create", "--member", ws.ids.members["admin@t.test"],
                                 "--abilities", "*", "--expires-in", "30", "--json")).stdout)
    token = Token.get(Token.public_id == body["id"])
    assert (token.expires_at - token.created_at).days == 30


def test_tokens_create_without_json_shows_the_secret_once(run_cli, ws):
    output = ok(run_cli("tokens", "create", "--member", ws.ids.members["admin@t.test"], "--abilities", "*")).stdout
    assert re.search(r"^  lsk_[0-9A-Za-z]{32,}$", output, re.M) and "shown only now" in output


@pytest.mark.parametrize("member, abilities, message", [
    ("mem_doesNotExist000000", "leads:read", "No member mem_doesNotExist000000"),
    ("n1@t.test", "leads:read,reports:read", "Agents cannot hold reports:read"),
    ("n1@t.test", "leads:assign", "Agents cannot hold leads:assign"),
    ("admin@t.test", "leads:read,leads:reed", "Unknown abilities: leads:reed"),
    ("admin@t.test", " , ", "Give at least one ability"),
])
def test_tokens_create_refuses_with_a_clear_message(run_cli, ws, member, abilities, message):
    member_id = ws.ids.members.get(member, member)
    count = Token.select().count()
    failed(run_cli("tokens", "create", "--member", member_id, "--abilities", abilities), message)
    assert Token.select().count() == count


def test_tokens_create_refuses_a_deactivated_member(run_cli, make_workspace):
    def deactivate(data):
        next(m for m in data["members"] if m["email"] == "n1@t.test")["active"] = False

    tenant = make_workspace(deactivate)
    failed(run_cli("tokens", "create", "--member", tenant.ids.members["n1@t.test"], "--abilities", "*"),
           "is deactivated")


def test_tokens_list_shows_ids_and_never_secrets(run_cli, ws):
    member = ws.ids.members["nmgr@t.test"]
    created = json.loads(ok(run_cli("tokens", "create", "--member", member, "--abilities", "leads:read",
                                    "--json")).stdout)
    other = ws.token("admin@t.test")
    listing = ok(run_cli("tokens", "list", "--member", member)).stdout
    assert created["id"] in listing and "leads:read" in listing and "active" in listing
    assert created["token"] not in listing and "lsk_" not in listing
    assert other not in ok(run_cli("tokens", "list")).stdout


def test_tokens_list_tells_expired_from_expiring(run_cli, ws):
    member = ws.ids.members["admin@t.test"]
    expiring = json.loads(ok(run_cli("tokens", "create", "--member", member, "--abilities", "*",
                                     "--expires-in", "1", "--json")).stdout)
    expired = json.loads(ok(run_cli("tokens", "create", "--member", member, "--abilities", "*",
                                    "--expires-in", "1", "--json")).stdout)
    Token.update(expires_at=utcnow() - timedelta(days=1)).where(Token.public_id == expired["id"]).execute()
    lines = {line.split()[0]: line for line in ok(run_cli("tokens", "list", "--member", member)).stdout.splitlines()}
    assert " expires " in lines[expiring["id"]] and " expired " in lines[expired["id"]]


def test_tokens_list_for_a_member_without_tokens(run_cli, ws):
    assert "No tokens." in ok(run_cli("tokens", "list", "--member", ws.ids.members["s1@t.test"])).stdout


def test_tokens_revoke_makes_the_token_401(run_cli, client, ws):
    body = json.loads(ok(run_cli("tokens", "create", "--member", ws.ids.members["admin@t.test"],
                                 "--abilities", "*", "--json")).stdout)
    assert client.get("/api/v1/statuses", headers=bearer(body["token"])).status_code == 200
    assert f"Token {body['id']} is revoked." in ok(run_cli("tokens", "revoke", body["id"])).stdout
    response = client.get("/api/v1/statuses", headers=bearer(body["token"]))
    assert response.status_code == 401 and "revoked" in response.json["detail"]
    assert "revoked" in ok(run_cli("tokens", "list", "--member", body["member"])).stdout
    ok(run_cli("tokens", "revoke", body["id"]))   # revoking again is harmless


def test_tokens_revoke_of_an_unknown_token_says_so(run_cli, app):
    failed(run_cli("tokens", "revoke", "tok_doesNotExist000000"), "No token tok_doesNotExist000000", "tokens list")


def created_token(run_cli, member: str) -> dict:
    return json.loads(ok(run_cli("tokens", "create", "--member", member, "--abilities", "*", "--json")).stdout)


def test_tokens_revoke_takes_several_ids(run_cli, client, ws):
    tokens = [created_token(run_cli, ws.ids.members["admin@t.test"]) for _ in range(3)]
    output = ok(run_cli("tokens", "revoke", tokens[0]["id"], tokens[1]["id"])).stdout
    assert f"Token {tokens[0]['id']} is revoked." in output and f"Token {tokens[1]['id']} is revoked." in output
    assert [client.get("/api/v1/statuses", headers=bearer(t["token"])).status_code for t in tokens] == [401, 401, 200]


def test_tokens_revoke_with_an_unknown_id_revokes_none_of_them(run_cli, client, ws):
    token = created_token(run_cli, ws.ids.members["admin@t.test"])
    failed(run_cli("tokens", "revoke", token["id"], "tok_doesNotExist000000"),
           "No token tok_doesNotExist000000; nothing was revoked")
    assert client.get("/api/v1/statuses", headers=bearer(token["token"])).status_code == 200


def test_tokens_revoke_all_of_a_member_leaves_other_members_tokens(run_cli, client, ws):
    admin, manager = ws.ids.members["admin@t.test"], ws.ids.members["nmgr@t.test"]
    theirs = [created_token(run_cli, admin) for _ in range(2)]
    other = created_token(run_cli, manager)
    assert "Revoked 2 tokens of Ada Admin" in ok(run_cli("tokens", "revoke", "--all", "--member", admin)).stdout
    assert [client.get("/api/v1/statuses", headers=bearer(t["token"])).status_code for t in theirs] == [401, 401]
    assert client.get("/api/v1/statuses", headers=bearer(other["token"])).status_code == 200


@pytest.mark.parametrize("args", [(), ("--all",), ("--member", "mem_x"), ("tok_x", "--all", "--member", "mem_x")])
def test_tokens_revoke_needs_ids_or_all_with_a_member(run_cli, app, args):
    result = run_cli("tokens", "revoke", *args)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "Give the ids of the tokens to revoke (tok_...), or --all --member MEM_ID" in result.stderr


def test_tokens_revoke_all_of_an_unknown_member_says_how_to_find_members(run_cli, app):
    failed(run_cli("tokens", "revoke", "--all", "--member", "mem_doesNotExist000000"),
           "No member mem_doesNotExist000000", "leadsvc members --workspace")


# --- version, workspaces, members --------------------------------------------------------------

def test_version_prints_the_version_of_the_package(run_cli):
    from importlib.metadata import version

    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]
    assert ok(run_cli("--version")).stdout == f"leadsvc {project['version']}\n"
    assert version("leadsvc") == project["version"]


def test_workspaces_lists_every_workspace_by_id_and_name(run_cli, ws, other_ws):
    listed = json.loads(ok(run_cli("workspaces", "--json")).stdout)["workspaces"]
    name = Workspace.get(Workspace.public_id == ws.public_id).name
    assert {"id": ws.public_id, "name": name} in listed and other_ws.public_id in {w["id"] for w in listed}
    assert f"{ws.public_id}  {name}" in ok(run_cli("workspaces")).stdout.splitlines()


def test_members_lists_a_workspaces_members_with_role_team_and_state(run_cli, ws, other_ws):
    body = json.loads(ok(run_cli("members", "--workspace", ws.public_id, "--json")).stdout)
    assert body["workspace"] == ws.public_id
    by_email = {m["email"]: m for m in body["members"]}
    assert set(by_email) == set(ws.ids.members)
    assert by_email["nmgr@t.test"] == {"id": ws.ids.members["nmgr@t.test"], "name": "Nina North",
                                       "email": "nmgr@t.test", "role": "manager", "team": "North", "active": True}
    assert by_email["admin@t.test"]["team"] is None
    text = ok(run_cli("members", "--workspace", ws.public_id)).stdout
    assert ws.ids.members["s1@t.test"] in text and other_ws.ids.members["s1@t.test"] not in text


def test_a_workspace_option_takes_the_workspaces_name_too(run_cli, ws):
    name = Workspace.get(Workspace.public_id == ws.public_id).name
    body = json.loads(ok(run_cli("members", "--workspace", name, "--json")).stdout)
    assert body["workspace"] == ws.public_id
    assert json.loads(ok(run_cli("subject", "--workspace", name, "--phone", "98765 43210")).stdout) == {"leads": []}


def test_an_unknown_workspace_says_how_to_list_them(run_cli, app):
    failed(run_cli("members", "--workspace", "No Such Realty"), "No workspace No Such Realty",
           "`leadsvc workspaces` lists them")


# --- openapi, check, migrate -----------------------------------------------------------------

def test_openapi_prints_the_document(run_cli):
    document = json.loads(ok(run_cli("openapi")).stdout)
    assert document["openapi"] == "3.1.0" and "/api/v1/leads" in document["paths"]


def test_openapi_output_writes_a_file(run_cli, tmp_path):
    path = tmp_path / "openapi.json"
    ok(run_cli("openapi", "--output", str(path)))
    assert json.loads(path.read_text()) == json.loads(run_cli("openapi").stdout)


def test_check_passes_on_a_migrated_database(run_cli):
    output = ok(run_cli("check")).stdout
    assert "ok: configuration is valid" in output and "up to date" in output


def test_check_fails_on_an_unreachable_postgresql(run_cli):
    failed(run_cli("check", env={"LEADSVC_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/leadsvc",
                                 "LEADSVC_DATABASE_POOL_TIMEOUT": "1"}),
           "postgresql://postgres@127.0.0.1:1/leadsvc does not answer")


@pytest.mark.parametrize("command", ["check", "migrate", "serve"])
def test_postgresql_without_its_driver_is_a_clear_error(run_cli, monkeypatch, command):
    import peewee

    from leadsvc import db

    open_database = db._open

    def without_driver(*args):
        with monkeypatch.context() as driverless:   # as peewee finds them when neither is installed
            driverless.setattr(peewee, "psycopg", None)
            driverless.setattr(peewee, "psycopg2", None)
            return open_database(*args)

    monkeypatch.setattr(db, "_open", without_driver)
    failed(run_cli(command, env={"LEADSVC_DATABASE_URL": "postgresql://postgres@127.0.0.1:5432/no_driver_here"}),
           "cannot import psycopg", "pip install 'psycopg[binary]'")


def test_check_fails_on_an_unmigrated_database(run_cli, tmp_path):
    failed(run_cli("check", env={"LEADSVC_DATABASE_URL": f"sqlite:///{tmp_path}/missing.sqlite3"}),
           "does not exist yet", "leadsvc migrate")
    import sqlite3
    sqlite3.connect(tmp_path / "empty.sqlite3").execute("CREATE TABLE unrelated (x)").connection.close()
    failed(run_cli("check", env={"LEADSVC_DATABASE_URL": f"sqlite:///{tmp_path}/empty.sqlite3"}),
           "needs migrations", "leadsvc migrate")


def registered_webhook(run_cli, ws) -> dict:
    created = run_cli("webhooks", "create", "--workspace", ws.public_id, "--url", "http://127.0.0.1:9/hook", "--json")
    return json.loads(ok(created).stdout)


def test_check_fails_when_webhooks_are_registered_and_the_secret_key_is_missing(run_cli, ws):
    registered_webhook(run_cli, ws)
    failed(run_cli("check", env={"LEADSVC_WEBHOOKS_SECRET_KEY": ""}),
           "webhooks.secret_key is empty", "cannot be signed", "LEADSVC_WEBHOOKS_SECRET_KEY",
           "the key they were created with")


def test_webhook_secrets_outlive_a_restart_with_secret_key_file(run_cli, ws, tmp_path):
    from leadsvc.config import load_settings
    from leadsvc.events import signing_secrets

    key_file = tmp_path / "secret.key"
    key_file.write_text("r" * 43 + "\n")
    env = {"LEADSVC_WEBHOOKS_SECRET_KEY": None, "LEADSVC_WEBHOOKS_SECRET_KEY_FILE": str(key_file)}
    created = json.loads(ok(run_cli("webhooks", "create", "--workspace", ws.public_id, "--url",
                                    "http://127.0.0.1:9/hook", "--json", env=env)).stdout)
    restarted = load_settings(os.devnull, environ={"LEADSVC_WEBHOOKS_SECRET_KEY_FILE": str(key_file)})
    hook = Webhook.get(Webhook.public_id == created["id"])
    assert signing_secrets(hook, restarted["webhooks"]["secret_key"], utcnow()) == [created["secret"]]


def test_an_unreadable_secret_key_file_stops_the_command_naming_it(run_cli, tmp_path):
    missing = tmp_path / "nowhere.key"
    failed(run_cli("check", env={"LEADSVC_WEBHOOKS_SECRET_KEY": None, "LEADSVC_WEBHOOKS_SECRET_KEY_FILE": str(missing)}),
           f"webhooks.secret_key_file {missing} cannot be read")


def test_check_fails_on_a_secret_key_shorter_than_32_characters(run_cli, ws):
    registered_webhook(run_cli, ws)
    failed(run_cli("check", env={"LEADSVC_WEBHOOKS_SECRET_KEY": "x" * 31}),
           "webhooks.secret_key must be at least 32 characters")


def test_check_reports_webhooks_and_lists_the_disabled_ones_with_their_reason(run_cli, ws):
    from leadsvc.db import transaction
    from leadsvc.delivery import disable
    from leadsvc.models import Webhook

    hook = registered_webhook(run_cli, ws)
    with transaction():
        disable(Webhook.get(Webhook.public_id == hook["id"]), "Every delivery failed for 3 days (last: HTTP 500).")
    output = ok(run_cli("check")).stdout
    assert re.search(r"^ok: \d+ webhooks? registered .*webhooks.secret_key is set", output, re.M), output
    line = next(line for line in output.splitlines() if hook["id"] in line)
    assert line.startswith("ok: ") and "is disabled" in line and "Every delivery failed for 3 days (last: HTTP 500)" in line
    assert '"active": true' in line, "says how to turn it on again"


def test_worker_metrics_port_needs_metrics_enabled_and_a_free_port(run_cli):
    failed(run_cli("worker", "--metrics-port", "9", env={"LEADSVC_METRICS_ENABLED": "false"}),
           "--metrics-port needs metrics.enabled = true")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        failed(run_cli("worker", "--metrics-port", str(taken.getsockname()[1])), "Cannot listen on 127.0.0.1:",
               "--metrics-port")


def test_commands_never_print_a_database_password(run_cli):
    result = run_cli("check", env={"LEADSVC_DATABASE_URL": "postgresql://app:s3cret@127.0.0.1:1/leadsvc",
                                   "LEADSVC_DATABASE_POOL_TIMEOUT": "1"})
    failed(result, "postgresql://app:***@127.0.0.1:1/leadsvc")
    assert "s3cret" not in result.output


def test_migrate_is_idempotent(run_cli):
    first, second = ok(run_cli("migrate")), ok(run_cli("migrate"))
    assert "is up to date" in second.stdout and "Applied" not in second.stderr
    assert first.stdout == second.stdout


def test_migrate_builds_a_fresh_database(run_cli, tmp_path):
    result = ok(run_cli("migrate", env={"LEADSVC_DATABASE_URL": f"sqlite:///{tmp_path}/new/leadsvc.sqlite3"}))
    assert "Applying migrations: 0001_initial" in result.stderr, "said before it runs"
    assert "Applied migrations: 0001_initial" in result.stderr and (tmp_path / "new" / "leadsvc.sqlite3").exists()


def test_serve_on_a_taken_port_says_so(run_cli):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        failed(run_cli("serve", "--port", str(port)), f"Cannot listen on 127.0.0.1:{port}", "--port")


# --- configuration ---------------------------------------------------------------------------

def test_config_option_reads_that_file(run_cli, tmp_path, database_url):
    config = tmp_path / "leadsvc.toml"
    config.write_text(f'[database]\nurl = "{database_url}"\n\n[scoring]\nhot = 80\n')
    assert "ok: configuration is valid" in ok(run_cli("--config", str(config), "check",
                                                  env={"LEADSVC_DATABASE_URL": None})).stdout


@pytest.mark.parametrize("text, message", [
    ("[databse]\nurl = 'x'\n", "unknown section [databse]"),
    ("[server]\nprot = 1\n", "unknown key server.prot"),
    ("[server]\nport = 'eighty'\n", "server.port must be a whole number"),
    ("[scoring]\nhot = 30\n", "warm < hot"),
    ("[server\n", "is not valid TOML"),
])
def test_a_bad_config_file_is_a_clear_error(run_cli, tmp_path, text, message):
    config = tmp_path / "bad.toml"
    config.write_text(text)
    failed(run_cli("--config", str(config), "check"), "Configuration:", message)


def test_a_bad_environment_variable_is_a_clear_error(run_cli):
    failed(run_cli("check", env={"LEADSVC_SERVER_PORT": "http"}), "LEADSVC_SERVER_PORT must be a whole number")


@pytest.mark.parametrize("command", ["check", "serve"])
def test_an_unknown_leadsvc_variable_stops_the_command_naming_it_and_the_closest_key(run_cli, command):
    failed(run_cli(command, env={"LEADSVC_SERVER_PROT": "9000"}), "LEADSVC_SERVER_PROT",
           "did you mean LEADSVC_SERVER_PORT?")


@pytest.mark.parametrize("command", ["check", "serve"])
def test_a_port_outside_1_to_65535_stops_the_command(run_cli, command):
    failed(run_cli(command, env={"LEADSVC_SERVER_PORT": "99999"}), "server.port must be from 1 to 65535")


def test_a_missing_config_file_is_a_clear_error(run_cli, tmp_path):
    failed(run_cli("--config", str(tmp_path / "missing.toml"), "check"), "missing.toml does not exist")
