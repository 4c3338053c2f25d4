"""db.Prepared: queries built once give the rows peewee itself gives."""

import peewee as pw

from leadsvc.auth import hash_token, issue_token
from leadsvc.db import Prepared
from leadsvc.models import Lead, Member, Team, Token, Workspace


def same(fast, slow) -> bool:
    return (type(fast) is type(slow) and fast.__data__ == slow.__data__ and not fast._dirty
            and {name: row.__data__ for name, row in fast.__rel__.items()}
            == {name: row.__data__ for name, row in slow.__rel__.items()})


def test_a_join_through_the_roots_foreign_keys_gives_peewees_instances(app, ws):
    token, secret = issue_token(ws.member("admin@t.test"), ["*"])
    query = lambda digest: (Token.select(Token, Member, Workspace).join(Member).switch(Token).join(Workspace)  # noqa: E731
                            .where(Token.secret_hash == digest))
    prepared = Prepared(query)
    [fast], [slow] = prepared(hash_token(secret)), list(query(hash_token(secret)))
    assert same(fast, slow) and fast.member.role == "admin" and fast.workspace.public_id == ws.public_id
    assert isinstance(fast.abilities, list) and fast.member.active is True
    assert prepared.makers and all(make is not None for make in prepared.makers.values())


def test_other_shapes_are_built_by_peewee(app, ws):
    query = lambda member: (Member.select(Member, Team).join(Team, pw.JOIN.LEFT_OUTER)  # noqa: E731
                            .where(Member.id == member))
    prepared = Prepared(query)
    admin = ws.member("admin@t.test")
    [fast], [slow] = prepared(admin.id), list(query(admin.id))
    assert fast.__data__ == slow.__data__ and fast.team is None   # the admin has no team
    assert all(make is None for make in prepared.makers.values())
    assert Prepared(lambda email: Lead.select().where(Lead.email == email))("nobody@example.com") == []
    tuples = Prepared(lambda member: Member.select(Member.email).where(Member.id == member).tuples())
    assert tuples(admin.id) == [("admin@t.test",)]
