"""What `leadsvc check` finds: each check is a function that returns what is wrong with one part of
the installation (and the facts worth saying), so cli.py only prints; and `redact`, how a
configured URL appears in any message."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import unquote, urlsplit, urlunsplit

from .db import UNAVAILABLE_ERRORS, pending_migrations, ping


@dataclass
class Findings:
    """What the checks found: facts that hold, and problems, each saying how to fix it."""

    facts: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def check_all(settings: Mapping[str, Any], source: Path | None) -> Findings:
    """Every check of `leadsvc check` on the app's settings (read from `source`), in the order it reports them."""
    findings = Findings(facts=[f"configuration is valid ({f'file {source}' if source else 'no config file: built-in defaults'}"
                               f" and LEADSVC_* variables)"])
    url = redact(settings["database"]["url"])
    missing = sqlite_file_problem(url)
    if missing:
        findings.problems.append(missing)
    else:
        findings.problems += database_problems(url)
        if not findings.problems:
            findings.facts.append(f"database {url} answers and its schema is up to date")
            webhook_facts, webhook_problems = webhook_findings(settings["webhooks"])
            findings.facts += webhook_facts
            findings.problems += webhook_problems
    findings.facts.append(clock_fact(settings["clock"]))
    storage_facts, storage_problems = rate_limit_findings(settings["rate_limits"]["storage"])
    findings.facts += storage_facts
    findings.problems += storage_problems
    if settings["server"]["trusted_proxy"]:
        findings.facts.append(f"X-Forwarded-* headers are believed only from {settings['server']['trusted_proxy']}")
    return findings


def sqlite_file_problem(url: str) -> str | None:
    """What is wrong with a SQLite database.url whose file does not exist, or None."""
    sqlite_file = Path(unquote(url.removeprefix("sqlite:///"))) if url.startswith("sqlite:///") else None
    if sqlite_file and not sqlite_file.is_file():
        return (f"The SQLite database {sqlite_file.resolve()} does not exist yet: run `leadsvc migrate` "
                f"(or `leadsvc serve`) to create it, or fix database.url.")
    return None


def database_problems(url: str) -> list[str]:
    """What is wrong with the configured database: unreachable, no driver, or not migrated."""
    try:
        ping()
        pending = pending_migrations()
    except (*UNAVAILABLE_ERRORS, RuntimeError) as exc:
        return [f"Database {url} does not answer: {reason(exc)}. Check database.url (or LEADSVC_DATABASE_URL) "
                f"and that the server runs and accepts this user."]
    if pending:
        return [f"Database {url} needs migrations ({', '.join(pending)}): run `leadsvc migrate` "
                f"(`leadsvc serve` also migrates when it starts)."]
    return []


def webhook_findings(hooks: dict) -> tuple[list[str], list[str]]:
    """What check says about webhooks: facts (disabled ones among them, with their reason) and
    problems. A key shorter than webhooks.secret_key's minimum is a configuration error already."""
    from .models import Webhook

    registered = list(Webhook.select(Webhook.public_id, Webhook.url, Webhook.active, Webhook.disabled_reason)
                      .order_by(Webhook.created_at, Webhook.id))
    if not registered:
        return [], []
    count = f"{len(registered)} webhook{'s' if len(registered) > 1 else ''} registered"
    if not hooks["secret_key"]:
        return [], [f"{count}, but webhooks.secret_key is empty: their deliveries cannot be signed and fail, and no "
                    f"secret can be issued or rotated. Set webhooks.secret_key (or LEADSVC_WEBHOOKS_SECRET_KEY), or "
                    f"webhooks.secret_key_file, to the key they were created with: every webhook secret derives from it, so another key makes "
                    f"receivers refuse the signatures until each webhook's secret is rotated and handed over again."]
    deliverer = ("`leadsvc serve` and `leadsvc worker` deliver" if hooks["deliver_in_serve"]
                 else "only `leadsvc worker` delivers (webhooks.deliver_in_serve = false)")
    facts = [f"{count} ({sum(h.active for h in registered)} active), webhooks.secret_key is set; {deliverer}"]
    facts += [f"webhook {h.public_id} ({h.url}) is disabled and receives no events: "
              f"{(h.disabled_reason or 'turned off by hand').rstrip('.')}. When its receiver works again, turn it on with "
              f'PATCH /api/v1/webhooks/{h.public_id} {{"active": true}}.' for h in registered if not h.active]
    return facts, []


def clock_fact(clock: dict) -> str:
    """Who fires due timers (reminders and the like)."""
    runners = ("`leadsvc serve` and `leadsvc worker` run" if clock["in_serve"]
               else "only `leadsvc worker` runs (clock.in_serve = false)")
    return f"{runners} the clock, which fires due timers every {clock['interval']} s"


def redis_problem(url: str) -> str | None:
    """What is wrong with the Redis at url, or None when it answers."""
    try:
        import redis
    except ImportError:
        return ("rate_limits.storage is Redis, but the redis package is not installed: "
                "pip install 'leadsvc[redis]' (or 'redis<8').")
    try:
        redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=3).ping()
    except (redis.RedisError, OSError, ValueError) as exc:
        return (f"Redis at {redact(url)} (rate_limits.storage) does not answer: {reason(exc)}. Start Redis or fix the URL; "
                f"until then each process counts its own limits.")
    return None


def rate_limit_findings(storage: str) -> tuple[list[str], list[str]]:
    """What check says about rate_limits.storage: facts and problems."""
    if storage.startswith(("redis://", "rediss://", "unix://")):
        problem = redis_problem(storage)
        if problem:
            return [], [problem]
        return [f"Redis at {redact(storage)} answers: rate limits are shared by every process using it"], []
    if storage.startswith("memory://"):
        return ["rate limits are counted in this process (memory://); when several processes serve, "
                "set rate_limits.storage to a redis:// URL"], []
    return [], []


def redact(url: str) -> str:
    """A database URL without its password, for messages."""
    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return urlunsplit(parts._replace(netloc=netloc))
    return url


def reason(exc: BaseException) -> str:
    """An exception's message on one line, for sentences that go on after it."""
    return " ".join(str(exc).split()).rstrip(".") or type(exc).__name__
