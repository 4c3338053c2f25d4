"""Settings: defaults.toml, then a config file, then LEADSVC_<SECTION>_<KEY> environment variables."""

from __future__ import annotations

import copy
import difflib
import ipaddress
import os
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import urlsplit

from flask import current_app
from limits import parse_many

Settings = dict[str, dict[str, Any]]

# The one list of settings and their defaults, each with its comment: a packaged file, read
# through importlib.resources so that it also loads from inside leadsvc.pyz.
DEFAULTS: Settings = tomllib.loads(resources.files("leadsvc").joinpath("defaults.toml").read_text(encoding="utf-8"))

# LEADSVC_* variables that are not settings: the config file's path, and what the test suite
# (tests/conftest.py) and the benchmarks (bench/run.py) read. Any other LEADSVC_* variable that
# names no setting is a mistake (a typo would otherwise be silently ignored), and stops start-up.
EXEMPT_VARIABLES = frozenset({
    "LEADSVC_CONFIG",
    "LEADSVC_TEST_POSTGRES_URL",
    "LEADSVC_TEST_REDIS_URL",
    "LEADSVC_BENCH_POSTGRES_URL",
})
LOG_FORMATS = ("text", "json")
MIN_SECRET_KEY = 32   # characters of webhooks.secret_key, from which every webhook secret is derived
MAX_ANSWER_FLOOR_MS = 10_000   # a web form that answers slower than this loses people
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
MAX_CLOCK_INTERVAL = 60   # seconds: what is due fires within a minute of its time

RATE_LIMIT_STORAGES = ("memory://", "redis://", "rediss://", "redis+unix://", "redis+sentinel://",
                       "redis+cluster://")


class ConfigError(Exception):
    """A configuration file or variable that cannot be used; the message says which and why."""


def config_path(explicit: str | os.PathLike | None = None, environ: Mapping[str, str] = os.environ) -> Path | None:
    """The config file to read: --config, else LEADSVC_CONFIG, else ./config.toml if present."""
    if explicit:
        return Path(explicit)
    if environ.get("LEADSVC_CONFIG"):
        return Path(environ["LEADSVC_CONFIG"])
    local = Path("config.toml")
    return local if local.is_file() else None


def load_settings(
    path: str | os.PathLike | None = None,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
    environ: Mapping[str, str] = os.environ,
) -> Settings:
    """Merge defaults, the config file, the environment and explicit overrides, checking every key."""
    settings = copy.deepcopy(DEFAULTS)
    file = config_path(path, environ)
    if file is not None:
        try:
            with open(file, "rb") as fh:
                _merge(settings, tomllib.load(fh), origin=str(file))
        except FileNotFoundError:
            raise ConfigError(f"Config file {file} does not exist.") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"Config file {file} is not valid TOML: {exc}.") from None
    variables = {f"LEADSVC_{section}_{key}".upper(): (section, key)
                 for section, keys in DEFAULTS.items() for key in keys}
    _check_variable_names(environ, variables)
    for name, (section, key) in variables.items():
        if name in environ:
            settings[section][key] = _coerce(environ[name], DEFAULTS[section][key], name)
    if overrides:
        _merge(settings, overrides, origin="overrides")
    _read_secret_key_file(settings["webhooks"])
    _check(settings)
    return settings


def settings() -> Settings:
    """The settings of the running app."""
    return current_app.config["LEADSVC"]


def networks(text: str) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """A comma-separated list of addresses or networks ("127.0.0.0/8,::1"); "" is none."""
    return [ipaddress.ip_network(part.strip(), strict=False) for part in text.split(",") if part.strip()]


def _merge(settings: Settings, data: Mapping[str, Any], origin: str) -> None:
    for section, values in data.items():
        if section not in DEFAULTS:
            raise ConfigError(f"{origin}: unknown section [{section}]; known: {', '.join(DEFAULTS)}.")
        if not isinstance(values, Mapping):
            raise ConfigError(f"{origin}: [{section}] must be a table of settings.")
        for key, value in values.items():
            if key not in DEFAULTS[section]:
                known = ", ".join(DEFAULTS[section])
                raise ConfigError(f"{origin}: unknown key {section}.{key}; known in [{section}]: {known}.")
            expected = type(DEFAULTS[section][key])
            if isinstance(value, str) and expected is not str:
                value = _coerce(value, DEFAULTS[section][key], f"{section}.{key}")
            if type(value) is not expected:
                raise ConfigError(
                    f"{origin}: {section}.{key} must be {_type_name(expected)}, not {value!r}."
                )
            settings[section][key] = value


def _read_secret_key_file(hooks: dict[str, Any]) -> None:
    """Put the key of webhooks.secret_key_file into webhooks.secret_key, read once at start-up."""
    path = hooks["secret_key_file"]
    if not path:
        return
    if hooks["secret_key"]:
        # Two keys would leave it to a precedence rule which one signs; a wrong guess breaks every
        # receiver without a word, so the operator picks one.
        raise ConfigError("webhooks.secret_key and webhooks.secret_key_file are both set; "
                          "set only one of them (the key itself, or the file that holds it).")
    try:
        key = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"webhooks.secret_key_file {path} cannot be read: "
                          f"{exc.strerror if isinstance(exc, OSError) and exc.strerror else exc}.") from None
    if not key:
        raise ConfigError(f"webhooks.secret_key_file {path} is empty; put 32+ random characters in it.")
    hooks["secret_key"] = key


def _check_variable_names(environ: Mapping[str, str], variables: Mapping[str, Any]) -> None:
    known = [*variables, *sorted(EXEMPT_VARIABLES)]
    unknown = sorted(name for name in environ if name.startswith("LEADSVC_") and name not in known)
    if unknown:
        named = ", ".join(f"{name} (did you mean {difflib.get_close_matches(name, known, n=1, cutoff=0)[0]}?)"
                          for name in unknown)
        raise ConfigError(f"Unknown environment variable{'s' if len(unknown) > 1 else ''} {named}. Settings "
                          f"are LEADSVC_<SECTION>_<KEY>, for the keys of leadsvc/defaults.toml.")


def _coerce(raw: str, default: Any, name: str) -> Any:
    if isinstance(default, bool):
        # Imported here: custom_fields needs problems, which reads its settings from this module.
        from .custom_fields import truth

        answer = truth(raw.strip())
        if answer is None:
            raise ConfigError(f"{name} must be true or false, not {raw!r}.")
        return answer
    if isinstance(default, int):
        try:
            return int(raw)
        except ValueError:
            raise ConfigError(f"{name} must be a whole number, not {raw!r}.") from None
    return raw


def _type_name(kind: type) -> str:
    return {bool: "true or false", int: "a whole number", str: "a string"}[kind]


def _check(settings: Settings) -> None:
    """Rules that span keys or values, so that a bad value fails at start-up and not mid-request."""
    scoring = settings["scoring"]
    if not 0 < scoring["warm"] < scoring["hot"] <= 100:
        raise ConfigError("scoring: need 0 < warm < hot <= 100.")
    for section, key in (("server", "port"), ("server", "threads"), ("database", "pool_size"),
                         ("database", "pool_timeout"), ("api", "max_body_bytes"), ("api", "max_import_bytes"),
                         ("server", "connection_limit"),
                         ("webhooks", "per_workspace"), ("webhooks", "per_host")):
        if settings[section][key] <= 0:
            raise ConfigError(f"{section}.{key} must be positive.")
    if settings["server"]["port"] > 65535:
        raise ConfigError(f"server.port must be from 1 to 65535, not {settings['server']['port']}.")
    limits = settings["rate_limits"]
    for key in ("per_token", "per_ip", "forms", "intake"):
        try:
            parse_many(limits[key])
        except ValueError:
            # flask-limiter would swallow this per request and silently enforce nothing.
            raise ConfigError(f"rate_limits.{key} must read like 120/minute, not {limits[key]!r}.") from None
    docs_url = settings["api"]["docs_url"]
    if docs_url and urlsplit(docs_url).scheme not in ("http", "https"):
        raise ConfigError(f"api.docs_url must be empty or an http(s) URL, not {docs_url!r}.")
    if settings["logging"]["level"].upper() not in LOG_LEVELS:
        raise ConfigError(f"logging.level must be one of {', '.join(LOG_LEVELS)}, "
                          f"not {settings['logging']['level']!r}.")
    if settings["logging"]["format"] not in LOG_FORMATS:
        raise ConfigError(f"logging.format must be one of {', '.join(LOG_FORMATS)}, not {settings['logging']['format']!r}.")
    try:
        networks(settings["metrics"]["allow_from"])
    except ValueError as exc:
        raise ConfigError(f"metrics.allow_from: {exc}; use addresses or networks like 10.0.0.0/8, comma-separated.") from None
    hooks = settings["webhooks"]
    if hooks["secret_key"] and len(hooks["secret_key"]) < MIN_SECRET_KEY:
        origin = f"the key in webhooks.secret_key_file {hooks['secret_key_file']}" if hooks["secret_key_file"] \
            else "webhooks.secret_key"
        raise ConfigError(f"{origin} must be at least {MIN_SECRET_KEY} characters (random ones), "
                          "or empty to refuse webhooks.")
    if hooks["timeout"] <= 0:
        raise ConfigError("webhooks.timeout must be positive.")
    if not 1 <= settings["clock"]["interval"] <= MAX_CLOCK_INTERVAL:
        raise ConfigError(f"clock.interval must be from 1 to {MAX_CLOCK_INTERVAL} seconds (what is due fires within "
                          f"a minute of its time), not {settings['clock']['interval']}.")
    if not 0 <= settings["forms"]["answer_floor_ms"] <= MAX_ANSWER_FLOOR_MS:
        raise ConfigError(f"forms.answer_floor_ms must be from 0 to {MAX_ANSWER_FLOOR_MS}, "
                          f"not {settings['forms']['answer_floor_ms']}.")
    if settings["connectors"]["indiamart_interval"] < 1:
        raise ConfigError("connectors.indiamart_interval must be at least 1 second; IndiaMART blocks a key pulled "
                          "more often than every 300.")
    for key in ("meta_graph_url", "indiamart_url"):
        if urlsplit(settings["connectors"][key]).scheme not in ("http", "https"):
            raise ConfigError(f"connectors.{key} must be an http(s) URL, not {settings['connectors'][key]!r}.")
    url = settings["database"]["url"]
    if not url.startswith(("sqlite:///", "postgresql://", "postgres://")):
        raise ConfigError(
            f"database.url must start with sqlite:/// or postgresql://, not {url.split(':')[0]!r}."
        )
    storage = settings["rate_limits"]["storage"]
    if not storage.startswith(RATE_LIMIT_STORAGES):
        raise ConfigError(f"rate_limits.storage must start with {' or '.join(RATE_LIMIT_STORAGES)}, "
                          f"not {storage.split(':')[0]!r}.")
    if settings["server"]["threads"] > settings["database"]["pool_size"] and not url.startswith("sqlite"):
        raise ConfigError("server.threads must not exceed database.pool_size, or threads wait for connections.")
