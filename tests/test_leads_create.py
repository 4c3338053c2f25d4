"""POST /api/v1/leads: validation, normalization, duplicates and what a new lead starts with."""

import re

import pytest

from conftest import lead_body, new_phone, run_import
from leadsvc.models import Activity, AuditEntry, Lead, Transition, Workspace


def lead_count(ws) -> int:
    return Lead.select().join(Workspace).where(Workspace.public_id == ws.public_id).count()


def post(client, ws, body, email="admin@t.test"):
    return client.post("/api/v1/leads", json=body, headers=ws.headers(email))


def test_create_answers_201_with_location_and_the_new_lead(client, ws):
    response = post(client, ws, lead_body(ws, email="Asha@Example.COM", estimated_value=2500000))
    assert response.status_code == 201
    body = response.json
    assert body["duplicate"] is False and "matched_on" not in body
    lead = body["data"]
    assert response.headers["Location"] == f"/api/v1/leads/{lead['id']}"
    assert lead["id"].startswith("ld_") and len(lead["id"]) >= 3 + 16
    assert lead["contact"]["email"] == "asha@example.com"
    assert lead["contact"]["full_name"] == "Asha Rao"
    assert lead["source"] == {"id": ws.ids.sources["Website"], "name": "Website"}
    assert lead["estimated_value"] == 2500000.0 and lead["currency"] == "INR"
    assert client.get(response.headers["Location"], headers=ws.headers()).json["data"] == lead


@pytest.mark.parametrize("raw", ["9876543210", "+91 98765 43210", "09876543210", "919876543210",
                                 "0091 98765 43210", "(+91) 98765 43210", "98765-43210"])
def test_indian_mobiles_in_any_spelling_are_stored_as_e164(client, make_lead, ws, raw):
    lead = make_lead(ws, phone=raw)
    assert lead["contact"]["phone"] == "+919876543210"


def test_an_e164_mobile_gets_the_answer_phonenumbers_parse_gives():
    """+91 and ten digits skip phonenumbers.parse; with a space after +91 the same number takes
    the parse. For every four-digit start (the mobile ranges are allocated by them) both agree."""
    import random

    from leadsvc.fields import normalize_mobile

    normalize = normalize_mobile.__wrapped__   # uncached
    rng = random.Random(7)
    answers = set()
    for start in range(1000, 10000):
        digits = f"{start}{rng.randrange(10**6):06d}"
        answers.add(normalize(f"+91{digits}"))
        assert normalize(f"+91{digits}") == normalize(f"+91 {digits}"), digits
    assert len(answers) > 1000 and None in answers, "both mobiles and other numbers were checked"
    assert normalize("+91\u0669\u0668\u0667\u0666\u0665\u0664\u0663\u0662\u0661\u0660") == "+919876543210", \
        "digits of another script are parsed, and stored as ASCII"


@pytest.mark.parametrize("raw", ["1234567890", "011 2345 6789", "+91 11 2345 6789", "0919876543210",
                                 "98765432", "+1 650 253 0000", "abc", "", "+91 98765 43210 ext. 12",
                                 "9" * 40])
def test_numbers_that_are_not_indian_mobiles_are_422(client, ws, raw):
    response = post(client, ws, lead_body(ws, phone=raw, email="x@example.com"))
    assert response.status_code == 422
    assert response.json["code"] == "validation_failed"
    assert "Indian mobile" in response.json["errors"]["phone"][0]


def test_a_lead_needs_a_phone_or_an_email(client, ws):
    response = post(client, ws, {"first_name": "Nobody"})
    assert response.status_code == 422
    assert set(response.json["errors"]) == {"phone", "email"}
    assert post(client, ws, {"email": "only@example.com"}).status_code == 201


def test_invalid_email_is_422(client, ws):
    response = post(client, ws, lead_body(ws, email="not-an-email"))
    assert response.status_code == 422 and "email" in response.json["errors"]


def test_strings_are_trimmed_and_names_limited_to_100_characters(client, make_lead, ws):
    lead = make_lead(ws, first_name="  Asha  ", last_name=" Rao ")
    assert (lead["contact"]["first_name"], lead["contact"]["last_name"]) == ("Asha", "Rao")
    response = post(client, ws, lead_body(ws, first_name="x" * 101))
    assert response.status_code == 422 and "first_name" in response.json["errors"]


def test_source_must_be_a_source_id_not_a_name(client, ws, other_ws):
    for source, message in (("Website", "src_"), ("src_" + "a" * 20, "Unknown source"),
                            (other_ws.ids.sources["Website"], "Unknown source")):
        response = post(client, ws, lead_body(ws, source=source))
        assert response.status_code == 422, source
        assert message in response.json["errors"]["source"][0]


def test_unknown_fields_are_422_not_ignored(client, ws):
    response = post(client, ws, lead_body(ws, frist_name="Typo"))
    assert response.status_code == 422
    assert response.json["errors"] == {"frist_name": ["Unknown field."]}


@pytest.mark.parametrize("value", [-1, "1000", True, 10**14, float("inf")])
def test_estimated_value_must_be_a_sane_number(client, ws, value):
    response = client.post("/api/v1/leads", headers=ws.headers(),
                           data=__import__("json").dumps(lead_body(ws, estimated_value=value)),
                           content_type="application/json")
    assert response.status_code == 422 and "estimated_value" in response.json["errors"]


def test_custom_fields_are_checked_against_their_definitions(client, make_lead, ws):
    ok = make_lead(ws, custom_fields={"product_interest": "villa", "budget_confirmed": True,
                                                "family_size": 4, "site_visit_on": "2026-12-01",
                                                "notes_from_call": "  wants a garden "})
    assert ok["custom_fields"] == {"product_interest": "villa", "budget_confirmed": True, "family_size": 4,
                                   "site_visit_on": "2026-12-01", "notes_from_call": "wants a garden"}
    bad = {"product_interest": "castle", "budget_confirmed": "yes", "family_size": 10**400,
           "site_visit_on": "2026-02-30", "favourite_colour": "blue"}
    response = post(client, ws, lead_body(ws, custom_fields=bad))
    assert response.status_code == 422
    assert set(response.json["errors"]) == {f"custom_fields.{key}" for key in bad}
    assert "villa" in response.json["errors"]["custom_fields.product_interest"][0]


def test_at_most_50_custom_field_keys(client, ws):
    response = post(client, ws, lead_body(ws, custom_fields={f"k{i}": 1 for i in range(51)}))
    assert response.status_code == 422 and "custom_fields" in response.json["errors"]


def test_a_new_lead_starts_in_the_first_status_with_a_transition_from_null(client, make_lead, ws):
    lead = make_lead(ws)
    assert lead["status"]["id"] == ws.ids.statuses["New"] and lead["status"]["position"] == 1
    row = Lead.get(Lead.public_id == lead["id"])
    transitions = list(Transition.select().where(Transition.lead == row.id))
    assert len(transitions) == 1
    assert transitions[0].from_status_id is None and transitions[0].to_status_id == row.status_id
    kinds = [a.kind for a in Activity.select().where(Activity.lead == row.id).order_by(Activity.id)]
    assert kinds == ["created", "assigned"]
    audit = AuditEntry.get(AuditEntry.lead == row.id)
    assert audit.action == "created" and audit.changes["phone"] == {"old": None, "new": lead["contact"]["phone"]}
    assert audit.changes["status"]["new"] == ws.ids.statuses["New"]


def test_the_creating_token_and_request_id_are_the_actor(client, ws):
    response = client.post("/api/v1/leads", json=lead_body(ws), headers={**ws.headers(), "X-Request-ID": "req-42"})
    row = Lead.get(Lead.public_id == response.json["data"]["id"])
    audit = AuditEntry.get(AuditEntry.lead == row.id)
    assert audit.request_id == "req-42"
    assert audit.actor_member_id == ws.member("admin@t.test").id and audit.actor_token_id is not None


def test_new_leads_are_scored_with_reasons(client, make_lead, ws):
    lead = make_lead(ws, email="a@example.com", estimated_value=12_000_000,
                     custom_fields={"product_interest": "villa"})
    reasons = {r["reason"]: r["points"] for r in lead["score_reasons"]}
    assert reasons == {"source:Website": 10, "contact:phone": 10, "contact:email": 5, "contact:name": 5,
                       "value:>=10000000": 20, "custom_field:product_interest=villa": 15}
    assert lead["score"] == 65 and lead["score_band"] == "warm"


# --- duplicates --------------------------------------------------------------------------------

def test_same_phone_gives_200_with_the_existing_lead_and_creates_nothing(client, make_lead, ws):
    first = make_lead(ws, email="first@example.com")
    before = lead_count(ws)
    response = post(client, ws, lead_body(ws, phone=first["contact"]["phone"], first_name="Again",
                                          custom_fields={"family_size": 3}))
    assert response.status_code == 200
    assert response.json["duplicate"] is True and response.json["matched_on"] == ["phone"]
    assert response.json["data"]["id"] == first["id"] and response.json["data"]["contact"]["first_name"] == "Asha"
    assert lead_count(ws) == before
    activity = Activity.get((Activity.lead == Lead.get(Lead.public_id == first["id"]).id)
                            & (Activity.kind == "duplicate_submission"))
    assert activity.data["matched_on"] == ["phone"]
    assert activity.data["submitted"]["first_name"] == "Again"
    assert activity.data["submitted"]["custom_fields"] == {"family_size": 3}


def test_same_email_in_another_case_is_a_duplicate(client, make_lead, ws):
    first = make_lead(ws, phone=None, email="dup@example.com")
    response = post(client, ws, {"email": "DUP@example.com", "phone": new_phone()})
    assert response.status_code == 200 and response.json["matched_on"] == ["email"]
    assert response.json["data"]["id"] == first["id"]


def test_matching_both_phone_and_email_says_both(client, make_lead, ws):
    first = make_lead(ws, email="both@example.com")
    response = post(client, ws, {"email": "both@example.com", "phone": first["contact"]["phone"]})
    assert response.json["matched_on"] == ["phone", "email"]


def test_duplicates_are_per_workspace(client, make_lead, ws, other_ws):
    first = make_lead(ws, email="shared@example.com")
    other = make_lead(other_ws, phone=first["contact"]["phone"], email="shared@example.com")
    assert other["id"] != first["id"]


def test_duplicate_outside_the_callers_scope_is_409_showing_nothing(client, make_lead, ws):
    lead = make_lead(ws)
    owner = lead["owner"]["id"]
    outsider = next(email for email, mid in ws.ids.members.items()
                    if mid != owner and email in ("n1@t.test", "n2@t.test", "s1@t.test"))
    before = Activity.select().count()
    response = post(client, ws, lead_body(ws, phone=lead["contact"]["phone"]), email=outsider)
    assert response.status_code == 409 and response.json["code"] == "conflict"
    assert lead["id"] not in response.get_data(as_text=True)
    assert lead["contact"]["phone"] not in response.get_data(as_text=True)
    assert Activity.select().count() == before, "an error changes nothing"


def test_a_create_only_token_learns_a_duplicates_id_but_never_reads_it(client, make_lead, ws):
    first = make_lead(ws, email="known@example.com", first_name="Known")
    create_only = ws.headers("admin@t.test", ("leads:create",))
    response = client.post("/api/v1/leads", json={"phone": first["contact"]["phone"], "email": "known@example.com"},
                           headers=create_only)
    assert response.status_code == 200
    assert response.json == {"data": {"id": first["id"]}, "duplicate": True, "matched_on": ["phone", "email"]}
    assert "Known" not in response.get_data(as_text=True)
    new = client.post("/api/v1/leads", json=lead_body(ws), headers=create_only)
    assert new.status_code == 201 and new.json["data"]["contact"]["first_name"] == "Asha", \
        "a lead it just created is shown whole"


def test_without_leads_read_a_duplicate_outside_the_scope_is_still_409(client, make_lead, ws):
    lead = make_lead(ws)
    outsider = next(email for email in ("n1@t.test", "n2@t.test", "s1@t.test")
                    if ws.ids.members[email] != lead["owner"]["id"])
    response = client.post("/api/v1/leads", json={"phone": lead["contact"]["phone"]},
                           headers=ws.headers(outsider, ("leads:create",)))
    assert response.status_code == 409 and lead["id"] not in response.get_data(as_text=True)


def test_a_lead_routed_outside_the_creators_scope_is_shown_once_then_hidden(client, make_workspace):
    ws = make_workspace(lambda d: d.update(rules=[{"name": "All South", "assign": {"team": "South",
                                                                                  "strategy": "round_robin"}}]))
    response = post(client, ws, lead_body(ws), email="n1@t.test")
    assert response.status_code == 201
    assert response.json["data"]["owner"]["id"] == ws.ids.members["s1@t.test"]
    assert client.get(response.headers["Location"], headers=ws.headers("n1@t.test")).status_code == 404


def test_create_needs_the_leads_create_ability(client, ws):
    response = post(client, ws, lead_body(ws), email="admin@t.test")
    assert response.status_code == 201
    response = client.post("/api/v1/leads", json=lead_body(ws), headers=ws.headers("admin@t.test", ("leads:read",)))
    assert response.status_code == 403 and "leads:create" in response.json["detail"]


def test_public_ids_start_with_their_second_then_keep_16_random_digits(monkeypatch):
    # Ids made in the same second sit side by side in a unique index (a new row lands on a page in
    # memory); the contract still asks for at least 16 random base-62 digits after the prefix.
    from types import SimpleNamespace

    from leadsvc import models

    monkeypatch.setattr(models, "time", SimpleNamespace(time=lambda: 1_800_000_000.9))
    same_second = [models.new_public_id("act_") for _ in range(200)]
    monkeypatch.setattr(models, "time", SimpleNamespace(time=lambda: 1_800_000_001.0))
    next_second = models.new_public_id("act_")
    pattern = models.public_id_pattern("act_")
    assert all(pattern.fullmatch(i) and len(i) == len("act_") + 22 for i in [*same_second, next_second])
    assert len({i[:10] for i in same_second}) == 1, "the same second, the same first 6 digits"
    assert len({i[10:] for i in same_second}) == 200, "16 random digits after them"
    leading = {models.new_public_id("act_")[10] for _ in range(2000)}
    assert len(leading) > 55, "the first random digit takes (nearly) every base-62 value: enough random bits"
    assert max(same_second) < next_second, "a later second sorts after"


# --- a phone holds digits, spaces and + - . ( ) only ---------------------------------------------

LETTERED_PHONES = ["98765abcde", "+91 98765 ABCDE", "9876543210x", "98765-4321O"]


def with_a_form(data):
    data["forms"] = [{"name": "Enquiry", "source": "Website", "allowed_origins": ["https://acme.test"]}]


def phone_through(path, client, make_lead, ws, phone, tmp_path, database_url):
    """Send `phone` through one of the ways a lead comes in: its 422 errors (None: no 422) and the
    phones stored in the workspace afterwards."""
    errors = None
    if path == "api create":
        response = post(client, ws, {"phone": phone})
        errors = response.json.get("errors") if response.status_code == 422 else None
    elif path == "api patch":
        lead = make_lead(ws, phone=None, email="patch@example.com")
        response = client.patch(f"/api/v1/leads/{lead['id']}", json={"phone": phone}, headers=ws.headers())
        errors = response.json.get("errors") if response.status_code == 422 else None
    elif path in ("form json", "form encoded"):
        url = f"/api/v1/forms/{ws.ids.forms['Enquiry']}/submissions"
        if path == "form json":
            response = client.post(url, json={"phone": phone})
            errors = response.json.get("errors") if response.status_code == 422 else None
        else:
            response = client.post(url, data={"phone": phone})
            shown = re.findall(r'<p class="error" id="error-phone">([^<]*)</p>', response.get_data(as_text=True))
            errors = {"phone": shown} if response.status_code == 422 else None
    else:   # csv import
        import csv
        import json

        file = tmp_path / "leads.csv"
        with open(file, "w", newline="") as fh:
            csv.writer(fh).writerows([["phone"], [phone]])
        result = run_import(database_url, file, ws.public_id, "--json")
        report = json.loads(result.stdout)
        errors = {e["field"]: [e["message"]] for e in report["errors"]} or None
    phones = [p for (p,) in Lead.select(Lead.phone).join(Workspace)
              .where(Workspace.public_id == ws.public_id).tuples() if p]
    return errors, phones


@pytest.mark.parametrize("path", ["api create", "api patch", "form json", "form encoded", "csv import"])
@pytest.mark.parametrize("phone", LETTERED_PHONES)
def test_a_phone_with_a_letter_is_422_on_every_way_in_never_keypad_digits(
        client, make_lead, make_workspace, tmp_path, database_url, path, phone):
    ws = make_workspace(with_a_form)
    errors, phones = phone_through(path, client, make_lead, ws, phone, tmp_path, database_url)
    assert errors is not None and "Indian mobile" in " ".join(errors.get("phone", [])), errors
    assert phones == [], "nothing was stored, least of all the letters read as keypad digits"


# --- phone regions (setup's [workspace] phone_regions) -----------------------------------------

NRI_REGIONS = ["IN", "AE", "GB", "US"]
UAE_MOBILE, UK_MOBILE, US_NUMBER = "+971 50 123 4567", "+44 7400 123456", "+1 650 253 0000"


@pytest.fixture
def nri_ws(make_workspace):
    return make_workspace(lambda data: data["workspace"].update(phone_regions=NRI_REGIONS))


@pytest.mark.parametrize("raw, stored", [(UAE_MOBILE, "+971501234567"), ("00971 50 123 4567", "+971501234567"),
                                         (UK_MOBILE, "+447400123456"), (US_NUMBER, "+16502530000"),
                                         ("98765 43210", "+919876543210")])
def test_a_workspace_with_phone_regions_takes_the_mobiles_of_those_regions(client, nri_ws, raw, stored):
    response = client.post("/api/v1/leads", json=lead_body(nri_ws, phone=raw), headers=nri_ws.headers())
    assert response.status_code == 201, response.json
    assert response.json["data"]["contact"]["phone"] == stored


@pytest.mark.parametrize("raw", ["+971 4 123 4567", "+33 6 12 34 56 78", "+44 20 7946 0958", "50 123 4567"])
def test_phone_regions_still_refuse_landlines_other_regions_and_foreign_numbers_without_plus(client, nri_ws, raw):
    response = client.post("/api/v1/leads", json=lead_body(nri_ws, phone=raw), headers=nri_ws.headers())
    assert response.status_code == 422 and "AE, GB, US" in response.json["errors"]["phone"][0]


def test_the_default_phone_regions_take_indian_mobiles_alone(client, ws):
    response = client.post("/api/v1/leads", json=lead_body(ws, phone=UAE_MOBILE), headers=ws.headers())
    assert response.status_code == 422
    assert response.json["errors"]["phone"] == ["Enter a valid Indian mobile number, such as +91 98765 43210."]


def test_a_foreign_mobile_is_a_duplicate_however_it_is_spelt_in_a_create_and_a_batch(client, make_lead, nri_ws):
    first = make_lead(nri_ws, phone=UAE_MOBILE)
    again = client.post("/api/v1/leads", json=lead_body(nri_ws, phone="00971-50-123-4567"), headers=nri_ws.headers())
    assert again.status_code == 200 and again.json["matched_on"] == ["phone"] and again.json["data"]["id"] == first["id"]
    batch = client.post("/api/v1/leads/batch", json={"leads": [lead_body(nri_ws, phone="+971501234567"),
                                                              lead_body(nri_ws, phone=UK_MOBILE)]},
                        headers=nri_ws.headers())
    assert [item["status"] for item in batch.json["data"]] == [200, 201]


@pytest.mark.parametrize("q", ["+971 50 123 4567", "50 123 4567", "4567"])
def test_search_by_phone_suffix_finds_a_foreign_mobile(client, make_lead, nri_ws, q):
    lead = make_lead(nri_ws, phone=UAE_MOBILE)
    found = client.get("/api/v1/leads", query_string={"q": q}, headers=nri_ws.headers())
    assert found.status_code == 200 and lead["id"] in [item["id"] for item in found.json["data"]]


def test_erasure_and_access_by_phone_find_a_foreign_mobile(client, make_lead, nri_ws):
    lead = make_lead(nri_ws, phone=UK_MOBILE)
    subject = client.get("/api/v1/privacy/subject", query_string={"phone": "+44 7400 123 456"}, headers=nri_ws.headers())
    assert subject.status_code == 200 and [item["id"] for item in subject.json["data"]["leads"]] == [lead["id"]]
    erased = client.post("/api/v1/privacy/erasures", json={"phone": "0044 7400 123456", "reason": "asked"},
                         headers=nri_ws.headers())
    assert erased.status_code == 200 and erased.json["data"]["erased"] == [lead["id"]]


def test_a_web_form_of_a_workspace_with_phone_regions_takes_their_mobiles(client, make_workspace):
    def nri_with_form(data):
        data["workspace"]["phone_regions"] = NRI_REGIONS
        data["forms"] = [{"name": "NRI enquiry", "source": "Website"}]

    tenant = make_workspace(nri_with_form)
    form_id = tenant.ids.forms["NRI enquiry"]
    response = client.post(f"/api/v1/forms/{form_id}/submissions", json={"phone": US_NUMBER})
    assert response.status_code == 201
    workspace = Workspace.get(Workspace.public_id == tenant.public_id)
    assert Lead.select().where((Lead.workspace == workspace.id) & (Lead.phone == "+16502530000")).exists()


def test_the_csv_import_takes_the_mobiles_of_the_workspace_regions(run_cli, nri_ws, tmp_path):
    path = tmp_path / "nri.csv"
    path.write_text(f"first_name,phone\nAsha,{UAE_MOBILE}\nRavi,+33 6 12 34 56 78\n")
    result = run_cli("import", str(path), "--workspace", nri_ws.public_id)
    assert "2 rows, 1 created" in result.stdout, result.stdout
    assert Lead.select().where(Lead.phone == "+971501234567").exists()
