"""The `leadsvc` command: serve, migrate, setup, demo, tokens, openapi, check."""

from __future__ import annotations

import json
import sys
from importlib import resources
from urllib.parse import urlsplit, urlunsplit

import click
from flask import Flask

from . import create_app
from .config import ConfigError
from .db import UNAVAILABLE_ERRORS, database, migrate as run_migrations, pending_migrations, ping

ABILITY_HELP = "Comma-separated abilities (leads:read, leads:create, ...), or * for all."


def _app(ctx: click.Context) -> Flask:
    """The app for this invocation, built once; a bad configuration is a clear error, not a traceback."""
    if ctx.obj.get("app") is None:
        try:
            ctx.obj["app"] = create_app(config_file=ctx.obj["config_file"])
        except ConfigError as exc:
            raise click.ClickException(f"Configuration: {exc}") from None
    return ctx.obj["app"]


def _migrated_app(ctx: click.Context) -> Flask:
    app = _app(ctx)
    try:
        applied = run_migrations()
    except UNAVAILABLE_ERRORS as exc:
        raise click.ClickException(
            f"Cannot reach the database at {redact(app.config['LEADSVC']['database']['url'])}: "
            f"{str(exc).strip() or type(exc).__name__}. Check database.url.") from None
    if applied:
        click.echo(f"Applied migrations: {', '.join(applied)}", err=True)
    return app


def redact(url: str) -> str:
    """A database URL without its password, for messages."""
    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return urlunsplit(parts._replace(netloc=netloc))
    return url


def _print_json(data: dict) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
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
    """Migrate if needed, then serve the API with waitress."""
    from waitress import serve as waitress_serve

    app = _migrated_app(ctx)
    server = app.config["LEADSVC"]["server"]
    host, port = host or server["host"], port or server["port"]
    options = {}
    if server["trusted_proxy"]:
        options = {"trusted_proxy": server["trusted_proxy"], "trusted_proxy_count": server["trusted_proxy_count"],
                   "trusted_proxy_headers": {"x-forwarded-for", "x-forwarded-proto", "x-forwarded-host"},
                   "clear_untrusted_proxy_headers": True}
    click.echo(f"leadsvc serving on http://{host}:{port} (docs at /docs, database "
               f"{redact(app.config['LEADSVC']['database']['url'])})", err=True)
    waitress_serve(
        app, host=host, port=port, threads=server["threads"], ident="leadsvc",
        connection_limit=server["connection_limit"], channel_timeout=server["channel_timeout"],
        # Above Flask's MAX_CONTENT_LENGTH, so an oversized body gets our 413 problem document.
        max_request_body_size=app.config["MAX_CONTENT_LENGTH"] * 16, **options,
    )


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

    _migrated_app(ctx)
    try:
        result = apply_setup(read_setup_file(file))
    except SetupError as exc:
        raise click.ClickException(f"{file} was not applied; nothing changed:\n  " + "\n  ".join(exc.problems)) from None
    if as_json:
        _print_json(result.as_json())
        return
    click.echo(f"Workspace {result.workspace} is set up from {file}:")
    for section in ("teams", "members", "statuses", "sources", "custom_fields", "rules", "forms"):
        ids = getattr(result, section)
        if ids:
            click.echo(f"  {section}: " + ", ".join(f"{name} {pid}" for name, pid in ids.items()))


@cli.command()
@click.option("--leads", "lead_count", type=click.IntRange(min=0), default=0,
              help="Also add this many synthetic leads (with history) by bulk insert.")
@click.option("--seed", type=int, default=1, show_default=True, help="Seed of the synthetic leads.")
@click.option("--json", "as_json", is_flag=True, help="Print the workspace and tokens as one JSON object.")
@click.pass_context
def demo(ctx: click.Context, lead_count: int, seed: int, as_json: bool) -> None:
    """Create the demo workspace if absent and print a fresh token for each demo member."""
    import time
    import tomllib

    from .auth import issue_token
    from .models import Member, Workspace
    from .provision import apply_setup, parse_setup
    from .synthetic import add_leads

    app = _migrated_app(ctx)
    data = parse_setup(tomllib.loads(resources.files("leadsvc").joinpath("demo.toml").read_text()))
    with database.atomic():
        result = apply_setup(data)
        tokens = {}
        for email, member_id in result.members.items():
            member = Member.get(Member.public_id == member_id)
            token, secret = issue_token(member, ["*"], name="demo")
            tokens[email] = {"id": token.public_id, "token": secret, "member": member_id, "role": member.role,
                             "name": member.name}
    if lead_count:
        started = time.monotonic()
        workspace = Workspace.get(Workspace.public_id == result.workspace)
        with click.progressbar(length=lead_count, label="Synthetic leads", file=sys.stderr) as bar:
            written = add_leads(workspace, lead_count, seed=seed, progress=bar.update)
        click.echo(f"Added {written:,} synthetic leads in {time.monotonic() - started:.1f} s.", err=True)
    if as_json:
        _print_json({"workspace": result.workspace,
                     "tokens": {e: {k: t[k] for k in ("id", "token", "member", "role")} for e, t in tokens.items()}})
        return
    server = app.config["LEADSVC"]["server"]
    base = f"http://{server['host']}:{server['port']}"
    click.echo(f"Demo workspace {result.workspace} (Demo Realty). A new token for each member; "
               f"each secret is shown once:")
    for email, token in tokens.items():
        click.echo(f"  {token['role']:<8} {token['name']:<12} {email:<18} {token['token']}")
    admin = next(t for t in tokens.values() if t["role"] == "admin")
    click.echo(f"\nTry it:\n  curl -H 'Authorization: Bearer {admin['token']}' {base}/api/v1/leads\n"
               f"Interactive docs: {base}/docs")


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
    from .models import Member

    _migrated_app(ctx)
    member = Member.get_or_none(Member.public_id == member_id)
    if member is None:
        raise click.ClickException(f"No member {member_id}. `leadsvc setup --json` prints the members' ids.")
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
    from .models import Member, Token

    _migrated_app(ctx)
    query = Token.select(Token, Member).join(Member).order_by(Token.created_at, Token.id)
    if member_id:
        query = query.where(Member.public_id == member_id)
    rows = list(query)
    if not rows:
        click.echo("No tokens.")
        return
    for token in rows:
        state = ("revoked " + token.revoked_at.strftime("%Y-%m-%d")) if token.revoked_at else (
            "expires " + token.expires_at.strftime("%Y-%m-%d") if token.expires_at else "active")
        used = token.last_used_at.strftime("%Y-%m-%d %H:%M") if token.last_used_at else "never"
        click.echo(f"{token.public_id}  {token.member.public_id}  {token.member.name:<16} {token.name:<10} "
                   f"{state:<18} used {used:<16} {','.join(token.abilities)}")


@tokens.command("revoke")
@click.argument("token_id")
@click.pass_context
def tokens_revoke(ctx: click.Context, token_id: str) -> None:
    """Revoke a token: it stops working at once."""
    from .auth import revoke_token

    _migrated_app(ctx)
    try:
        token = revoke_token(token_id)
    except LookupError as exc:
        raise click.ClickException(f"{exc} `leadsvc tokens list` shows the tokens.") from None
    click.echo(f"Token {token.public_id} is revoked.")


@cli.command()
@click.option("--output", "-o", type=click.Path(dir_okay=False), help="Write to this file instead of stdout.")
@click.pass_context
def openapi(ctx: click.Context, output: str | None) -> None:
    """Print the OpenAPI document."""
    from .docs import openapi_json

    text = openapi_json(_app(ctx))
    if output:
        with open(output, "w", encoding="utf-8") as fh:
            fh.write(text)
    else:
        click.echo(text, nl=False)


@cli.command()
@click.pass_context
def check(ctx: click.Context) -> None:
    """Validate the configuration and the database connection; say what is wrong."""
    app = _app(ctx)
    url = redact(app.config["LEADSVC"]["database"]["url"])
    try:
        ping()
        pending = pending_migrations()
    except UNAVAILABLE_ERRORS as exc:
        raise click.ClickException(f"Database {url} is not reachable: {str(exc).strip() or type(exc).__name__}.") from None
    if pending:
        raise click.ClickException(f"Database {url} needs migrations ({', '.join(pending)}): run `leadsvc migrate`.")
    click.echo(f"Configuration is valid; database {url} answers and is up to date.")


def main(argv: list[str] | None = None) -> None:
    cli.main(args=argv, prog_name="leadsvc", obj={})


if __name__ == "__main__":
    main(sys.argv[1:])
