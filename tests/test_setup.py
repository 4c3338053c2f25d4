"""`leadsvc setup FILE`: idempotent by name, applies changes, never deletes, and a bad file writes nothing."""

import json
import uuid

import pytest

from conftest import standard_setup
from leadsvc.models import CustomField, Form, Member, Rule, Source, Status, Team, Workspace
from leadsvc.provision import SetupError, apply_setup, parse_setup

SETUP_TOML = """\
[workspace]
name = "{name}"
timezone = "Asia/Kolkata"
currency = "INR"

[[teams]]
name = "North"

[[teams]]
name = "South"

[[members]]
name = "Priya Shah"
email = "priya@acme.test"
role = "admin"

[[members]]
name = "Asha Rao"
email = "asha@acme.test"
role = "manager"
team = "North"

[[members]]
name = "Ravi Kumar"
email = "ravi@acme.test"
role = "agent"
team = "North"

[[statuses]]
name = "New"
kind = "open"
next = ["Contacted", "Lost"]

[[statuses]]
name = "Contacted"
kind = "open"

[[statuses]]
name = "Won"
kind = "won"
next = []

[[statuses]]
name = "Lost"
kind = "lost"

[[sources]]
name = "Website"
score = 10

[[custom_fields]]
name = "product_interest"
type = "choice"
options = ["2bhk", "villa"]
score = {{ villa = 15 }}

[[rules]]
name = "Villas go North"
when = {{ source = ["Website"], custom_fields = {{ product_interest = ["villa"] }} }}
assign = {{ team = "North", strategy = "round_robin" }}

[[forms]]
name = "Website enquiry"
source = "Website"
allowed_origins = ["https://acme.test"]
"""

TABLES = (Workspace, Team, Member, Status, Source, CustomField, Rule, Form)


def row_counts() -> dict[str, int]:
    return {model.__name__: model.select().count() for model in TABLES}


@pytest.fixture
def setup_file(tmp_path):
    """Write a setup file (the valid one, with replacements) and return its path and workspace name."""
    def write(*replacements: tuple[str, str]) -> tuple[str, str]:
        name = f"Acme {uuid.uuid4().hex[:8]}"
        text = SETUP_TOML.format(name=name)
        for old, new in replacements:
            assert old in text, f"the test's replacement {old!r} matches nothing"
            text = text.replace(old, new, 1)
        path = tmp_path / f"{uuid.uuid4().hex[:6]}.toml"
        path.write_text(text)
        return str(path), name
    return write


# --- idempotency and changes -----------------------------------------------------------------

def test_running_the_same_file_twice_gives_the_same_ids_and_no_new_rows(run_cli, setup_file):
    path, _ = setup_file()
    first = run_cli("setup", path, "--json")
    assert first.exit_code == 0, first.output
    counts = row_counts()
    second = run_cli("setup", path, "--json")
    assert second.exit_code == 0, second.output
    assert json.loads(second.stdout) == json.loads(first.stdout)
    assert row_counts() == counts


def test_a_changed_file_applies_its_changes_and_keeps_every_id(client, make_workspace):
    changes = {}

    def record(data):
        changes["data"] = data

    tenant = make_workspace(record)
    data = changes["data"]
    data["workspace"]["timezone"] = "Europe/London"
    n1 = next(m for m in data["members"] if m["email"] == "n1@t.test")
    n1["team"] = "South"                                             # moved to another team
    next(m for m in data["members"] if m["email"] == "n2@t.test")["active"] = False   # deactivated
    order = ["New", "Qualified", "Contacted", "Proposal", "Won", "Lost"]
    data["statuses"].sort(key=lambda s: order.index(s["name"]))       # a new pipeline order
    data["statuses"][0]["next"] = ["Qualified", "Lost"]
    next(s for s in data["sources"] if s["name"] == "Website")["score"] = 25
    data["teams"].append({"name": "East"})
    old_token = tenant.headers("n2@t.test")

    again = apply_setup(parse_setup(data))

    for section in ("teams", "members", "statuses", "sources", "custom_fields"):
        before = getattr(tenant.ids, section)
        assert {k: v for k, v in getattr(again, section).items() if k in before} == before
    assert again.workspace == tenant.ids.workspace and "East" in again.teams
    assert Workspace.get(Workspace.public_id == again.workspace).timezone == "Europe/London"
    assert tenant.member("n1@t.test").team.name == "South"
    assert tenant.member("n2@t.test").active is False
    assert Source.get(Source.public_id == again.sources["Website"]).score == 25

    headers = tenant.headers()
    statuses = client.get("/api/v1/statuses", headers=headers).json["data"]
    assert [s["name"] for s in statuses] == order
    assert statuses[0]["next"] == [again.statuses["Qualified"], again.statuses["Lost"]]
    members = {m["email"]: m for m in client.get("/api/v1/members", headers=headers).json["data"]}
    assert members["n1@t.test"]["team"]["name"] == "South" and members["n2@t.test"]["active"] is False
    assert client.get("/api/v1/statuses", headers=old_token).status_code == 401   # deactivated member


def test_setup_never_deletes_what_a_file_leaves_out(make_workspace):
    names = {}

    def record(data):
        names["workspace"] = data["workspace"]["name"]

    tenant = make_workspace(record)
    apply_setup(parse_setup({"workspace": {"name": names["workspace"]},
                             "members": [{"name": "Zed New", "email": "zed@t.test", "role": "agent",
                                          "team": "North"}]}))
    workspace = Workspace.get(Workspace.public_id == tenant.ids.workspace)
    assert Team.select().where(Team.workspace == workspace).count() == 2     # referred to, not listed
    assert Status.select().where(Status.workspace == workspace).count() == 6
    assert Member.select().where(Member.workspace == workspace).count() == 7
    assert tenant.member("n1@t.test").active is True


# --- bad files -------------------------------------------------------------------------------

BAD_FILES = {
    # name: (replacement in the valid file, what the message must say)
    "unknown key": (('score = 10\n', 'score = 10\ncolour = "red"\n'), "sources[0].colour: unknown key"),
    "unknown section": (('[[forms]]', '[[widgets]]\nname = "x"\n\n[[forms]]'), "widgets: unknown key"),
    "missing required key": (('name = "Asha Rao"\n', ''), "members[1].name: Missing data for required field"),
    "missing kind": (('name = "Contacted"\nkind = "open"\n', 'name = "Contacted"\n'), "statuses[1].kind: Missing data"),
    "bad role": (('role = "agent"', 'role = "boss"'), "members[2].role: Must be one of: admin, manager, agent"),
    "agent without team": (('role = "agent"\nteam = "North"\n', 'role = "agent"\n'), "members[2].team: Required"),
    "unknown team": (('role = "agent"\nteam = "North"', 'role = "agent"\nteam = "Nowhere"'),
                     "members[2].team: unknown team 'Nowhere' (known: North, South)"),
    "unknown status in next": (('next = ["Contacted", "Lost"]', 'next = ["Contacted", "Closed"]'),
                               "statuses[0].next[1]: unknown status 'Closed'"),
    "first status not open": (('name = "New"\nkind = "open"', 'name = "New"\nkind = "lost"'),
                              "statuses[0].kind: the first status is where new leads start"),
    "duplicate team": (('[[members]]', '[[teams]]\nname = "North"\n\n[[members]]'),
                       "teams[2].name: 'North' appears twice"),
    "duplicate member e-mail": (('email = "ravi@acme.test"', 'email = "ASHA@acme.test"'),
                                "members[2].email: 'ASHA@acme.test' appears twice"),
    "bad time zone": (('timezone = "Asia/Kolkata"', 'timezone = "Mars/Olympus"'),
                      "workspace.timezone: Unknown time zone 'Mars/Olympus'"),
    "bad currency": (('currency = "INR"', 'currency = "rupees"'), "workspace.currency: Use a 3-letter"),
    "unknown phone region": (('currency = "INR"', 'currency = "INR"\nphone_regions = ["IN", "UAE"]'),
                             "workspace.phone_regions: Unknown region 'UAE'"),
    "phone regions without India": (('currency = "INR"', 'currency = "INR"\nphone_regions = ["AE"]'),
                                    'workspace.phone_regions: List "IN" too'),
    "choice without options": (('options = ["2bhk", "villa"]\nscore = { villa = 15 }\n', ''),
                               "custom_fields[0].options: A choice field needs its options"),
    "custom field named like a CSV column": (('name = "product_interest"', 'name = "owner"'),
                                            "custom_fields[0].name: 'owner' is a column of the CSV export"),
    "rule with unknown team": (('assign = { team = "North"', 'assign = { team = "West"'),
                               "rules[0].assign.team: unknown team 'West'"),
    "rule with unknown custom field": (('custom_fields = { product_interest', 'custom_fields = { colour'),
                                       "rules[0].when.custom_fields.colour: unknown custom field"),
    "form with unknown source (the last section)": (('source = "Website"\nallowed_origins',
                                                     'source = "Billboard"\nallowed_origins'),
                                                    "forms[0].source: unknown source 'Billboard' (known: Website)"),
    "bad TOML": (('name = "North"', 'name = North'), "not valid TOML"),
}


@pytest.mark.parametrize("case", BAD_FILES)
def test_a_bad_file_exits_non_zero_naming_the_key_and_writes_nothing(run_cli, setup_file, case):
    replacement, message = BAD_FILES[case]
    path, name = setup_file(replacement)
    counts = row_counts()
    result = run_cli("setup", path, "--json")
    assert result.exit_code != 0
    assert result.stdout == ""
    assert "was not applied; nothing changed" in result.stderr
    assert message in result.stderr, result.stderr
    assert "Traceback" not in result.output
    assert row_counts() == counts
    assert Workspace.get_or_none(Workspace.name == name) is None


def test_a_bad_file_leaves_an_existing_workspace_as_it_was(run_cli, setup_file):
    path, name = setup_file()
    ids = json.loads(run_cli("setup", path, "--json").stdout)
    bad = open(path).read().replace("score = 10", "score = 99").replace('next = ["Contacted", "Lost"]', 'next = ["Gone"]')
    open(path, "w").write(bad)
    result = run_cli("setup", path)
    assert result.exit_code != 0 and "statuses[0].next[0]: unknown status 'Gone'" in result.stderr
    assert Source.get(Source.public_id == ids["sources"]["Website"]).score == 10


def test_a_failure_while_writing_rolls_back_the_whole_file(make_workspace, app, monkeypatch):
    data = standard_setup(f"Test {uuid.uuid4().hex[:10]}")
    data["forms"] = [{"name": "Enquiry", "source": "Website"}]
    counts = row_counts()

    def fail(*args, **kwargs):
        raise RuntimeError("the disk is full")

    monkeypatch.setattr(Form, "create", fail)   # the last thing setup writes
    with pytest.raises(RuntimeError):
        apply_setup(parse_setup(data))
    assert row_counts() == counts
    assert Workspace.get_or_none(Workspace.name == data["workspace"]["name"]) is None


def test_every_problem_in_a_file_is_reported_at_once(app):
    with pytest.raises(SetupError) as failure:
        parse_setup({"workspace": {"name": "", "timezone": "Nowhere/Land"},
                     "members": [{"name": "A", "email": "not-an-email", "role": "agent"}]})
    keys = {line.split(":")[0] for line in failure.value.problems}
    assert {"workspace.name", "workspace.timezone", "members[0].email"} <= keys


def test_a_missing_file_is_a_clear_error(run_cli, tmp_path):
    result = run_cli("setup", str(tmp_path / "nope.toml"))
    assert result.exit_code != 0 and "nope.toml: no such file" in result.stderr
