"""Contract artifacts stay true to the code: schemas/openapi.json, leadsvc/defaults.toml, and the migrations."""

import json
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner
from playhouse.schema_diff import diff_models

from conftest import fresh_database
from leadsvc.auth import ABILITIES
from leadsvc.cli import cli
from leadsvc.config import DEFAULTS, ConfigError, load_settings
from leadsvc.db import database, is_postgres, migrate
from leadsvc.models import MODELS

ROOT = Path(__file__).resolve().parent.parent


# --- schemas/openapi.json --------------------------------------------------------------------

def generated_openapi(tmp_path) -> str:
    env = {"LEADSVC_CONFIG": os.devnull, "LEADSVC_DATABASE_URL": f"sqlite:///{tmp_path}/unused.sqlite3"}
    result = CliRunner().invoke(cli, ["openapi"], obj={}, env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


def test_published_openapi_matches_the_code(tmp_path):
    published = (ROOT / "schemas" / "openapi.json").read_text(encoding="utf-8")
    assert published == generated_openapi(tmp_path), (
        "schemas/openapi.json is out of date with the code: run `make openapi` and commit the result.")


def test_served_openapi_is_the_published_one(client):
    published = json.loads((ROOT / "schemas" / "openapi.json").read_text(encoding="utf-8"))
    assert client.get("/api/v1/openapi.json").json == published


# An exact version: a newer release may bring new rules, and the next ones need Node.js 22.
REDOCLY_CLI = "@redocly/cli@2.77.0"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("npx") is None, reason="the Redocly linter runs where npx is installed")
def test_published_openapi_passes_the_redocly_linter_with_no_error():
    """Its recommended rules. The warnings left: the probes have no 4xx answer to document."""
    # npx fetches the linter from the npm registry the first time (CI machines reach it).
    result = subprocess.run(["npx", "--yes", REDOCLY_CLI, "lint", "schemas/openapi.json"], cwd=ROOT,
                            capture_output=True, text=True, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "Your API description is valid" in output, output


# --- defaults.toml ---------------------------------------------------------------------------

def test_defaults_toml_holds_exactly_the_defaults():
    with open(ROOT / "leadsvc" / "defaults.toml", "rb") as fh:
        assert tomllib.load(fh) == DEFAULTS, "defaults.toml and leadsvc.config.DEFAULTS must list the same settings"


def test_every_setting_in_defaults_toml_has_a_comment():
    uncommented = [line for line in (ROOT / "leadsvc" / "defaults.toml").read_text().splitlines()
                   if re.match(r"^[a-z_]+\s*=", line) and not re.search(r"\s#\s*\S", line)]
    assert uncommented == []


def test_defaults_apply_without_a_config_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)   # no ./config.toml here
    assert load_settings(environ={}) == DEFAULTS


def test_config_file_lookup_order(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.toml").write_text("[server]\nport = 1001\n")
    (tmp_path / "env.toml").write_text("[server]\nport = 1002\n")
    (tmp_path / "explicit.toml").write_text("[server]\nport = 1003\n")
    assert load_settings(environ={})["server"]["port"] == 1001                               # ./config.toml
    env = {"LEADSVC_CONFIG": str(tmp_path / "env.toml")}
    assert load_settings(environ=env)["server"]["port"] == 1002                              # $LEADSVC_CONFIG
    assert load_settings(tmp_path / "explicit.toml", environ=env)["server"]["port"] == 1003  # --config


def test_environment_beats_the_file_and_explicit_overrides_beat_both(tmp_path):
    (tmp_path / "c.toml").write_text("[server]\nport = 1001\nthreads = 4\n")
    settings = load_settings(tmp_path / "c.toml", environ={"LEADSVC_SERVER_PORT": "1002", "LEADSVC_SERVER_THREADS": "5"},
                             overrides={"server": {"threads": 6}})
    assert settings["server"]["port"] == 1002 and settings["server"]["threads"] == 6


VALID_STRINGS = {"level": "DEBUG", "docs_url": "https://docs.example.com/leadsvc", "per_token": "5/second",
                 "per_ip": "1/second", "forms": "2 per hour", "storage": "redis://127.0.0.1:6379/0",
                 "url": "postgresql://app@db.internal:5432/leadsvc", "format": "json", "allow_from": "10.0.0.0/8",
                 "secret_key": "k" * 32, "intake": "20/second"}


def changed(key, value):
    """A valid value of the same type, different from the default."""
    if key in VALID_STRINGS:
        return VALID_STRINGS[key], VALID_STRINGS[key]
    if isinstance(value, bool):
        return (str(not value).lower(), not value)
    if isinstance(value, int):
        return (str(value + 1), value + 1)
    return (value + "x", value + "x")


@pytest.mark.parametrize("section, key", [(s, k) for s, keys in DEFAULTS.items() for k in keys])
def test_every_setting_has_an_environment_override_of_its_type(section, key, tmp_path):
    raw, expected = changed(key, DEFAULTS[section][key])
    if key == "secret_key_file":   # a path is only valid when the file is there
        (tmp_path / "secret.key").write_text("k" * 32)
        raw = expected = str(tmp_path / "secret.key")
    name = f"LEADSVC_{section.upper()}_{key.upper()}"
    settings = load_settings(os.devnull, environ={name: raw})
    assert settings[section][key] == expected and type(settings[section][key]) is type(expected)


@pytest.mark.parametrize("raw, expected", [("true", True), ("1", True), ("yes", True), ("ON", True),
                                           ("false", False), ("0", False), ("no", False), ("off", False)])
def test_booleans_from_the_environment(raw, expected):
    assert load_settings(os.devnull, environ={"LEADSVC_RATE_LIMITS_ENABLED": raw})["rate_limits"]["enabled"] is expected


@pytest.mark.parametrize("name, raw, message", [
    ("LEADSVC_SERVER_PORT", "eighty", "LEADSVC_SERVER_PORT must be a whole number, not 'eighty'"),
    ("LEADSVC_WEBHOOKS_SECRET_KEY", "short", "webhooks.secret_key must be at least 32 characters"),
    ("LEADSVC_WEBHOOKS_TIMEOUT", "0", "webhooks.timeout must be positive"),
    ("LEADSVC_WEBHOOKS_PER_WORKSPACE", "0", "webhooks.per_workspace must be positive"),
    ("LEADSVC_WEBHOOKS_PER_HOST", "0", "webhooks.per_host must be positive"),
    ("LEADSVC_SERVER_PORT", "80.5", "LEADSVC_SERVER_PORT must be a whole number"),
    ("LEADSVC_RATE_LIMITS_ENABLED", "maybe", "LEADSVC_RATE_LIMITS_ENABLED must be true or false"),
    ("LEADSVC_SCORING_HOT", "", "LEADSVC_SCORING_HOT must be a whole number"),
    ("LEADSVC_SERVER_PORT", "0", "server.port must be positive"),
    ("LEADSVC_SERVER_PORT", "99999", "server.port must be from 1 to 65535, not 99999"),
    ("LEADSVC_SERVER_PORT", "65536", "server.port must be from 1 to 65535"),
    ("LEADSVC_SCORING_WARM", "90", "0 < warm < hot <= 100"),
    ("LEADSVC_DATABASE_URL", "mysql://db/leadsvc", "database.url must start with sqlite:/// or postgresql://"),
    ("LEADSVC_LOGGING_LEVEL", "LOUD", "logging.level must be one of"),
    ("LEADSVC_API_DOCS_URL", "docs.example.com/leadsvc", "api.docs_url must be empty or an http(s) URL"),
    ("LEADSVC_RATE_LIMITS_PER_TOKEN", "120/minutes/x", "rate_limits.per_token must read like 120/minute"),
    ("LEADSVC_RATE_LIMITS_FORMS", "ten a minute", "rate_limits.forms must read like 120/minute"),
    ("LEADSVC_RATE_LIMITS_STORAGE", "memcache://x", "rate_limits.storage must start with memory:// or redis://"),
])
def test_a_bad_environment_value_raises_config_error_naming_it(name, raw, message):
    with pytest.raises(ConfigError) as error:
        load_settings(os.devnull, environ={name: raw})
    assert message in str(error.value)


def test_secret_key_file_gives_webhooks_the_key_it_holds(tmp_path):
    (tmp_path / "secret.key").write_text("k" * 40 + "\n")
    (tmp_path / "c.toml").write_text(f'[webhooks]\nsecret_key_file = "{tmp_path / "secret.key"}"\n')
    assert load_settings(tmp_path / "c.toml", environ={})["webhooks"]["secret_key"] == "k" * 40


@pytest.mark.parametrize("content, message", [
    (None, "webhooks.secret_key_file {path} cannot be read: No such file or directory"),
    ("  \n", "webhooks.secret_key_file {path} is empty"),
    ("short", "the key in webhooks.secret_key_file {path} must be at least 32 characters"),
])
def test_an_unusable_secret_key_file_stops_start_up_naming_it(tmp_path, content, message):
    path = tmp_path / "secret.key"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError) as error:
        load_settings(os.devnull, environ={"LEADSVC_WEBHOOKS_SECRET_KEY_FILE": str(path)})
    assert message.format(path=path) in str(error.value)


def test_secret_key_and_secret_key_file_together_stop_start_up(tmp_path):
    (tmp_path / "secret.key").write_text("f" * 32)
    with pytest.raises(ConfigError, match="webhooks.secret_key and webhooks.secret_key_file are both set"):
        load_settings(os.devnull, environ={"LEADSVC_WEBHOOKS_SECRET_KEY": "e" * 32,
                                           "LEADSVC_WEBHOOKS_SECRET_KEY_FILE": str(tmp_path / "secret.key")})


def test_a_port_is_from_1_to_65535_in_the_file_too(tmp_path):
    (tmp_path / "c.toml").write_text("[server]\nport = 70000\n")
    with pytest.raises(ConfigError, match="server.port must be from 1 to 65535"):
        load_settings(tmp_path / "c.toml", environ={})
    assert load_settings(os.devnull, environ={"LEADSVC_SERVER_PORT": "65535"})["server"]["port"] == 65535


@pytest.mark.parametrize("name, closest", [("LEADSVC_SERVER_PROT", "LEADSVC_SERVER_PORT"),
                                           ("LEADSVC_DATABASE_URI", "LEADSVC_DATABASE_URL"),
                                           ("LEADSVC_RATELIMITS_PER_TOKEN", "LEADSVC_RATE_LIMITS_PER_TOKEN"),
                                           ("LEADSVC_CONFIG_FILE", "LEADSVC_CONFIG")])
def test_an_unknown_leadsvc_variable_is_an_error_naming_it_and_the_closest_key(name, closest):
    with pytest.raises(ConfigError) as error:
        load_settings(os.devnull, environ={name: "9000"})
    assert f"{name} (did you mean {closest}?)" in str(error.value)


def test_the_variables_tests_and_benchmarks_read_are_exempt_and_no_error():
    from leadsvc.config import EXEMPT_VARIABLES

    read = set()
    for path in [*ROOT.glob("tests/*.py"), *ROOT.glob("bench/*.py"), *ROOT.glob("tools/*.py")]:
        read |= set(re.findall(r"""(?:environ\.get\(|environ\[|getenv\()\s*["'](LEADSVC_\w+)""", path.read_text()))
    settings = {f"LEADSVC_{section}_{key}".upper() for section, keys in DEFAULTS.items() for key in keys}
    assert {"LEADSVC_TEST_POSTGRES_URL", "LEADSVC_BENCH_POSTGRES_URL"} <= read, "the scan finds them"
    assert read - settings <= EXEMPT_VARIABLES
    environ = {name: "postgresql://x@127.0.0.1/y" for name in EXEMPT_VARIABLES - {"LEADSVC_CONFIG"}}
    assert load_settings(os.devnull, environ=environ) == DEFAULTS


def test_postgresql_threads_must_fit_the_pool():
    with pytest.raises(ConfigError, match="server.threads must not exceed database.pool_size"):
        load_settings(os.devnull, environ={"LEADSVC_DATABASE_URL": "postgresql://u@h/db",
                                           "LEADSVC_SERVER_THREADS": "32"})


def test_unknown_keys_in_a_file_are_errors_naming_them(tmp_path):
    (tmp_path / "c.toml").write_text("[server]\nhost = '0.0.0.0'\nthread = 4\n")
    with pytest.raises(ConfigError, match=r"unknown key server\.thread; known in \[server\]: host, port"):
        load_settings(tmp_path / "c.toml", environ={})


# --- migrations ------------------------------------------------------------------------------

def schema_of(db) -> dict:
    """Tables, columns (name, type, nullability, primary key), indexes (columns, uniqueness), foreign keys."""
    on_delete = on_delete_rules(db)
    schema = {}
    # sqlite_stat*: what ANALYZE writes, the engine's statistics rather than the schema.
    for table in sorted(t for t in db.get_tables() if t != "schema_migration" and not t.startswith("sqlite_stat")):
        schema[table] = {
            "columns": sorted((c.name, c.data_type.lower(), c.null, c.primary_key) for c in db.get_columns(table)),
            "indexes": sorted((tuple(i.columns), i.unique) for i in db.get_indexes(table)),
            "foreign_keys": sorted((fk.column, fk.dest_table, fk.dest_column, on_delete.get((table, fk.column)))
                                   for fk in db.get_foreign_keys(table)),
        }
    return schema


def on_delete_rules(db) -> dict[tuple[str, str], str]:
    """(table, column) -> ON DELETE rule of its foreign key."""
    if is_postgres(db):
        rows = db.execute_sql(
            "SELECT kcu.table_name, kcu.column_name, rc.delete_rule FROM information_schema.referential_constraints rc "
            "JOIN information_schema.key_column_usage kcu ON kcu.constraint_name = rc.constraint_name "
            "AND kcu.constraint_schema = rc.constraint_schema").fetchall()
    else:
        rows = [(table, row[3], row[6]) for table in db.get_tables()
                for row in db.execute_sql(f'PRAGMA foreign_key_list("{table}")').fetchall()]
    return {(table, column): rule.upper() for table, column, rule in rows}


def test_migrations_build_the_schema_the_models_declare(app, backend, tmp_path, request):
    migrated = fresh_database(backend, tmp_path, request)
    assert migrate(migrated) and migrate(migrated) == [], "migrating twice applies nothing the second time"
    diff = diff_models(migrated, MODELS)
    assert not diff, f"models and db/migrations drift; add a migration for:\n{diff}"

    from_models = fresh_database(backend, tmp_path, request)
    with from_models.bind_ctx(MODELS):
        from_models.create_tables(MODELS)
    schema = schema_of(migrated)
    assert schema == schema_of(from_models), (
        "a column's type or nullability, an index or a foreign key differs between db/migrations and the "
        "models; add a migration")
    assert schema == schema_of(database.obj), "the test run's own database is migrated like a fresh one"
    for db in (migrated, from_models):
        db.close()


def test_the_readme_documents_every_setting():
    readme = (ROOT / "README.md").read_text()
    missing = [f"{section}.{key}" for section, keys in DEFAULTS.items() for key in keys
               if f"`{section}.{key}`" not in readme]
    assert not missing, f"README's configuration table lacks {missing}"


def test_the_readme_lists_every_ability():
    readme = (ROOT / "README.md").read_text()
    abilities = readme[readme.index("\nAbilities: "):].split("\n\n", 1)[0]
    missing = [ability for ability in ABILITIES if f"`{ability}`" not in abilities]
    assert not missing, f"README's list of abilities lacks {missing}"
