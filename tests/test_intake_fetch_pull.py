"""Meta's leads fetched from the Graph API by the deliverer, and IndiaMART's CRM listing pulled on
the clock (DESIGN section 19): against fake Graph and IndiaMART APIs, real HTTP servers on
127.0.0.1 that answer as the senders' documentation shows, on the test's clock."""

from __future__ import annotations

import json
import threading
from datetime import datetime, timedelta

import pytest

from conftest import (INDIAMART_CRM_KEY, INDIAMART_CRM_KEY_ENV, META_PAGE_TOKEN, META_PAGE_TOKEN_ENV,
                      intake_fixture, json_answer, register_webhook, with_connectors)
from leadsvc import intake
from leadsvc.clock import Clock
from leadsvc.delivery import SCHEDULE, Deliverer
from leadsvc.intake import pull
from leadsvc.intake.fetch import GRAPH_FIELDS, KEPT_ANSWER
from leadsvc.models import Connector, Delivery, Intake, Lead, Note, Timer
from receiver import RawReceiver

LEADGEN_ID = "1100000000000001"   # the fixture lead's


def with_pulling_connector(data):
    """with_connectors, and an IndiaMART connector that names its CRM key, so the clock pulls it."""
    with_connectors(data)
    data["connectors"].append({"name": "IndiaMART pull", "kind": "indiamart", "source": "Referral",
                               "crm_key_env": INDIAMART_CRM_KEY_ENV})


@pytest.fixture
def cws(make_workspace):
    return make_workspace(with_pulling_connector)


def connector(tenant, name) -> Connector:
    return Connector.get(Connector.public_id == tenant.ids.connectors[name]["id"])


def reload(row):
    return type(row).get_by_id(row.id)


def settings_with(app, **sections) -> dict:
    """The app's settings with some sections' keys changed (the fakes' URLs, a short timeout)."""
    settings = dict(app.config["LEADSVC"])
    for section, values in sections.items():
        settings[section] = {**settings[section], **values}
    return settings


# --- Meta: the fetch -----------------------------------------------------------------------------

@pytest.fixture
def fetcher(app, clock, graph_api, monkeypatch):
    """A deliverer on the test's clock (no jitter) whose Graph API is the fake; the page token set."""
    monkeypatch.setenv(META_PAGE_TOKEN_ENV, META_PAGE_TOKEN)
    # The run's tests share a database: what earlier tests left scheduled (fetches, and webhook
    # deliveries, which the same claims take) is not this test's.
    Intake.update(next_attempt_at=None).where(Intake.next_attempt_at.is_null(False)).execute()
    Delivery.update(next_attempt_at=None).where(Delivery.next_attempt_at.is_null(False)).execute()

    def build(graph_url: str | None = None, **webhooks) -> Deliverer:
        settings = settings_with(app, connectors={"meta_graph_url": graph_url or graph_api.url}, webhooks=webhooks)
        return Deliverer(settings, version="test", clock=clock, rng=lambda: 0.5)
    return build


def queued(tenant, leadgen_id=LEADGEN_ID) -> Intake:
    """A pending intake, as a signed notification naming this lead stores it."""
    change = intake_fixture("meta_notification")["entry"][0]["changes"][0]
    return intake.queue(connector(tenant, "Meta lead ads"), leadgen_id, change)


def test_a_queued_meta_lead_is_fetched_with_the_page_token_and_created(cws, fetcher, graph_api):
    graph_api.leads[LEADGEN_ID] = intake_fixture("meta_lead")
    row = queued(cws)
    assert fetcher().deliver_due() == 1
    row = reload(row)
    assert row.outcome == "created" and row.next_attempt_at is None and row.last_error is None
    lead = Lead.get_by_id(row.lead_id)
    assert (lead.first_name, lead.last_name, lead.phone) == ("Meera", "Iyer", "+919812345678")
    assert lead.custom_fields["product_interest"] == "3bhk", "a custom question maps as the connector says"
    assert lead.channel == "meta" and lead.campaign == "120200000000000003"
    assert lead.attribution == {"external_id": LEADGEN_ID, "campaign_id": "120200000000000003",
                                "adgroup_id": "120200000000000002", "ad_id": "120200000000000001",
                                "form_id": "830000000000001"}, "ad, ad set, campaign and form ids from the answer"
    [request] = graph_api.requests()
    assert request.path == (f"/v21.0/{LEADGEN_ID}?fields={GRAPH_FIELDS.replace(',', '%2C')}"
                            f"&access_token={META_PAGE_TOKEN}")
    assert row.payload["field_data"], "the intake keeps the lead as the Graph API answered it"


def test_a_fetch_that_fails_is_retried_on_the_schedule_and_shown_on_intake_and_connector(cws, fetcher, graph_api,
                                                                                          clock):
    graph_api.leads[LEADGEN_ID] = intake_fixture("meta_lead")
    graph_api.answers = [json_answer(500, {"error": {"message": "An unknown error occurred", "code": 1}})] * 2
    row = queued(cws)
    deliverer = fetcher()
    assert deliverer.deliver_due() == 1
    row = reload(row)
    assert row.outcome == "pending" and row.failures == 1 and row.attempts == 1
    assert row.next_attempt_at == clock.now + timedelta(seconds=SCHEDULE[0])
    assert "HTTP 500: An unknown error occurred" in row.last_error
    assert "HTTP 500" in connector(cws, "Meta lead ads").last_error
    clock.advance(seconds=SCHEDULE[0] - 1)
    assert deliverer.deliver_due() == 0, "not before it is due"
    clock.advance(seconds=1)
    assert deliverer.deliver_due() == 1 and reload(row).next_attempt_at == clock.now + timedelta(seconds=SCHEDULE[1])
    clock.advance(seconds=SCHEDULE[1])
    assert deliverer.deliver_due() == 1
    row = reload(row)
    assert row.outcome == "created" and row.attempts == 3 and row.last_error is None
    assert connector(cws, "Meta lead ads").last_error is None, "a fetch that works clears the connector's error"


def test_a_bad_page_token_is_recorded_on_the_connector_and_retried(cws, fetcher, graph_api, monkeypatch):
    graph_api.leads[LEADGEN_ID] = intake_fixture("meta_lead")
    monkeypatch.setenv(META_PAGE_TOKEN_ENV, "EAAnot-the-page-token")
    row = queued(cws)
    fetcher().deliver_due()
    assert "HTTP 400: Invalid OAuth access token" in connector(cws, "Meta lead ads").last_error
    row = reload(row)
    assert row.outcome == "pending" and row.next_attempt_at is not None
    assert "EAAnot-the-page-token" not in row.last_error, "the token is never shown"


def test_a_page_token_not_set_is_named_on_the_connector(cws, fetcher, graph_api, monkeypatch):
    monkeypatch.delenv(META_PAGE_TOKEN_ENV)
    row = queued(cws)
    fetcher().deliver_due()
    assert META_PAGE_TOKEN_ENV in connector(cws, "Meta lead ads").last_error
    assert reload(row).outcome == "pending" and graph_api.requests() == []


@pytest.mark.parametrize("answer, error", [
    ((200, {"Content-Type": "text/html"}, b"<html>Sorry, something went wrong.</html>"), "not JSON"),
    ((200, {"Content-Type": "application/json"}, b"[" + b"0," * (KEPT_ANSWER // 2) + b"0]"), "longer than"),
    ((200, {"Content-Type": "application/json"}, json.dumps({"id": LEADGEN_ID}).encode()), "no field_data"),
], ids=["not-json", "huge", "no-field-data"])
def test_an_answer_that_is_not_a_lead_is_retried_and_creates_nothing(cws, fetcher, graph_api, answer, error):
    graph_api.answers = [answer]
    row = queued(cws)
    fetcher().deliver_due()
    row = reload(row)
    assert row.outcome == "pending" and row.failures == 1 and error in row.last_error and row.lead_id is None


def test_a_graph_api_that_answers_too_slowly_is_cut_at_the_timeout_and_retried(cws, fetcher):
    release = threading.Event()
    with RawReceiver(lambda sock: release.wait(10)) as silent:
        row = queued(cws)
        deliverer = fetcher(silent.url.rsplit("/hook", 1)[0], timeout=1)
        try:
            deliverer.deliver_due()
        finally:
            release.set()
    row = reload(row)
    assert row.outcome == "pending" and row.failures == 1 and "within 1 s" in row.last_error


def test_a_fetch_given_up_is_rejected_and_kept_and_a_retry_fetches_it_again(client, cws, fetcher, graph_api, clock):
    graph_api.answers = [json_answer(503, {"error": {"message": "Service temporarily unavailable"}})] * len(SCHEDULE + (0,))
    row = queued(cws)
    deliverer = fetcher()
    for delay in (*SCHEDULE, 0):
        assert deliverer.deliver_due() == 1
        clock.advance(seconds=delay)
    row = reload(row)
    assert row.outcome == "rejected" and row.next_attempt_at is None and row.attempts == len(SCHEDULE) + 1
    assert "Service temporarily unavailable" in row.errors["leadgen_id"][0]
    assert row.payload["value"]["leadgen_id"] == LEADGEN_ID, "the notification's change is kept"
    graph_api.leads[LEADGEN_ID] = intake_fixture("meta_lead")
    conn = cws.ids.connectors["Meta lead ads"]
    retried = client.post(f"/api/v1/connectors/{conn['id']}/intakes/{row.public_id}/retry", headers=cws.headers())
    assert retried.status_code == 200 and retried.json["data"]["outcome"] == "pending"
    assert deliverer.deliver_due() == 1 and reload(row).outcome == "created"


def test_a_claimed_fetch_is_not_claimed_by_another_deliverer(cws, fetcher, graph_api):
    graph_api.leads[LEADGEN_ID] = intake_fixture("meta_lead")
    row = queued(cws)
    first, second = fetcher(), fetcher()
    [claimed] = first.claim(8)
    assert second.claim(8) == [], "leased to the first"
    first.attempt(claimed)
    assert reload(row).outcome == "created" and len(graph_api.requests()) == 1


def test_webhook_deliveries_and_fetches_share_one_claim(client, cws, fetcher, graph_api, receiver):
    Delivery.update(next_attempt_at=None).execute()
    graph_api.leads[LEADGEN_ID] = intake_fixture("meta_lead")
    hook = register_webhook(client, cws, receiver.url, ["webhook.test"])
    client.post(f"/api/v1/webhooks/{hook['id']}/test", headers=cws.headers())
    row = queued(cws)
    deliverer = fetcher()
    claimed = deliverer.claim(8)
    assert sorted(type(item.kind).__name__ for item in claimed) == ["GraphFetches", "WebhookDeliveries"]
    for item in claimed:
        deliverer.attempt(item)
    assert reload(row).outcome == "created" and receiver.of_type("webhook.test")


# --- IndiaMART: the pull -------------------------------------------------------------------------

NOW = datetime(2026, 11, 26, 3, 30)   # 09:00 in IST


@pytest.fixture
def puller(app, indiamart_api, monkeypatch, cws):
    """A clock whose IndiaMART is the fake, with the CRM key set; only this test's pull is armed."""
    monkeypatch.setenv(INDIAMART_CRM_KEY_ENV, INDIAMART_CRM_KEY)
    mine = connector(cws, "IndiaMART pull")
    # The run's tests share a database: what earlier tests left armed is not this test's.
    Timer.delete().where((Timer.kind != pull.PULL) | (Timer.subject != mine.id)).execute()
    Timer.update(fire_at=NOW, due_at=NOW).execute()
    settings = settings_with(app, connectors={"indiamart_url": indiamart_api.url, "indiamart_interval": 300})
    return Clock(settings)


def pull_timer(tenant) -> Timer | None:
    return Timer.get_or_none((Timer.kind == pull.PULL) & (Timer.subject == connector(tenant, "IndiaMART pull").id))


def pulled(tenant) -> list[Intake]:
    return list(Intake.select().where(Intake.connector == connector(tenant, "IndiaMART pull").id).order_by(Intake.id))


def test_times_are_written_as_indiamart_writes_them_in_ist():
    assert pull.indiamart_time(datetime(2026, 11, 26, 3, 30)) == "26-Nov-202609:00:00"
    assert pull.indiamart_time(datetime(2026, 12, 31, 20, 15, 5)) == "01-Jan-202701:45:05"


def test_setup_arms_a_pull_only_for_a_connector_that_names_its_crm_key(cws):
    assert pull_timer(cws) is not None
    push_only = connector(cws, "IndiaMART")
    assert Timer.get_or_none((Timer.kind == pull.PULL) & (Timer.subject == push_only.id)) is None


def test_the_first_pull_asks_for_the_last_day_and_takes_each_record_with_its_message_as_a_note(cws, puller,
                                                                                           indiamart_api):
    indiamart_api.answers = [json_answer(200, intake_fixture("indiamart_listing"))]
    assert puller.tick(NOW) == 1
    [query] = indiamart_api.queries()
    assert query == {"glusr_crm_key": [INDIAMART_CRM_KEY], "start_time": ["25-Nov-202609:00:00"],
                     "end_time": ["26-Nov-202609:00:00"]}
    rows = pulled(cws)
    assert [(row.external_id, row.outcome) for row in rows] == [("2790000101", "created"), ("2790000102", "created")]
    lead = Lead.get_by_id(rows[1].lead_id)
    assert (lead.first_name, lead.last_name, lead.phone) == ("Mamilla Ganga", "Shekhar", "+919100843314")
    assert "Capacitive Proximity Sensors" in Note.get(Note.lead == lead.id).body
    conn = connector(cws, "IndiaMART pull")
    assert conn.pulled_until == NOW and conn.pull_after == NOW + timedelta(seconds=300) and conn.last_error is None
    assert pull_timer(cws).fire_at == conn.pull_after, "armed again at pull_after"


def test_a_record_pulled_again_is_a_no_op_and_the_next_window_starts_where_the_last_ended(cws, puller,
                                                                                         indiamart_api):
    indiamart_api.answers = [json_answer(200, intake_fixture("indiamart_listing"))] * 2
    puller.tick(NOW)
    assert puller.tick(NOW + timedelta(seconds=299)) == 0, "not before the interval"
    later = NOW + timedelta(seconds=300)
    assert puller.tick(later) == 1
    assert indiamart_api.queries()[1]["start_time"] == ["26-Nov-202608:55:00"], "five minutes before the last end"
    assert len(pulled(cws)) == 2 and Lead.select().where(Lead.connector == connector(cws, "IndiaMART pull").id
                                                        ).count() == 2


def test_no_leads_in_the_window_moves_the_window_on(cws, puller, indiamart_api):
    assert puller.tick(NOW) == 1
    conn = connector(cws, "IndiaMART pull")
    assert conn.pulled_until == NOW and conn.last_error is None and pulled(cws) == []


def test_code_429_in_an_http_200_waits_fifteen_minutes_and_keeps_the_window(cws, puller, indiamart_api):
    indiamart_api.answers = [json_answer(200, intake_fixture("indiamart_blocked"))]
    puller.tick(NOW)
    conn = connector(cws, "IndiaMART pull")
    assert conn.pull_after == NOW + timedelta(minutes=15) and conn.pulled_until is None
    assert "CODE 429" in conn.last_error
    assert puller.tick(NOW + timedelta(minutes=10)) == 0 and len(indiamart_api.queries()) == 1
    puller.tick(NOW + timedelta(minutes=15))
    assert indiamart_api.queries()[1]["start_time"] == ["25-Nov-202609:15:00"], "the first window again, a day back"
    assert connector(cws, "IndiaMART pull").last_error is None


def test_a_key_indiamart_does_not_know_is_shown_on_the_connector(cws, puller, indiamart_api, monkeypatch):
    monkeypatch.setenv(INDIAMART_CRM_KEY_ENV, "not-the-key")
    puller.tick(NOW)
    conn = connector(cws, "IndiaMART pull")
    assert "CODE 401" in conn.last_error and INDIAMART_CRM_KEY_ENV in conn.last_error
    assert "not-the-key" not in conn.last_error
    assert conn.pulled_until is None and conn.pull_after == NOW + timedelta(seconds=300)


def test_a_crm_key_not_set_is_named_and_nothing_is_called(cws, puller, indiamart_api, monkeypatch):
    monkeypatch.delenv(INDIAMART_CRM_KEY_ENV)
    puller.tick(NOW)
    assert INDIAMART_CRM_KEY_ENV in connector(cws, "IndiaMART pull").last_error and indiamart_api.queries() == []


@pytest.mark.parametrize("answer, error", [
    ((500, {"Content-Type": "text/html"}, b"<html>Internal Server Error</html>"), "not JSON"),
    ((200, {"Content-Type": "application/json"}, b'{"CODE": 500, "STATUS": "FAILURE", "MESSAGE": "Try later"}'),
     "CODE 500: Try later"),
], ids=["http-500", "code-500"])
def test_any_other_answer_is_an_error_tried_again_next_interval(cws, puller, indiamart_api, answer, error):
    indiamart_api.answers = [answer]
    puller.tick(NOW)
    conn = connector(cws, "IndiaMART pull")
    assert error in conn.last_error and conn.pulled_until is None
    assert pull_timer(cws).fire_at == NOW + timedelta(seconds=300)


def test_a_record_with_a_bad_query_time_is_still_taken_and_kept_as_sent(cws, puller, indiamart_api):
    listing = intake_fixture("indiamart_listing")
    listing["RESPONSE"][0]["QUERY_TIME"] = "31-Feb-2026 25:61:00"
    indiamart_api.answers = [json_answer(200, listing)]
    puller.tick(NOW)
    rows = pulled(cws)
    assert [row.outcome for row in rows] == ["created", "created"]
    assert rows[0].payload["QUERY_TIME"] == "31-Feb-2026 25:61:00"
    assert connector(cws, "IndiaMART pull").pulled_until == NOW


def test_the_window_reaches_back_seven_days_at_most(cws, puller, indiamart_api):
    Connector.update(pulled_until=NOW - timedelta(days=10)).where(
        Connector.id == connector(cws, "IndiaMART pull").id).execute()
    puller.tick(NOW)
    assert indiamart_api.queries()[0]["start_time"] == ["19-Nov-202609:00:00"]


def test_a_pull_holds_no_transaction_while_indiamart_answers(cws, puller, indiamart_api, make_lead):
    # The fake answers only after a lead is created through the API meanwhile: a pull holding the
    # clock's transaction (SQLite's write lock) would keep that create waiting past its timeout.
    created = threading.Event()
    results = []

    def answer_after_a_create(request):
        worker = threading.Thread(target=lambda: results.append(make_lead(cws)))
        worker.start()
        worker.join(20)
        created.set()
        return json_answer(200, intake_fixture("indiamart_no_leads"))

    indiamart_api.receiver.respond = answer_after_a_create
    puller.tick(NOW)
    assert created.is_set() and len(results) == 1
