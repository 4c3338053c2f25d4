"""`q` on the lead list and the export: phone suffixes, e-mails and name words, in scope, with
the other filters, sorts and cursors, kept up to date by every write, and never a 500."""

from __future__ import annotations

import csv
import io
from datetime import datetime
from urllib.parse import parse_qs, urlsplit

import peewee as pw
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import fresh_database, run_import
from leadsvc.models import Lead, LeadNamePart
from leadsvc import search
from leadsvc.search import PART_START, name_key, name_parts, parse, parts_of

LIST = "/api/v1/leads"


def found(client, ws, q, email="admin@t.test", **params) -> set[str]:
    response = client.get(LIST, query_string={"q": q, **params}, headers=ws.headers(email))
    assert response.status_code == 200, response.get_json()
    return {lead["id"] for lead in response.json["data"]}


@pytest.fixture
def asha(client, make_lead, ws):
    return make_lead(ws, first_name="Asha", last_name="Rao", phone="+919876543210",
                     email="Asha.Rao@Example.com")["id"]


# --- what q means ------------------------------------------------------------------------------

@pytest.mark.parametrize("q", ["43210", "98765 43210", "+91 98765 43210", "919876543210", "(987) 654-3210",
                               "9876.543.210", " 3210 "])
def test_digits_find_phones_ending_in_them(client, make_lead, ws, asha, q):
    make_lead(ws, first_name="Other", phone="+919876543211")
    assert found(client, ws, q) == {asha}


@pytest.mark.parametrize("q", ["12", "1 2 3", "(55)"])
def test_fewer_than_four_digits_are_not_a_phone_search(client, ws, asha, q):
    assert found(client, ws, q) == set()


@pytest.mark.parametrize("q", ["asha.rao@example.com", "ASHA.RAO@EXAMPLE.COM", "asha.rao@", "asha.rao@exa"])
def test_text_with_an_at_sign_finds_emails_equal_to_it_or_starting_with_it(client, make_lead, ws, asha, q):
    make_lead(ws, first_name="Other", email="ashar@example.com")
    assert found(client, ws, q) == {asha}


def test_an_email_in_the_middle_is_not_found(client, ws, asha):
    assert found(client, ws, "rao@example.com") == set()


@pytest.mark.parametrize("q", ["asha", "ASHA", "as", "rao", "asha r", "r asha", "  asha   rao  "])
def test_name_words_start_the_first_or_last_name(client, make_lead, ws, asha, q):
    make_lead(ws, first_name="Ravi", last_name="Kumar")
    assert found(client, ws, q) == {asha}


def test_every_word_must_match(client, ws, asha):
    assert found(client, ws, "asha kumar") == set()
    assert found(client, ws, "sha") == set()   # the start of a name, not its middle


@pytest.mark.parametrize("q", ["jose", "JOSÉ", "maria", "garcia", "garcía", "maría-josé", "o b", "brien",
                               "o'brien", "O’Brien", "van", "der", "van der", "der o"])
def test_name_parts_case_and_accents(client, make_lead, ws, q):
    lead = make_lead(ws, first_name="María-José", last_name="van der O’Brien García")["id"]
    make_lead(ws, first_name="Obi", last_name="Kenobi")
    assert found(client, ws, q) == {lead}


def test_a_word_must_start_a_part():
    assert not found_in(name_parts("Asha", "Rao"), "sha")
    assert not found_in(name_parts("Mary", "O'Brien"), "obrien")


def found_in(parts: set[str], word: str) -> bool:
    return any(part.startswith(word) for part in parts)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(first=st.text(max_size=30), last=st.text(alphabet="ab -'\x1f\x1e\u00a8", max_size=12),
       q=st.text(alphabet="ab -'\u00a8", min_size=2, max_size=8))
def test_a_name_key_holds_a_word_exactly_where_the_word_starts_a_part(first, last, q):
    # The plan of a common word checks the lead's name key, the plan of a rare one its part rows:
    # both must find the same leads.
    parts, key = name_parts(first, last), name_key(first, last)
    assert sorted(parts_of(key)) == sorted(parts)
    try:
        words = parse(q).terms
    except ValueError:   # blank, say
        words = ()
    for word in words:
        assert (PART_START + word in (key or "")) == found_in(parts, word), (first, last, word)


def test_name_parts_split_on_whitespace_hyphens_and_apostrophes():
    assert name_parts("Mary-Jane", "D'Souza Kó") == {"mary-jane", "jane", "d'souza ko", "souza ko", "ko"}


# --- 422 -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("q", ["", " ", "a", "  b  ", "x" * 101, "\x00ab", "a\x01b"])
def test_too_short_too_long_or_control_characters_are_422(client, ws, q):
    response = client.get(LIST, query_string={"q": q}, headers=ws.headers())
    assert response.status_code == 422
    assert "q" in response.json["errors"]


def test_export_validates_q_too(client, ws):
    assert client.get("/api/v1/leads/export.csv?q=a", headers=ws.headers()).status_code == 422


def test_a_hundred_characters_are_allowed(client, ws):
    assert found(client, ws, "x" * 100) == set()


# --- scope, filters, sorts, cursors --------------------------------------------------------------

def test_search_stays_inside_the_callers_scope(client, ws, other_ws, make_lead):
    mine = make_lead(ws, owner="n1@t.test", first_name="Zaid", last_name="Khan", email="zaid@k.test",
                     phone="+919811111234")["id"]
    theirs = make_lead(ws, owner="n2@t.test", first_name="Zaid", last_name="Khan", email="zaid2@k.test",
                       phone="+919822221234")["id"]
    south = make_lead(ws, owner="s1@t.test", first_name="Zaid", last_name="Khan", email="zaid3@k.test",
                      phone="+919833331234")["id"]
    elsewhere = make_lead(other_ws, first_name="Zaid", last_name="Khan", email="zaid@k.test",
                          phone="+919811111234")["id"]
    for q in ("zaid khan", "1234", "zaid"):
        assert found(client, ws, q) == {mine, theirs, south}
        assert found(client, ws, q, email="nmgr@t.test") == {mine, theirs}
        assert found(client, ws, q, email="n1@t.test") == {mine}
        assert elsewhere in found(client, other_ws, q)
    assert found(client, ws, "zaid@k.test", email="n1@t.test") == {mine}
    assert found(client, ws, "zaid@k.test", email="n2@t.test") == set()


def test_search_combines_with_filters_sorts_and_cursors(client, make_lead, ws):
    ids = [make_lead(ws, first_name="Kiran", last_name=f"Shah{i}")["id"] for i in range(7)]
    make_lead(ws, first_name="Other")
    for sort in ("-created_at", "score", "-last_activity_at"):
        url, seen = f"{LIST}?q=kiran&sort={sort}&page[size]=3", []
        while url:
            response = client.get(url, headers=ws.headers())
            assert response.status_code == 200, response.json
            seen += [lead["id"] for lead in response.json["data"]]
            url = response.json["links"]["next"]
            if url:
                assert parse_qs(urlsplit(url).query)["q"] == ["kiran"]
        assert sorted(seen) == sorted(ids) and len(seen) == 7
    assert found(client, ws, "kiran", **{"filter[status]": ws.ids.statuses["Won"]}) == set()
    assert found(client, ws, "kiran", **{"filter[status]": ws.ids.statuses["New"]}) == set(ids)


def test_a_cursor_is_bound_to_its_q(client, make_lead, ws):
    for i in range(3):
        make_lead(ws, first_name="Kiran", last_name=f"Shah{i}")
    first = client.get(f"{LIST}?q=kiran&page[size]=1", headers=ws.headers())
    after = parse_qs(urlsplit(first.json["links"]["next"]).query)["page[after]"][0]
    other = client.get(LIST, query_string={"q": "shah", "page[size]": 1, "page[after]": after}, headers=ws.headers())
    assert other.status_code == 422 and "page[after]" in other.json["errors"]


def test_export_takes_q(client, make_lead, ws, asha):
    make_lead(ws, first_name="Ravi")
    response = client.get("/api/v1/leads/export.csv?q=asha", headers=ws.headers())
    rows = list(csv.DictReader(io.StringIO(response.get_data(as_text=True))))
    assert [row["id"] for row in rows] == [asha]


# --- kept up to date -----------------------------------------------------------------------------

@pytest.mark.parametrize("common", [1, 2000])
def test_a_patch_of_phone_email_or_names_moves_what_is_found(client, ws, asha, monkeypatch, common):
    monkeypatch.setattr(search, "COMMON", common)   # 1: name words take the plan of a common word
    changed = client.patch(f"{LIST}/{asha}", json={"first_name": "Meera", "last_name": "Iyer",
                                                   "phone": "+919812345678", "email": "meera@x.test"},
                           headers=ws.headers())
    assert changed.status_code == 200, changed.json
    for gone in ("asha", "rao", "43210", "asha.rao@"):
        assert found(client, ws, gone) == set()
    for now in ("meera", "iyer", "meera iyer", "45678", "meera@x.test"):
        assert found(client, ws, now) == {asha}
    assert sorted(p.part for p in LeadNamePart.select().join(Lead).where(Lead.public_id == asha)) == ["iyer", "meera"]
    assert parts_of(Lead.get(Lead.public_id == asha).name_key) == ["iyer", "meera"]


def test_a_patch_of_other_fields_keeps_the_name_parts(client, ws, asha):
    client.patch(f"{LIST}/{asha}", json={"estimated_value": 10}, headers=ws.headers())
    assert found(client, ws, "asha rao") == {asha}


def test_a_csv_import_is_found(client, ws, database_url, tmp_path):
    path = tmp_path / "leads.csv"
    path.write_text("first_name,last_name,phone,email,source\nPriya,Nair,+919845678123,priya@n.test,Website\n")
    assert run_import(database_url, path, ws.public_id).exit_code == 0
    assert len(found(client, ws, "priya nair")) == 1
    assert found(client, ws, "78123") == found(client, ws, "priya@n.test") == found(client, ws, "priya nair")


def test_the_demo_loader_fills_the_search_data(client, ws):
    from leadsvc.models import Workspace
    from leadsvc.bulk_load import add_leads
    workspace = Workspace.get(Workspace.public_id == ws.public_id)
    add_leads(workspace, 50, seed=2027)   # a seed of its own: a seed repeats public ids
    lead = Lead.select().where((Lead.workspace == workspace.id) & Lead.phone.is_null(False)
                               & (Lead.first_name != "")).first()
    assert lead.id in {row.lead_id for row in LeadNamePart.select().where(LeadNamePart.lead == lead.id)}
    assert lead.public_id in found(client, ws, lead.phone[-6:])
    assert lead.public_id in found(client, ws, f"{lead.first_name} {lead.last_name}"[:40])


# --- never a 500 -----------------------------------------------------------------------------------

def test_parse_classifies_by_what_is_typed():
    assert parse("+91 98765-43210").kind == "phone"
    assert parse("abc@").kind == "email"
    assert parse("12 ab").kind == "name"


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(q=st.one_of(st.text(max_size=110),
                   st.text(alphabet="0123456789 +-.()%_\\'\"@*:^~", max_size=30),
                   st.text(alphabet=st.characters(codec="utf-8"), min_size=2, max_size=12)))
def test_any_q_is_200_or_422_never_500(client, ws, q):
    for path in (LIST, "/api/v1/leads/export.csv"):
        response = client.get(path, query_string={"q": q}, headers=ws.headers())
        assert response.status_code in (200, 422), (q, response.status_code, response.get_data(as_text=True)[:300])


@pytest.mark.parametrize("common", [1, 2000])
def test_common_and_rare_words_find_the_same_leads_in_every_scope(client, ws, make_lead, monkeypatch, common):
    # `common` 1: every word takes the plan for a common one (the sort index, checking name keys).
    monkeypatch.setattr(search, "COMMON", common)
    mine = [make_lead(ws, owner="n1@t.test", first_name="Kiran", last_name=f"Shah{i}")["id"] for i in range(4)]
    south = make_lead(ws, owner="s1@t.test", first_name="Kiran", last_name="Rao")["id"]
    make_lead(ws, first_name="Other", last_name="Shah")["id"]
    assert found(client, ws, "kiran") == {*mine, south}
    assert found(client, ws, "kir sha") == set(mine)
    assert found(client, ws, "kiran rao") == {south}
    assert found(client, ws, "kiran", email="n1@t.test") == set(mine)
    url, seen = f"{LIST}?q=kiran+shah&sort=score&page[size]=3", []
    while url:
        response = client.get(url, headers=ws.headers())
        seen += [lead["id"] for lead in response.json["data"]]
        url = response.json["links"]["next"]
    assert sorted(seen) == sorted(mine)


def migrated_up_to(target: str, backend, tmp_path, request):
    """A fresh database migrated up to `target`, with a workspace and its status, and the runner
    that takes it further."""
    from leadsvc.db import MigrationRunner
    from leadsvc.models import Status, Workspace, new_public_id
    db = fresh_database(backend, tmp_path, request)
    runner = MigrationRunner(db, table_name="schema_migration")
    with db.atomic():
        runner.up(target=target)
    # The workspace row with the columns of 0001 alone (the model has later ones).
    table = pw.Table("workspace").bind(db)
    table.insert(public_id=new_public_id("ws_"), name=f"Before {target}", timezone="Asia/Kolkata", currency="INR",
                 created_at=datetime(2026, 1, 1), refs_version=0).execute()
    with db.bind_ctx([Workspace, Status]):
        workspace = Workspace.select(Workspace.id).where(Workspace.name == f"Before {target}").get()
        status = Status.create(workspace=workspace, name="New", position=1, kind="open")
    return db, runner, workspace, status


def insert_old_lead(db, workspace, status, letter: str, **contact) -> int:
    """A lead row with only the columns 0007 has (the model has later ones); its id."""
    now, table = datetime(2026, 1, 1), pw.Table("lead").bind(db)
    table.insert(workspace_id=workspace.id, public_id="ld_" + letter * 22, status_id=status.id, custom_fields="{}",
                 score_reasons="[]", score=0, engagement=0, version=1, created_at=now, updated_at=now,
                 status_changed_at=now, activity_sort_at=now, **contact).execute()
    return table.select(table.c.id).where(table.c.public_id == "ld_" + letter * 22).scalar()


def test_migration_0008_backfills_the_leads_already_there(app, backend, tmp_path, request):
    db, runner, workspace, status = migrated_up_to("0007_partial_contact_indexes", backend, tmp_path, request)
    insert_old_lead(db, workspace, status, "B", first_name="José", last_name="D'Souza", phone="+919876543210")
    insert_old_lead(db, workspace, status, "C", first_name="", last_name="", email="x@y.test")
    with db.atomic():
        assert runner.up(target="0008_search") == ["0008_search"]
    with db.bind_ctx([Lead, LeadNamePart]):
        rows = {lead.public_id[3]: lead for lead in Lead.select(Lead.id, Lead.public_id, Lead.phone_reversed)}
        assert rows["B"].phone_reversed == "012345678919" and rows["C"].phone_reversed is None
        assert sorted(p.part for p in LeadNamePart.select().where(LeadNamePart.lead == rows["B"].id)) == \
            ["d'souza", "jose", "souza"]
    db.close()


def test_migration_0012_gives_the_leads_already_there_their_name_keys(app, backend, tmp_path, request):
    db, runner, workspace, status = migrated_up_to("0011_privacy", backend, tmp_path, request)
    old_part = pw.Table("lead_name_part").bind(db)
    names = {"B": ("María-José", "van der O’Brien"), "C": ("", ""), "D": ("Odd\x1fname", "")}
    for letter, (first, last) in names.items():
        lead_id = insert_old_lead(db, workspace, status, letter, first_name=first, last_name=last,
                                  email=f"{letter}@y.test")
        # Parts as 0008 to 0011 wrote them: a U+001F inside a name stays in its part.
        for part in {part.replace("\x1e", "\x1f") for part in name_parts(first, last)}:
            old_part.insert(lead_id=lead_id, workspace_id=workspace.id, part=part).execute()
    with db.atomic():
        assert runner.up(target="0012_name_key") == ["0012_name_key"]
    with db.bind_ctx([Lead]):
        keys = {lead.public_id[3]: lead.name_key for lead in Lead.select(Lead.public_id, Lead.name_key)}
    assert keys["C"] is None
    for letter in "BD":
        assert sorted(parts_of(keys[letter])) == sorted(name_parts(*names[letter])), letter
    db.close()


@pytest.mark.only_on("postgresql")
def test_the_columns_searched_by_prefix_compare_byte_by_byte_whatever_the_database_collation(app):
    # A prefix range is the prefix only under byte-wise order; the database's own collation may
    # be a language's (en_US.UTF-8), so the columns name theirs (0013).
    from leadsvc.db import database
    rows = database.execute_sql(
        "SELECT table_name, column_name, collation_name FROM information_schema.columns "
        "WHERE table_schema = current_schema() AND (table_name, column_name) IN "
        "(('lead', 'email'), ('lead', 'phone_reversed'), ('lead_name_part', 'part'))").fetchall()
    assert sorted(rows) == [("lead", "email", "C"), ("lead", "phone_reversed", "C"), ("lead_name_part", "part", "C")]


def test_a_phone_is_searched_by_the_same_characters_a_create_takes():
    # Full-width digits are digits to a create (the phone library reads them): a search too.
    assert parse("\uff19\uff18\uff17\uff16\uff15") == parse("98765")
    assert parse("98765-43210").kind == "phone" and parse("9876x").kind == "name"
