"""Bearer tokens: every 401 case, 403 naming the ability, and secrets that never reach the database."""

import subprocess
from datetime import timedelta
from pathlib import Path

import pytest

from leadsvc.auth import check_grant, effective_abilities, hash_token, issue_token, revoke_tokens
from leadsvc.models import Member, Token, utcnow

PATH = "/api/v1/statuses"


def assert_unauthenticated(response, detail_part):
    assert response.status_code == 401
    assert response.content_type == "application/problem+json"
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert response.json["code"] == "unauthenticated"
    assert detail_part in response.json["detail"]


def test_missing_token_is_401(client):
    assert_unauthenticated(client.get(PATH), "Authorization")


@pytest.mark.parametrize("header", ["Basic dXNlcjpwYXNz", "Bearer", "Bearer not-a-token", "lsk_abc",
                                    "Bearer lsk_short", "Bearer lsk_" + "x" * 31 + "!"])
def test_malformed_authorization_header_is_401(client, header):
    assert_unauthenticated(client.get(PATH, headers={"Authorization": header}), "Bearer lsk_")


def test_unknown_token_is_401(client, ws):
    forged = "lsk_" + "A" * 40
    assert_unauthenticated(client.get(PATH, headers={"Authorization": f"Bearer {forged}"}), "not known")


def test_revoked_token_is_401(client, ws):
    token, secret = issue_token(ws.member("admin@t.test"), ["*"])
    assert client.get(PATH, headers={"Authorization": f"Bearer {secret}"}).status_code == 200
    revoke_tokens(Token.public_id == token.public_id)
    assert_unauthenticated(client.get(PATH, headers={"Authorization": f"Bearer {secret}"}), "revoked")


def test_expired_token_is_401(client, ws):
    token, secret = issue_token(ws.member("admin@t.test"), ["*"], expires_in_days=1)
    Token.update(expires_at=utcnow() - timedelta(seconds=1)).where(Token.id == token.id).execute()
    assert_unauthenticated(client.get(PATH, headers={"Authorization": f"Bearer {secret}"}), "expired")


def test_token_of_a_deactivated_member_is_401(client, ws):
    headers = ws.headers("n1@t.test")
    Member.update(active=False).where(Member.public_id == ws.ids.members["n1@t.test"]).execute()
    assert_unauthenticated(client.get(PATH, headers=headers), "deactivated")


def test_token_without_the_ability_is_403_naming_it(client, ws):
    response = client.get("/api/v1/leads", headers=ws.headers("admin@t.test", ("leads:create",)))
    assert response.status_code == 403
    assert response.content_type == "application/problem+json"
    assert response.json["code"] == "forbidden" and "leads:read" in response.json["detail"]


def test_bearer_scheme_is_case_insensitive(client, ws):
    secret = ws.token()
    assert client.get(PATH, headers={"Authorization": f"bearer {secret}"}).status_code == 200


def test_agents_can_never_hold_assign_reports_or_audit():
    assert effective_abilities("agent", ["*"]) == effective_abilities("agent", ["*", "leads:assign"])
    assert not {"leads:assign", "reports:read", "audit:read"} & effective_abilities("agent", ["*"])
    with pytest.raises(ValueError, match="Agents cannot hold"):
        check_grant("agent", ["leads:read", "reports:read"])
    with pytest.raises(ValueError, match="Unknown abilities"):
        check_grant("admin", ["leads:reed"])


def test_only_the_sha256_of_a_secret_is_stored(client, ws, backend, database_url):
    token, secret = issue_token(ws.member("admin@t.test"), ["*"])
    row = Token.get_by_id(token.id)
    assert row.secret_hash == hash_token(secret) and secret not in repr(row.__data__)
    if backend == "sqlite":
        folder = Path(database_url.removeprefix("sqlite:///")).parent
        files = list(folder.glob("leadsvc.sqlite3*"))
        assert files, "the SQLite files exist"
        # Read by another process: closing a file of the database here would release every POSIX
        # lock this process holds on it, SQLite's included.
        data = subprocess.run(["cat", *map(str, files)], capture_output=True, check=True).stdout
        assert hash_token(secret).encode() in data, "the token row was written"
        assert secret.encode() not in data and secret[4:].encode() not in data


def test_last_used_at_is_recorded(client, ws):
    token, secret = issue_token(ws.member("admin@t.test"), ["*"])
    assert token.last_used_at is None
    client.get(PATH, headers={"Authorization": f"Bearer {secret}"})
    assert Token.get_by_id(token.id).last_used_at is not None
