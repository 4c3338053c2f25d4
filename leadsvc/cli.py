"""The `leadsvc` command: serve, worker, migrate, setup, demo, workspaces, members, tokens, webhooks, connectors,
import, erase, subject, openapi, check."""

from __future__ import annotations

import csv
import json
import logging
import sys
from importlib import resources

import click
import peewee as pw
from flask import Flask

from . import __version__, create_app
from .config import ConfigError, config_path
from .db import UNAVAILABLE_ERRORS, close as db_close, migrate as run_migrations, transaction
from .diagnostics import check_all, redact
from .schemas import ON_DUPLICATE

ABILITY_HELP = "Comma-separated abilities (leads:read, leads:create, ...), or * for all."
WORKSPACE_HELP = "The workspace: its public id (ws_...) or its name."
# Tokens `leadsvc demo` issues carry this name; each run revokes the ones an earlier run issued.
DEMO_TOKEN_NAME = "demo"
DEMO_TOKEN_DAYS = 30


def _app(ctx: click.Context) -> Flask:
    """The app for this invocation, built once; a bad configuration is a clear error, not a traceback."""
    if ctx.obj.get("app") is None:
        try:
            ctx.obj["app"] = create_app(config_file=ctx.obj["config_file"])
        except ConfigError as exc:
            raise click.ClickException(f"Configuration: {exc}") from None
        except pw.ImproperlyConfigured:   # peewee binds the models to PostgreSQL only with its driver
            raise click.ClickException(
                "database.url names PostgreSQL, but this Python cannot import psycopg: install it into the "
                "Python that runs leadsvc (pip install 'psycopg[binary]').") from None
    return ctx.obj["app"]


def _migrated_app(ctx: click.Context) -> Flask:
    app = _app(ctx)
    try:
        # A migration over many leads takes minutes: say what runs before it does.
        applied = run_migrations(announce=lambda pending: click.echo(
            f"Applying migrations: {', '.join(pending)} ...", err=True))
    except UNAVAILABLE_ERRORS as exc:
        raise click.ClickException(
            f"Cannot reach the database at {redact(app.config['LEADSVC']['database']['url'])}: "
            f"{str(exc).strip() or type(exc).__name__}. Check database.url.") from None
    if applied:
        click.echo(f"Applied migrations: {', '.join(applied)}", err=True)
    return app


def _print_json(data: dict) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
# __version__ rather than the installed metadata: leadsvc.pyz carries the package without it.
@click.version_option(__version__, "--version", prog_name="leadsvc", message="%(prog)s %(version)s")
@click.option("--config", "config_file", type=click.Path(dir_okay=False),
              help="Config file (default: $LEADSVC_CONFIG, else ./config.toml if present).")
@click.pass_context
def cli(ctx: click.Context, config_file: str | None) -> None:
    """leadsvc: a self-hosted lead pipeline service."""
    ctx.ensure_object(dict)
    ctx.obj["config_file"] = config_file


@cli.command()
@click.option("--host", help="Interface to listen on (default: server.host).")
@click.option("--port", type=int, help="Port to listen on (default: server.port).")
@click.pass_context
def serve(ctx: click.Context, host: str | None, port: int | None) -> None:
    """Migrate if needed, then serve the API with waitress (SIGTERM stops it gracefully)."""
    from .observability import configure_logging
    from .serving import CannotListen, serve as serve_app

    app = _app(ctx)
    configure_logging(app.config["LEADSVC"]["logging"])
    app = _migrated_app(ctx)
    server = app.config["LEADSVC"]["server"]
    logging.getLogger("leadsvc").info(
        "leadsvc %s, database %s, docs at /docs", __version__, redact(app.config["LEADSVC"]["database"]["url"]))
    deliverer = _deliverer(app).start() if app.config["LEADSVC"]["webhooks"]["deliver_in_serve"] else None
    clock = _clock(app).start() if app.config["LEADSVC"]["clock"]["in_serve"] else None
    try:
        serve_app(app, host or server["host"], port or server["port"])
    except CannotListen as exc:
        raise click.ClickException(f"{exc} Choose another with --port or LEADSVC_SERVER_PORT.") from None
    finally:
        if clock is not None:
            clock.stop()
        if deliverer is not None:
            deliverer.stop()


def _deliverer(app: Flask):
    from .delivery import Deliverer

    return Deliverer(app.config["LEADSVC"], version=__version__, metrics=app.extensions.get("leadsvc.metrics"))


def _clock(app: Flask):
    from .clock import Clock

    return Clock(app.config["LEADSVC"], metrics=app.extensions.get("leadsvc.metrics"))


@cli.command()
@click.option("--metrics-port", type=click.IntRange(1, 65535),
              help="Also serve /metrics (webhook deliveries, backlog, lag, timers) on this port; default: no metrics.")
@click.option("--metrics-host", default="127.0.0.1", show_default=True, help="Interface for --metrics-port.")
@click.pass_context
def worker(ctx: click.Context, metrics_port: int | None, metrics_host: str) -> None:
    """Deliver webhook events and run the clock, without serving (any number of workers may share a database)."""
    import signal
    import threading

    from .metrics import metrics_only
    from .observability import configure_logging
    from .serving import CannotListen, listen, run

    app = _app(ctx)
    configure_logging(app.config["LEADSVC"]["logging"])
    app = _migrated_app(ctx)
    log = logging.getLogger("leadsvc")
    metrics_server = None
    if metrics_port:
        if not app.config["LEADSVC"]["metrics"]["enabled"]:
            raise click.ClickException("--metrics-port needs metrics.enabled = true.")
        try:   # one thread: a scrape is short, and the delivery threads need the database connections
            metrics_server = listen(app, metrics_host, metrics_port, wsgi=metrics_only(app), threads=1)
        except CannotListen as exc:
            raise click.ClickException(f"{exc} Choose another with --metrics-port.") from None
    deliverer = _deliverer(app).start()
    clock = _clock(app).start()
    log.info("leadsvc %s delivering webhook events and running the clock, database %s", __version__,
             redact(app.config["LEADSVC"]["database"]["url"]))
    try:
        if metrics_server is not None:   # serves until SIGTERM or SIGINT, as `leadsvc serve` does
            log.info("metrics at http://%s/metrics", metrics_server.address)
            run(app, metrics_server)
        else:
            stopping = threading.Event()
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda signum, frame: stopping.set())
            while not stopping.wait(1):
                pass
    finally:
        clock.stop()
        deliverer.stop()
        db_close()


@cli.command()
@click.pass_context
def migrate(ctx: click.Context) -> None:
    """Bring the database schema up to date."""
    app = _migrated_app(ctx)
    click.echo(f"Database {redact(app.config['LEADSVC']['database']['url'])} is up to date.")


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the ids as one JSON object.")
@click.pass_context
def setup(ctx: click.Context, file: str, as_json: bool) -> None:
    """Create or update a workspace from a setup file (idempotent)."""
    from .provision import SetupError, apply_setup, read_setup_file

    app = _migrated_app(ctx)
    try:
        result = apply_setup(read_setup_file(file), app.config["LEADSVC"]["webhooks"]["secret_key"])
    except SetupError as exc:
        raise click.ClickException(f"{file} was not applied; nothing changed:\n  " + "\n  ".join(exc.problems)) from None
    if as_json:
        _print_json(result.as_json())
        return
    click.echo(f"Workspace {result.workspace} is set up from {file}:")
    for section in ("teams", "members", "statuses", "sources", "custom_fields", "rules", "forms", "lost_reasons"):
        ids = getattr(result, section)
        if ids:
            click.echo(f"  {section}: " + ", ".join(f"{name} {pid}" for name, pid in ids.items()))
    for name, connector in result.connectors.items():
        click.echo(f"  connector {name}: {connector['id']} at {connector['url']}")
        if connector["key"]:
            click.echo(f"    its key, shown only now: {connector['key']}")


@cli.command()
@click.option("--leads", "lead_count", type=click.IntRange(min=0), default=0,
              help="Also add this many synthetic leads (with history) by bulk insert.")
@click.option("--seed", type=int, default=1, show_default=True, help="Seed of the synthetic leads.")
@click.option("--json", "as_json", is_flag=True, help="Print the workspace and tokens as one JSON object.")
@click.pass_context
def demo(ctx: click.Context, lead_count: int, seed: int, as_json: bool) -> None:
    """Create the demo workspace if absent and print a fresh token for each demo member.

    The tokens an earlier run printed are revoked, so one set of demo tokens is live at a time."""
    import time
    import tomllib

    from .auth import issue_token, revoke_tokens
    from .models import Member, Token, Workspace
    from .provision import apply_setup, parse_setup
    from .bulk_load import add_leads

    app = _migrated_app(ctx)
    data = parse_setup(tomllib.loads(resources.files("leadsvc").joinpath("demo.toml").read_text()))
    with transaction():
        result = apply_setup(data)
        workspace = Workspace.get(Workspace.public_id == result.workspace)
        revoked = revoke_tokens((Token.workspace == workspace.id) & (Token.name == DEMO_TOKEN_NAME))
        tokens = {}
        for email, member_id in result.members.items():
            member = Member.get(Member.public_id == member_id)
            token, secret = issue_token(member, ["*"], name=DEMO_TOKEN_NAME, expires_in_days=DEMO_TOKEN_DAYS)
            tokens[email] = {"id": token.public_id, "token": secret, "member": member_id, "role": member.role,
                             "name": member.name, "expires_at": token.expires_at}
    if lead_count:
        started = time.monotonic()
        with click.progressbar(length=lead_count, label="Synthetic leads", file=sys.stderr) as bar:
            written = add_leads(workspace, lead_count, seed=seed, progress=bar.update)
        click.echo(f"Added {written:,} synthetic leads in {time.monotonic() - started:.1f} s.", err=True)
    if as_json:
        _print_json({"workspace": result.workspace,
                     "tokens": {e: {k: t[k] for k in ("id", "token", "member", "role")} for e, t in tokens.items()}})
        return
    server = app.config["LEADSVC"]["server"]
    base = f"http://{server['host']}:{server['port']}"
    expires = min(t["expires_at"] for t in tokens.values()).strftime("%Y-%m-%d")
    replaced = f" (the {revoked} an earlier run printed are revoked)" if revoked else ""
    click.echo(f"Demo workspace {result.workspace} (Demo Realty). A new token for each member{replaced}, "
               f"valid until {expires}; each secret is shown once:")
    for email, token in tokens.items():
        click.echo(f"  {token['role']:<8} {token['name']:<12} {email:<18} {token['token']}")
    admin = next(t for t in tokens.values() if t["role"] == "admin")
    click.echo(f"\nTry it:\n  curl -H 'Authorization: Bearer {admin['token']}' {base}/api/v1/leads\n"
               f"Interactive docs: {base}/docs")
    for name, form_id in result.forms.items():
        click.echo(f"Web form {name!r} (no token needed): {base}/forms/{form_id}")


@cli.group()
def tokens() -> None:
    """Issue, list and revoke API tokens."""


@tokens.command("create")
@click.option("--member", "member_id", required=True, help="The member's public id (mem_...).")
@click.option("--abilities", required=True, help=ABILITY_HELP)
@click.option("--name", default="api", show_default=True, help="A label for the token.")
@click.option("--expires-in", "expires_in", type=click.IntRange(min=1), help="Days until it expires.")
@click.option("--json", "as_json", is_flag=True, help="Print the token as one JSON object.")
@click.pass_context
def tokens_create(ctx: click.Context, member_id: str, abilities: str, name: str, expires_in: int | None,
                  as_json: bool) -> None:
    """Issue a token for a member; the secret is shown once."""
    from .auth import issue_token

    _migrated_app(ctx)
    member = _member(member_id)
    try:
        token, secret = issue_token(member, [a.strip() for a in abilities.split(",") if a.strip()],
                                    name=name, expires_in_days=expires_in)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        _print_json({"id": token.public_id, "token": secret, "member": member.public_id,
                     "abilities": token.abilities})
        return
    click.echo(f"Token {token.public_id} for {member.name} ({member.role}), abilities {', '.join(token.abilities)}:")
    click.echo(f"  {secret}")
    click.echo("The secret is shown only now; only its sha256 is stored.")


@tokens.command("list")
@click.option("--member", "member_id", help="Only this member's tokens.")
@click.pass_context
def tokens_list(ctx: click.Context, member_id: str | None) -> None:
    """List tokens (never their secrets)."""
    from .models import Member, Token, utcnow

    _migrated_app(ctx)
    query = Token.select(Token, Member).join(Member).order_by(Token.created_at, Token.id)
    if member_id:
        query = query.where(Member.public_id == member_id)
    rows = list(query)
    if not rows:
        click.echo("No tokens.")
        return
    now = utcnow()
    for token in rows:
        if token.revoked_at:
            state = "revoked " + token.revoked_at.strftime("%Y-%m-%d")
        elif token.expires_at:
            state = ("expired " if token.expires_at <= now else "expires ") + token.expires_at.strftime("%Y-%m-%d")
        else:
            state = "active"
        used = token.last_used_at.strftime("%Y-%m-%d %H:%M") if token.last_used_at else "never"
        click.echo(f"{token.public_id}  {token.member.public_id}  {token.member.name:<16} {token.name:<10} "
                   f"{state:<18} used {used:<16} {','.join(token.abilities)}")


@tokens.command("revoke")
@click.argument("token_ids", nargs=-1)
@click.option("--all", "every_token", is_flag=True, help="Revoke every token of --member.")
@click.option("--member", "member_id", help="With --all: the member's public id (mem_...).")
@click.pass_context
def tokens_revoke(ctx: click.Context, token_ids: tuple[str, ...], every_token: bool, member_id: str | None) -> None:
    """Revoke tokens by id, or every token of a member (--all --member MEM_ID): they stop working at once."""
    from .auth import revoke_tokens
    from .models import Token

    if every_token != bool(member_id) or every_token == bool(token_ids):
        raise click.UsageError("Give the ids of the tokens to revoke (tok_...), or --all --member MEM_ID "
                               "for every token of a member.")
    _migrated_app(ctx)
    if every_token:
        member = _member(member_id)
        count = revoke_tokens(Token.member == member.id)
        click.echo(f"Revoked {count} token{'' if count == 1 else 's'} of {member.name} ({member.public_id}).")
        return
    with transaction():   # all or none: a mistyped id revokes nothing
        known = {t.public_id for t in Token.select(Token.public_id).where(Token.public_id.in_(token_ids))}
        if unknown := [token_id for token_id in token_ids if token_id not in known]:
            raise click.ClickException(f"No token {', '.join(unknown)}; nothing was revoked. "
                                       f"`leadsvc tokens list` shows the tokens.")
        revoke_tokens(Token.public_id.in_(token_ids))
    for token_id in dict.fromkeys(token_ids):
        click.echo(f"Token {token_id} is revoked.")


def _member(member_id: str):
    from .models import Member

    member = Member.get_or_none(Member.public_id == member_id)
    if member is None:
        raise click.ClickException(f"No member {member_id}. `leadsvc members --workspace WS` lists them.")
    return member


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print them as one JSON object.")
@click.pass_context
def workspaces(ctx: click.Context, as_json: bool) -> None:
    """List the workspaces: public id and name."""
    from .models import Workspace

    _migrated_app(ctx)
    rows = [{"id": w.public_id, "name": w.name}
            for w in Workspace.select(Workspace.public_id, Workspace.name).order_by(Workspace.name)]
    if as_json:
        _print_json({"workspaces": rows})
        return
    if not rows:
        click.echo("No workspaces. `leadsvc setup FILE.toml` or `leadsvc demo` creates one.")
    for row in rows:
        click.echo(f"{row['id']}  {row['name']}")


@cli.command()
@click.option("--workspace", "workspace_ref", required=True, help=WORKSPACE_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print them as one JSON object.")
@click.pass_context
def members(ctx: click.Context, workspace_ref: str, as_json: bool) -> None:
    """List a workspace's members: public id, name, e-mail, role, team, active."""
    from .models import Member, Team

    _migrated_app(ctx)
    workspace = _workspace(workspace_ref)
    query = (Member.select(Member, Team).join(Team, pw.JOIN.LEFT_OUTER)
             .where(Member.workspace == workspace.id).order_by(Member.email))
    rows = [{"id": m.public_id, "name": m.name, "email": m.email, "role": m.role,
             "team": m.team.name if m.team_id else None, "active": m.active} for m in query]
    if as_json:
        _print_json({"workspace": workspace.public_id, "members": rows})
        return
    for row in rows:
        click.echo(f"{row['id']}  {row['name']:<16} {row['email']:<24} {row['role']:<8} {row['team'] or '-':<12} "
                   f"{'active' if row['active'] else 'inactive'}")


@cli.group()
def webhooks() -> None:
    """Register webhooks, read their deliveries, replay one."""


def _workspace(ref: str):
    """The workspace with this public id, else with this name (names are unique)."""
    from .models import Workspace

    workspace = (Workspace.get_or_none(Workspace.public_id == ref)
                 or Workspace.get_or_none(Workspace.name == ref))
    if workspace is None:
        raise click.ClickException(f"No workspace {ref}. `leadsvc workspaces` lists them.")
    return workspace


def _webhook(webhook_id: str):
    from .models import Webhook

    hook = Webhook.get_or_none(Webhook.public_id == webhook_id)
    if hook is None:
        raise click.ClickException(f"No webhook {webhook_id}. `leadsvc webhooks list` shows them.")
    return hook


def _problem_message(exc) -> str:
    return exc.detail or "; ".join(f"{field}: {' '.join(messages)}" for field, messages in (exc.errors or {}).items())


@webhooks.command("create")
@click.option("--workspace", "workspace_id", required=True, help=WORKSPACE_HELP)
@click.option("--url", required=True, help="The https:// URL that receives the events.")
@click.option("--events", "event_types", default="*", show_default=True,
              help="Comma-separated event types (lead.created, ...), or * for all.")
@click.option("--description", default="", help="What the endpoint is for.")
@click.option("--json", "as_json", is_flag=True, help="Print the webhook and its secret as one JSON object.")
@click.pass_context
def webhooks_create(ctx: click.Context, workspace_id: str, url: str, event_types: str, description: str,
                    as_json: bool) -> None:
    """Register a webhook; its signing secret is shown once."""
    import marshmallow as ma

    from .problems import Problem
    from .webhooks import WebhookCreateSchema, WebhookWithSecretSchema, create_webhook

    app = _migrated_app(ctx)
    workspace = _workspace(workspace_id)
    try:
        data = WebhookCreateSchema().load({"url": url, "description": description,
                                           "events": [e.strip() for e in event_types.split(",") if e.strip()]})
        hook, secret = create_webhook(workspace.id, data, app.config["LEADSVC"])
    except ma.ValidationError as exc:
        raise click.ClickException("; ".join(f"{k}: {' '.join(map(str, v))}" for k, v in exc.messages.items())) from None
    except Problem as exc:
        raise click.ClickException(_problem_message(exc)) from None
    if as_json:
        hook.secret = secret
        _print_json(WebhookWithSecretSchema().dump(hook))
        return
    click.echo(f"Webhook {hook.public_id} -> {hook.url} ({', '.join(hook.events)}). Its signing secret, shown only now:")
    click.echo(f"  {secret}")


@webhooks.command("list")
@click.option("--workspace", "workspace_id", help="Only this workspace's webhooks (its public id or name).")
@click.option("--json", "as_json", is_flag=True, help="Print them as one JSON object.")
@click.pass_context
def webhooks_list(ctx: click.Context, workspace_id: str | None, as_json: bool) -> None:
    """List webhooks (never their secrets)."""
    from .models import Webhook
    from .webhooks import WebhookSchema

    _migrated_app(ctx)
    query = Webhook.select().order_by(Webhook.created_at, Webhook.id)
    if workspace_id:
        query = query.where(Webhook.workspace == _workspace(workspace_id).id)
    hooks = list(query)
    if as_json:
        _print_json({"webhooks": WebhookSchema(many=True).dump(hooks)})
        return
    if not hooks:
        click.echo("No webhooks.")
    for hook in hooks:
        state = "active" if hook.active else f"disabled ({hook.disabled_reason or 'by hand'})"
        click.echo(f"{hook.public_id}  {hook.url}  {','.join(hook.events)}  {state}")


@webhooks.command("delete")
@click.argument("webhook_id")
@click.pass_context
def webhooks_delete(ctx: click.Context, webhook_id: str) -> None:
    """Delete a webhook and its deliveries."""
    from .webhooks import delete_webhook

    _migrated_app(ctx)
    delete_webhook(_webhook(webhook_id))
    click.echo(f"Webhook {webhook_id} is deleted.")


@webhooks.command("deliveries")
@click.argument("webhook_id")
@click.option("--state", help="Only these states (pending, failed, succeeded, dead), comma-separated.")
@click.option("--limit", type=click.IntRange(1, 200), default=50, show_default=True, help="The newest this many.")
@click.option("--json", "as_json", is_flag=True, help="Print them as one JSON object.")
@click.pass_context
def webhooks_deliveries(ctx: click.Context, webhook_id: str, state: str | None, limit: int, as_json: bool) -> None:
    """The newest deliveries of a webhook."""
    import marshmallow as ma

    from .webhooks import DeliveriesQuery, DeliverySchema, deliveries_page

    _migrated_app(ctx)
    hook = _webhook(webhook_id)
    try:
        params = DeliveriesQuery().load({"page[size]": limit, **({"filter[state]": state} if state else {})})
    except ma.ValidationError as exc:
        raise click.ClickException("; ".join(f"{k}: {' '.join(map(str, v))}" for k, v in exc.messages.items())) from None
    rows = DeliverySchema(many=True).dump(deliveries_page(hook, params)[0])
    if as_json:
        _print_json({"deliveries": rows})
        return
    if not rows:
        click.echo("No deliveries.")
    for row in rows:
        outcome = f"HTTP {row['last_status']}" if row["last_status"] else (row["last_error"] or "not attempted yet")
        click.echo(f"{row['id']}  {row['event']['id']}  {row['event']['type']:<24} {row['state']:<9} "
                   f"attempts {row['attempts']}  {outcome}")


@webhooks.command("replay")
@click.argument("webhook_id")
@click.argument("delivery_id")
@click.pass_context
def webhooks_replay(ctx: click.Context, webhook_id: str, delivery_id: str) -> None:
    """Send a delivery again as its next attempt (a running serve or worker sends it)."""
    from .problems import Problem
    from .webhooks import delivery_or_404, replay

    _migrated_app(ctx)
    hook = _webhook(webhook_id)
    try:
        row, _ = delivery_or_404(hook, delivery_id)
        replay(row, hook)
    except Problem as exc:
        raise click.ClickException(_problem_message(exc)) from None
    click.echo(f"Delivery {delivery_id} is due again now.")


@cli.group()
def connectors() -> None:
    """Manage connectors (inbound lead feeds; setup declares them)."""


@connectors.command("rotate-key")
@click.argument("connector_id")
@click.option("--json", "as_json", is_flag=True, help="Print the connector's id, url and new key as one JSON object.")
@click.pass_context
def connectors_rotate_key(ctx: click.Context, connector_id: str, as_json: bool) -> None:
    """Issue a connector's new key, shown once; the old one stops at once."""
    from .connectors import intake_path, rotate_key
    from .models import Connector
    from .problems import Problem

    app = _migrated_app(ctx)
    connector = Connector.get_or_none(Connector.public_id == connector_id)
    if connector is None:
        raise click.ClickException(f"No connector {connector_id}. `leadsvc setup --json` shows the connectors.")
    try:
        connector, key = rotate_key(connector, app.config["LEADSVC"]["webhooks"]["secret_key"])
    except Problem as exc:
        raise click.ClickException(_problem_message(exc)) from None
    if as_json:
        _print_json({"id": connector.public_id, "url": intake_path(connector), "key": key})
        return
    click.echo(f"Connector {connector.public_id} ({connector.name}) has a new key; the old one no longer works. "
               "Shown only now:")
    click.echo(f"  {key}")


@cli.command()
@click.option("--output", "-o", type=click.Path(dir_okay=False), help="Write to this file instead of stdout.")
@click.pass_context
def openapi(ctx: click.Context, output: str | None) -> None:
    """Print the OpenAPI document."""
    from .openapi import openapi_json

    text = openapi_json(_app(ctx))
    if output:
        with open(output, "w", encoding="utf-8") as fh:
            fh.write(text)
    else:
        click.echo(text, nl=False)


@cli.command("import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--workspace", "workspace_id", required=True, help=WORKSPACE_HELP)
@click.option("--on-duplicate", "on_duplicate", type=click.Choice(ON_DUPLICATE), default="ignore", show_default=True,
              help="A row whose phone or e-mail matches a lead: leave the lead, update it with the row's "
                   "cells, or fill only its empty fields.")
@click.option("--json", "as_json", is_flag=True, help="Print the counts and every error as one JSON object.")
@click.pass_context
def import_leads(ctx: click.Context, file: str, workspace_id: str, on_duplicate: str, as_json: bool) -> None:
    """Create leads from a CSV file through the API's create path.

    Columns: first_name, last_name, phone, email, source (name or src_ id), estimated_value, and
    custom fields by name. Each row is its own transaction; duplicates are reported, never created
    twice (and updated as --on-duplicate says). Exits 1 when some rows failed (the others are imported).
    """
    from .csv_import import ImportFileError, count_rows, import_csv

    app = _migrated_app(ctx)
    workspace = _workspace(workspace_id)
    try:
        with open(file, newline="", encoding="utf-8-sig") as fh:
            total = count_rows(fh)
        with (open(file, newline="", encoding="utf-8-sig") as fh,
              click.progressbar(length=total, label=f"Importing {total} rows", file=sys.stderr) as bar):
            report = import_csv(fh, workspace, app.config["LEADSVC"], progress=bar.update, on_duplicate=on_duplicate)
    except ImportFileError as exc:
        raise click.ClickException(f"{file}: {exc} Nothing was imported.") from None
    except UnicodeDecodeError:
        raise click.ClickException(f"{file} is not UTF-8 text; save it as \"CSV UTF-8\". Nothing was imported.") from None
    except csv.Error as exc:
        raise click.ClickException(f"{file} is not a readable CSV file: {exc}.") from None
    except UNAVAILABLE_ERRORS as exc:
        raise click.ClickException(
            f"The database stopped answering ({str(exc).strip() or type(exc).__name__}). The rows before it "
            f"are imported; run the same command again: those come back as duplicates, never twice.") from None
    if as_json:
        _print_json(report.as_json())
    else:
        summary = report.as_json()
        click.echo(f"{file} -> {report.workspace}: {summary['rows']} rows, {summary['created']} created, "
                   f"{summary['duplicates']} duplicates (not created), {summary['failed']} failed.")
        for dup in report.duplicates:
            origin = f"created from row {dup['first_row']} of this file" if dup["first_row"] else "already there"
            changed = (f"; updated {', '.join(dup['updated_fields']) or 'nothing'}"
                       if dup.get("updated_fields") is not None else "")
            click.echo(f"  row {dup['row']}: duplicate of {dup['lead']} ({', '.join(dup['matched_on'])}), "
                       f"{origin}{changed}")
        for error in report.errors:
            click.echo(f"  row {error['row']}, {error['field']}: {error['message']}")
    if report.failed_rows:
        ctx.exit(1)


def _person(ctx: click.Context, workspace_id: str, phone: str | None, email: str | None):
    """The workspace and the person's phone and e-mail, normalized as the API normalizes them."""
    import marshmallow as ma

    from .fields import phones_of
    from .schemas import SubjectQuery

    _migrated_app(ctx)
    workspace = _workspace(workspace_id)
    try:
        with phones_of(workspace):
            person = SubjectQuery().load({k: v for k, v in (("phone", phone), ("email", email)) if v is not None})
    except ma.ValidationError as exc:
        raise click.ClickException(" ".join(f"--{field}: {' '.join(messages)}"
                                            for field, messages in exc.messages.items())) from None
    return workspace, person.get("phone"), person.get("email")


def _refs(ctx: click.Context, workspace):
    from .refs import cached_refs

    return cached_refs(workspace, _app(ctx).config["LEADSVC"])


@cli.command()
@click.option("--workspace", "workspace_id", required=True, help=WORKSPACE_HELP)
@click.option("--phone", help="The person's mobile number, in any spelling the API accepts.")
@click.option("--email", help="The person's e-mail address (case-insensitive).")
@click.option("--reason", required=True, help="Why (kept in each erased lead's audit entry).")
@click.option("--json", "as_json", is_flag=True, help="Print the erased lead ids as one JSON object.")
@click.pass_context
def erase(ctx: click.Context, workspace_id: str, phone: str | None, email: str | None, reason: str,
          as_json: bool) -> None:
    """Erase the personal data of every lead with this phone or e-mail (DPDP Act erasure)."""
    import uuid

    import marshmallow as ma

    from .pipeline import Actor
    from .privacy import erase_person
    from .schemas import EraseSchema

    workspace, phone, email = _person(ctx, workspace_id, phone, email)
    try:
        reason = EraseSchema().load({"reason": reason})["reason"]   # the API's rule for a reason
    except ma.ValidationError as exc:
        raise click.ClickException(f"--reason: {' '.join(exc.messages['reason'])}") from None
    actor = Actor(workspace=workspace, request_id=f"cli-{uuid.uuid4().hex[:16]}", via="cli")
    erased = erase_person(phone, email, reason, actor, _refs(ctx, workspace))
    if as_json:
        _print_json({"erased": erased})
    elif erased:
        click.echo(f"Erased {len(erased)} lead(s): {', '.join(erased)}")
    else:
        click.echo("No lead has this phone or e-mail; nothing was erased.")


@cli.command()
@click.option("--workspace", "workspace_id", required=True, help=WORKSPACE_HELP)
@click.option("--phone", help="The person's mobile number, in any spelling the API accepts.")
@click.option("--email", help="The person's e-mail address (case-insensitive).")
@click.pass_context
def subject(ctx: click.Context, workspace_id: str, phone: str | None, email: str | None) -> None:
    """Print, as JSON, everything the workspace holds about a person (DPDP Act access request)."""
    from .privacy import subject_document

    workspace, phone, email = _person(ctx, workspace_id, phone, email)
    _print_json(subject_document(workspace, phone, email, _refs(ctx, workspace)))


@cli.command()
@click.pass_context
def check(ctx: click.Context) -> None:
    """Validate the configuration, the database, Redis and webhook signing; list every problem and how to fix it."""
    findings = check_all(_app(ctx).config["LEADSVC"], config_path(ctx.obj["config_file"]))
    for fact in findings.facts:
        click.echo(f"ok: {fact}")
    if findings.problems:
        for problem in findings.problems:
            click.echo(f"problem: {problem}", err=True)
        ctx.exit(1)


def main(argv: list[str] | None = None) -> None:
    cli.main(args=argv, prog_name="leadsvc", obj={})


if __name__ == "__main__":
    main(sys.argv[1:])
