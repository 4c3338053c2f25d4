"""Attribution (DESIGN section 19): where each lead came from, as API creates, batches, web forms,
CSV imports and connectors record it; the list's filter[channel], the conversion report's
breakdowns by channel and campaign, the export's columns, first touch, and erasure."""

from __future__ import annotations

import csv
import io
from html.parser import HTMLParser

import pytest

from conftest import FORM_ORIGIN, ROLE_EMAILS, new_phone, plan, with_form
from leadsvc import bulk_load, pipeline
from leadsvc.auth import Caller
from leadsvc.csv_import import import_csv
from leadsvc.db import is_postgres
from leadsvc.history import Actor
from leadsvc.models import Activity, AuditEntry, Connector, Lead, Token, Transition, Workspace
from leadsvc.refs import cached_refs
from leadsvc.reports import conversion_groups

CAMPAIGN = {"utm_source": "google", "utm_medium": "cpc", "utm_campaign": "diwali"}
NO_ATTRIBUTION = {"channel": "api", "connector": None}


@pytest.fixture
def tenant(make_workspace):
    """A workspace with a web form (conftest.with_form)."""
    return make_workspace(with_form)


def create(client, tenant, expect=201, **fields):
    body = {"first_name": "Asha", "phone": new_phone(), **fields}
    response = client.post("/api/v1/leads", json=body, headers=tenant.headers())
    assert response.status_code == expect, response.json
    return response.json


def read(client, tenant, lead_id, email="admin@t.test"):
    response = client.get(f"/api/v1/leads/{lead_id}", headers=tenant.headers(email))
    assert response.status_code == 200, response.json
    return response.json["data"]


def listed(client, tenant, query, email="admin@t.test"):
    response = client.get(f"/api/v1/leads?{query}", headers=tenant.headers(email))
    assert response.status_code == 200, response.json
    return {lead["id"] for lead in response.json["data"]}


def row(lead_id) -> Lead:
    return Lead.get(Lead.public_id == lead_id)


def leads_count(tenant) -> int:
    return Lead.select().join(Workspace).where(Workspace.public_id == tenant.public_id).count()


def move(client, tenant, lead_id, *statuses):
    for status in statuses:
        response = client.post(f"/api/v1/leads/{lead_id}/status", json={"status": tenant.ids.statuses[status]},
                               headers=tenant.headers())
        assert response.status_code == 200, response.json


WON = ("Contacted", "Qualified", "Proposal", "Won")


def submit_form(client, tenant, fields):
    """A form-encoded submission of the tenant's web form, as its page posts it."""
    form_id = tenant.ids.forms["Website enquiry"]
    return client.post(f"/api/v1/forms/{form_id}/submissions", data=fields, headers={"Origin": FORM_ORIGIN})


def imported(client, tenant, header, *rows):
    """Import a CSV file into the tenant's workspace; the import's report."""
    stream = io.StringIO()
    writer = csv.writer(stream)
    writer.writerow(header)
    writer.writerows(rows)
    stream.seek(0)
    workspace = Workspace.get(Workspace.public_id == tenant.public_id)
    return import_csv(stream, workspace, client.application.config["LEADSVC"])


def connector_lead(app, tenant, attribution, kind="google_ads", name="Google Ads - Villas"):
    """A lead created as a connector creates it (the connector engineer's path): its connector as the
    actor, the sender's attribution in the data. Returns the lead's public id and the connector."""
    workspace = Workspace.get(Workspace.public_id == tenant.public_id)
    connector = Connector.create(workspace=workspace, name=name, kind=kind, key_salt="salt")
    workspace = Workspace.get_by_id(workspace.id)   # its refs_version moved with the new connector
    with app.test_request_context():
        refs = cached_refs(workspace, app.config["LEADSVC"])
        created = pipeline.create_lead({"first_name": "Gita", "phone": new_phone(), "attribution": attribution},
                                       Actor(workspace=workspace, connector=connector), refs)
    return created.lead.public_id, connector


class HiddenInputs(HTMLParser):
    """The name and value of each hidden input of a page."""

    def __init__(self, html: str):
        super().__init__()
        self.found: dict[str, str] = {}
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "input" and attrs.get("type") == "hidden":
            self.found[attrs["name"]] = attrs["value"]


# --- API creates ----------------------------------------------------------------------------

def test_a_create_with_attribution_shows_it_after_the_channel_and_connector(client, tenant):
    sent = {"utm_content": "banner", "gclid": "Cj0KCQ", "utm_term": "", "utm_source": " google ",
            "utm_campaign": "diwali", "ad_id": None}
    created = create(client, tenant, attribution=sent)["data"]
    expected = {"channel": "api", "connector": None, "gclid": "Cj0KCQ", "utm_source": "google",
                "utm_campaign": "diwali", "utm_content": "banner"}
    assert created["attribution"] == expected
    assert list(created["attribution"]) == list(expected), "the documented order, whatever order was sent"
    assert read(client, tenant, created["id"])["attribution"] == expected
    assert row(created["id"]).campaign == "diwali"


def test_the_campaign_is_the_campaign_id_else_the_utm_campaign(client, tenant):
    both = create(client, tenant, attribution={"campaign_id": "2231", "utm_campaign": "diwali"})["data"]
    utm = create(client, tenant, attribution={"utm_source": "google", "utm_campaign": "diwali"})["data"]
    neither = create(client, tenant, attribution={"utm_source": "google"})["data"]
    assert [row(lead["id"]).campaign for lead in (both, utm, neither)] == ["2231", "diwali", None]


def test_a_lead_without_attribution_shows_its_channel_and_no_connector(client, tenant):
    lead = create(client, tenant)["data"]
    assert lead["attribution"] == NO_ATTRIBUTION
    assert row(lead["id"]).attribution is None


def test_the_creation_records_the_channel_and_attribution_in_its_audit_entry_and_activity(client, tenant):
    lead = row(create(client, tenant, attribution=CAMPAIGN)["data"]["id"])
    changes = AuditEntry.get((AuditEntry.lead == lead.id) & (AuditEntry.action == "created")).changes
    assert changes["channel"] == {"old": None, "new": "api"}
    assert changes["attribution"] == {"old": None, "new": CAMPAIGN}
    assert "connector" not in changes
    assert Activity.get((Activity.lead == lead.id) & (Activity.kind == "created")).data == {"via": "api"}


@pytest.mark.parametrize("attribution, field", [
    ({"utm_sorce": "google"}, "attribution.utm_sorce"),
    ({"channel": "meta"}, "attribution.channel"),
    ({"connector": "conn_0000000000000000"}, "attribution.connector"),
    ({"external_id": "L-1"}, "attribution.external_id"),
    ({"utm_campaign": "x" * 201}, "attribution.utm_campaign"),
    ({"gclid": 7}, "attribution.gclid"),
    ("google", "attribution"),
])
def test_attribution_that_is_not_the_callers_to_send_is_422_naming_the_key(client, tenant, attribution, field):
    before = leads_count(tenant)
    response = create(client, tenant, expect=422, attribution=attribution)
    assert response["code"] == "validation_failed" and list(response["errors"]) == [field]
    assert leads_count(tenant) == before


def test_a_utm_value_of_200_characters_is_taken(client, tenant):
    lead = create(client, tenant, attribution={"utm_term": "t" * 200})["data"]
    assert lead["attribution"]["utm_term"] == "t" * 200


def test_patch_never_changes_the_attribution(client, tenant):
    lead = create(client, tenant, attribution=CAMPAIGN)["data"]
    response = client.patch(f"/api/v1/leads/{lead['id']}", json={"first_name": "Ravi", "attribution": {}},
                            headers=tenant.headers())
    assert response.status_code == 422 and list(response.json["errors"]) == ["attribution"]
    after = read(client, tenant, lead["id"])
    assert (after["contact"]["first_name"], after["attribution"]) == ("Asha", lead["attribution"])


def test_batch_items_carry_their_own_attribution_and_fail_alone(client, tenant):
    items = [{"first_name": "One", "phone": new_phone(), "attribution": CAMPAIGN},
             {"first_name": "Two", "phone": new_phone(), "attribution": {"channel": "form"}},
             {"first_name": "Three", "phone": new_phone()}]
    response = client.post("/api/v1/leads/batch", json={"leads": items}, headers=tenant.headers())
    assert response.status_code == 200
    results = response.json["data"]
    assert [result["status"] for result in results] == [201, 422, 201]
    assert results[0]["lead"]["attribution"] == {**NO_ATTRIBUTION, **CAMPAIGN}
    assert list(results[1]["errors"]) == ["attribution.channel"]
    assert results[2]["lead"]["attribution"] == NO_ATTRIBUTION


@pytest.mark.parametrize("on_duplicate", ["ignore", "update"])
def test_a_duplicate_keeps_the_first_touch_and_records_the_attribution_sent(client, tenant, on_duplicate):
    phone = new_phone()
    first = create(client, tenant, phone=phone, attribution=CAMPAIGN)["data"]
    again = {"utm_source": "facebook", "utm_campaign": "monsoon", "fbclid": "IwAR"}
    response = create(client, tenant, expect=200, phone=phone, first_name="Ravi", attribution=again,
                      on_duplicate=on_duplicate)
    assert response["duplicate"] is True and response["data"]["attribution"] == first["attribution"]
    assert row(first["id"]).campaign == "diwali"
    submission = Activity.get((Activity.lead == row(first["id"]).id) & (Activity.kind == "duplicate_submission"))
    assert submission.data["submitted"]["attribution"] == again
    assert response["data"]["contact"]["first_name"] == ("Ravi" if on_duplicate == "update" else "Asha")


# --- connectors -----------------------------------------------------------------------------

def test_a_connector_lead_shows_its_connector_and_its_kind_as_channel(app, client, tenant):
    lead_id, connector = connector_lead(app, tenant, {"external_id": "TeSt_Lead_1", "campaign_id": "987",
                                                       "gclid": "EAIaIQ"})
    document = read(client, tenant, lead_id)
    assert document["attribution"] == {"channel": "google_ads",
                                       "connector": {"id": connector.public_id, "name": "Google Ads - Villas"},
                                       "external_id": "TeSt_Lead_1", "campaign_id": "987", "gclid": "EAIaIQ"}
    lead = row(lead_id)
    assert lead.campaign == "987"
    assert Transition.get(Transition.lead == lead.id).actor_connector_id == connector.id
    assert Activity.get((Activity.lead == lead.id) & (Activity.kind == "created")).data == {"via": "google_ads"}


def test_a_renamed_connector_is_named_anew_in_lead_documents(app, client, tenant):
    lead_id, connector = connector_lead(app, tenant, {"external_id": "L-2"}, kind="meta", name="Meta - Villas")
    assert read(client, tenant, lead_id)["attribution"]["connector"]["name"] == "Meta - Villas"
    Connector.update(name="Meta - Plots").where(Connector.id == connector.id).execute()
    assert read(client, tenant, lead_id)["attribution"]["connector"] == {"id": connector.public_id,
                                                                          "name": "Meta - Plots"}
    page = client.get("/api/v1/leads?filter[channel]=meta", headers=tenant.headers()).json["data"]
    assert [lead["attribution"]["connector"]["name"] for lead in page] == ["Meta - Plots"]


def test_a_connectors_health_does_not_reload_the_reference_data(app, tenant):
    _, connector = connector_lead(app, tenant, {"external_id": "L-3"})
    version = Workspace.get(Workspace.public_id == tenant.public_id).refs_version
    Connector.update(last_error="401 from the sender").where(Connector.id == connector.id).execute()
    assert Workspace.get(Workspace.public_id == tenant.public_id).refs_version == version


# --- web forms ------------------------------------------------------------------------------

def test_a_form_page_carries_its_own_utm_and_click_ids_into_the_submission(client, tenant):
    form_id = tenant.ids.forms["Website enquiry"]
    query = {"utm_source": "google", "utm_medium": "cpc", "utm_campaign": 'diwali"><script>x</script>',
             "utm_term": "", "utm_content": "a\x00b", "gclid": "Cj0KCQ", "fbclid": "f" * 201, "campaign_id": "2231",
             "ref": "home"}
    page = client.get(f"/forms/{form_id}", query_string=query)
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    assert "<script" not in html
    hidden = HiddenInputs(html).found
    # Only utm_* and the click ids, and none that a submission would refuse: a visitor cannot mend them.
    assert hidden == {"attribution.utm_source": "google", "attribution.utm_medium": "cpc",
                      "attribution.utm_campaign": 'diwali"><script>x</script>', "attribution.gclid": "Cj0KCQ"}

    phone = new_phone()
    response = submit_form(client, tenant, {"first_name": "Meera", "phone": phone, **hidden})
    assert response.status_code == 200 and response.mimetype == "text/html"
    lead = Lead.get(Lead.phone == phone)
    assert (lead.channel, lead.connector_id, lead.campaign) == ("form", None, 'diwali"><script>x</script>')
    assert read(client, tenant, lead.public_id)["attribution"] == {
        "channel": "form", "connector": None, "gclid": "Cj0KCQ", "utm_source": "google", "utm_medium": "cpc",
        "utm_campaign": 'diwali"><script>x</script>'}


def test_a_form_shown_again_with_its_errors_keeps_the_attribution(client, tenant):
    response = submit_form(client, tenant, {"first_name": "Meera", "phone": "12345",
                                            "attribution.utm_source": "google", "attribution.gclid": "Cj0KCQ"})
    assert response.status_code == 422 and response.mimetype == "text/html"
    assert HiddenInputs(response.get_data(as_text=True)).found == {"attribution.utm_source": "google",
                                                                    "attribution.gclid": "Cj0KCQ"}


def test_a_json_form_submission_takes_attribution_and_refuses_the_channel(client, tenant):
    form_id = tenant.ids.forms["Website enquiry"]
    phone = new_phone()
    url = f"/api/v1/forms/{form_id}/submissions"
    refused = client.post(url, json={"phone": phone, "attribution": {"channel": "api"}}, headers={"Origin": FORM_ORIGIN})
    assert refused.status_code == 422 and list(refused.json["errors"]) == ["attribution.channel"]
    taken = client.post(url, json={"phone": phone, "attribution": {"fbclid": "IwAR", "utm_source": "facebook"}},
                        headers={"Origin": FORM_ORIGIN})
    assert taken.status_code == 201
    lead = Lead.get(Lead.phone == phone)
    assert (lead.channel, lead.attribution) == ("form", {"fbclid": "IwAR", "utm_source": "facebook"})


# --- CSV import and export ------------------------------------------------------------------

def test_an_import_takes_attribution_columns_and_its_leads_channel_is_import(client, tenant):
    phone, bad = new_phone(), new_phone()
    report = imported(client, tenant, ["first_name", "phone", "attribution.utm_source", "attribution.campaign_id"],
                      ["Kabir", phone, "justdial-sheet", "summer"], ["Zoya", bad, "x" * 201, ""])
    assert report.created == 1
    assert report.errors == [{"row": 3, "field": "attribution.utm_source", "message": report.errors[0]["message"]}]
    lead = Lead.get(Lead.phone == phone)
    assert (lead.channel, lead.campaign) == ("import", "summer")
    assert read(client, tenant, lead.public_id)["attribution"] == {
        "channel": "import", "connector": None, "campaign_id": "summer", "utm_source": "justdial-sheet"}
    assert not Lead.select().where(Lead.phone == bad).exists()


def test_export_adds_the_attribution_columns_defused_and_an_export_imports_as_it_is(app, client, tenant,
                                                                                    make_workspace):
    api = create(client, tenant, attribution={"utm_source": "=HYPERLINK(\"http://evil.test\")", "gclid": "Cj0"})
    lead_id, _ = connector_lead(app, tenant, {"external_id": "L-9", "campaign_id": "987"}, name="@Ads")
    response = client.get("/api/v1/leads/export.csv", headers=tenant.headers())
    assert response.status_code == 200
    text = response.get_data(as_text=True)
    header = next(csv.reader(io.StringIO(text)))
    attribution_columns = ["attribution.channel", "attribution.connector", "attribution.external_id",
                           "attribution.campaign_id", "attribution.adgroup_id", "attribution.ad_id",
                           "attribution.form_id", "attribution.gclid", "attribution.fbclid", "attribution.utm_source",
                           "attribution.utm_medium", "attribution.utm_campaign", "attribution.utm_term",
                           "attribution.utm_content"]
    at = header.index("next_task_due_at") + 1
    assert header[at:at + len(attribution_columns)] == attribution_columns
    rows = {r["id"]: r for r in csv.DictReader(io.StringIO(text))}
    assert rows[api["data"]["id"]]["attribution.utm_source"] == "'=HYPERLINK(\"http://evil.test\")"
    assert rows[api["data"]["id"]]["attribution.channel"] == "api"
    assert rows[lead_id]["attribution.connector"] == "'@Ads"
    assert (rows[lead_id]["attribution.channel"], rows[lead_id]["attribution.external_id"],
            rows[lead_id]["attribution.campaign_id"]) == ("google_ads", "L-9", "987")

    elsewhere = make_workspace()
    report = imported(client, elsewhere, header, *csv.reader(io.StringIO(text.split("\r\n", 1)[1])))
    assert (report.created, report.errors) == (2, [])
    workspace_id = elsewhere.member("admin@t.test").workspace_id
    copy = Lead.get((Lead.phone == api["data"]["contact"]["phone"]) & (Lead.workspace == workspace_id))
    assert (copy.channel, copy.attribution) == ("import", {"gclid": "Cj0", "utm_source": '=HYPERLINK("http://evil.test")'})
    # The sender's id stays with the connector's lead: an import is not that sender.
    assert "external_id" not in Lead.get((Lead.phone != api["data"]["contact"]["phone"])
                                         & (Lead.workspace == workspace_id)).attribution


# --- the list -------------------------------------------------------------------------------

def test_filter_channel_takes_one_or_several_channels_within_the_scope(client, tenant):
    api = create(client, tenant)["data"]["id"]
    phone = new_phone()
    assert submit_form(client, tenant, {"first_name": "Meera", "phone": phone}).status_code == 200
    form = Lead.get(Lead.phone == phone).public_id
    imported_phone = new_phone()
    assert imported(client, tenant, ["first_name", "phone"], ["Kabir", imported_phone]).created == 1
    by_import = Lead.get(Lead.phone == imported_phone).public_id
    for lead_id, owner in ((api, "n1@t.test"), (form, "n1@t.test"), (by_import, "s1@t.test")):
        moved = client.patch(f"/api/v1/leads/{lead_id}", json={"owner": tenant.ids.members[owner]},
                             headers=tenant.headers())
        assert moved.status_code == 200

    assert listed(client, tenant, "filter[channel]=form") == {form}
    assert listed(client, tenant, "filter[channel]=form,%20import") == {form, by_import}
    assert listed(client, tenant, "filter[channel]=meta") == set()
    # The North manager never sees the South agent's import, whatever the filter says.
    assert listed(client, tenant, "filter[channel]=import,form", ROLE_EMAILS["manager"]) == {form}
    assert listed(client, tenant, "filter[channel]=api", ROLE_EMAILS["agent"]) == {api}


@pytest.mark.parametrize("value", ["fax", "api,", "API", ""])
def test_an_unknown_channel_is_422_naming_the_filter(client, tenant, value):
    response = client.get("/api/v1/leads", query_string={"filter[channel]": value}, headers=tenant.headers())
    assert response.status_code == 422 and list(response.json["errors"]) == ["filter[channel]"]


# --- the conversion report ------------------------------------------------------------------

def tally(leads, open_, won, lost, won_rate):
    return {"leads": leads, "open": open_, "won": won, "lost": lost, "won_rate": won_rate}


def test_conversion_by_channel_and_by_campaign_against_a_known_set(client, tenant):
    """API: A (diwali, won), B (campaign id 2231 and utm diwali: 2231, lost), C (diwali, open),
    D (none, won); form: E (diwali, won); import: F (none, open). North owns A, B, E; South the rest."""
    leads = {}
    leads["A"] = create(client, tenant, attribution=CAMPAIGN)["data"]["id"]
    leads["B"] = create(client, tenant, attribution={"campaign_id": "2231", **CAMPAIGN})["data"]["id"]
    leads["C"] = create(client, tenant, attribution=CAMPAIGN)["data"]["id"]
    leads["D"] = create(client, tenant)["data"]["id"]
    phone = new_phone()
    assert submit_form(client, tenant, {"phone": phone, "attribution.utm_campaign": "diwali"}).status_code == 200
    leads["E"] = Lead.get(Lead.phone == phone).public_id
    phone = new_phone()
    assert imported(client, tenant, ["phone"], [phone]).created == 1
    leads["F"] = Lead.get(Lead.phone == phone).public_id
    for name, lead_id in leads.items():
        owner = "n1@t.test" if name in "ABE" else "s1@t.test"
        assert client.patch(f"/api/v1/leads/{lead_id}", json={"owner": tenant.ids.members[owner]},
                            headers=tenant.headers()).status_code == 200
    for name in "ADE":
        move(client, tenant, leads[name], *WON)
    move(client, tenant, leads["B"], "Lost")

    data = client.get("/api/v1/reports/conversion", headers=tenant.headers()).json["data"]
    assert data["by_channel"] == [{"channel": "api", **tally(4, 1, 2, 1, 0.6667)},
                                  {"channel": "form", **tally(1, 0, 1, 0, 1.0)},
                                  {"channel": "import", **tally(1, 1, 0, 0, None)}]
    assert data["by_campaign"] == [{"campaign": "2231", **tally(1, 0, 0, 1, 0.0)},
                                   {"campaign": "diwali", **tally(3, 1, 2, 0, 1.0)},
                                   {"campaign": None, **tally(2, 1, 1, 0, 1.0)}]
    assert sum(item["leads"] for item in data["by_channel"]) == data["overall"]["leads"] == 6

    north = client.get("/api/v1/reports/conversion", headers=tenant.headers(ROLE_EMAILS["manager"])).json["data"]
    assert north["by_channel"] == [{"channel": "api", **tally(2, 0, 1, 1, 0.5)},
                                   {"channel": "form", **tally(1, 0, 1, 0, 1.0)}]
    assert north["by_campaign"] == [{"campaign": "2231", **tally(1, 0, 0, 1, 0.0)},
                                    {"campaign": "diwali", **tally(2, 0, 2, 0, 1.0)}]
    south = client.get("/api/v1/reports/conversion", query_string={"filter[owner]": tenant.ids.members["s1@t.test"]},
                       headers=tenant.headers()).json["data"]
    assert [item["channel"] for item in south["by_channel"]] == ["api", "import"]


def test_conversion_of_a_whole_workspace_groups_in_the_order_of_the_report_index(client, ws):
    # A few thousand synthetic leads, with their channel mix and campaigns, and the statistics a
    # bulk load leaves: every breakdown comes from one pass over the report index, in its order.
    workspace = Workspace.get(Workspace.public_id == ws.public_id)
    bulk_load.add_leads(workspace, 3000, seed=11)
    data = client.get("/api/v1/reports/conversion", headers=ws.headers()).json["data"]
    assert {item["channel"] for item in data["by_channel"]} == {"api", "form", "import"}
    admin = ws.member("admin@t.test")
    refs = cached_refs(Workspace.get_by_id(workspace.id), client.application.config["LEADSVC"])
    text = plan(*conversion_groups(Caller(Token(), admin, admin.workspace, frozenset()), {}, refs).sql())
    assert "lead_workspace_id_status_id_source_id_owner_id_channel_c" in text, text
    if is_postgres():
        assert '"Index Only Scan"' in text and '"Seq Scan"' not in text and '"Sort"' not in text, text
    else:
        assert "COVERING INDEX" in text and "TEMP B-TREE" not in text, text


def test_another_workspace_counts_none_of_these_channels(client, tenant, other_ws):
    create(client, tenant, attribution=CAMPAIGN)
    data = client.get("/api/v1/reports/conversion", headers=other_ws.headers()).json["data"]
    assert (data["by_channel"], data["by_campaign"]) == ([], [])


# --- erasure --------------------------------------------------------------------------------

def test_erasure_drops_the_click_ids_and_keeps_what_reports_group_by(client, tenant):
    sent = {"campaign_id": "2231", "gclid": "Cj0KCQ", "fbclid": "IwAR", "utm_source": "google"}
    lead = create(client, tenant, attribution=sent)["data"]
    before = client.get("/api/v1/reports/conversion", headers=tenant.headers()).json["data"]
    response = client.post(f"/api/v1/leads/{lead['id']}/erase", json={"reason": "Asked to be forgotten"},
                           headers=tenant.headers())
    assert response.status_code == 200
    assert response.json["data"]["attribution"] == {"channel": "api", "connector": None, "campaign_id": "2231",
                                                    "utm_source": "google"}
    created = AuditEntry.get((AuditEntry.lead == row(lead["id"]).id) & (AuditEntry.action == "created"))
    assert created.changes["attribution"]["new"] == {"campaign_id": "2231", "gclid": "[erased]", "fbclid": "[erased]",
                                                     "utm_source": "google"}
    after = client.get("/api/v1/reports/conversion", headers=tenant.headers()).json["data"]
    assert (after["by_channel"], after["by_campaign"]) == (before["by_channel"], before["by_campaign"])
