"""Docs: Swagger UI 5 served from a Python package, problem pages, and the OpenAPI document, all offline."""

import json
import re
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import pytest

from leadsvc.problems import CODES
from leadsvc.fields import NOT_BLANK_PATTERN

ROOT = Path(__file__).resolve().parent.parent

BASE = "http://localhost"
URL = re.compile(r"""https?://[^\s"'<>)]+""")
REFERENCES = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']""")
CSS_URLS = re.compile(r"""url\(\s*["']?([^"')]+)""")
HTML_PAGES = ["/docs", "/docs/api/problems/"] + [f"/docs/api/problems/{code}" for code in CODES]


def external_urls(text: str) -> list[str]:
    """URLs in the text that point anywhere but the service itself (XML namespaces are names, not fetches)."""
    return [url for url in URL.findall(text)
            if urlsplit(url).netloc != "localhost" and not url.startswith("http://www.w3.org/")]


def fetch_page_and_resources(client, path):
    """The page and every resource it references (scripts, styles, links), each fetched from the service."""
    page = client.get(path)
    assert page.status_code == 200 and page.content_type.startswith("text/html"), path
    html = page.get_data(as_text=True)
    resources = {}
    for reference in REFERENCES.findall(html):
        url = urljoin(BASE + path, reference)
        assert urlsplit(url).netloc == "localhost", f"{path} references {url}"
        response = client.get(urlsplit(url).path)
        assert response.status_code == 200, url
        resources[url] = response
    return html, resources


def test_swagger_ui_page_and_every_asset_it_references_load(client):
    html, resources = fetch_page_and_resources(client, "/docs")
    kinds = {url.rsplit(".", 1)[1]: response for url, response in resources.items()}
    assert set(kinds) == {"css", "js"} and len(resources) == 3
    assert all(response.content_type.split(";")[0] in ("text/css", "text/javascript", "application/javascript")
               for response in resources.values())
    bundle = next(r for url, r in resources.items() if url.endswith("swagger-ui-bundle.js"))
    assert 'PACKAGE_VERSION:"5.' in bundle.get_data(as_text=True)   # Swagger UI 5 renders OpenAPI 3.1


def test_swagger_ui_loads_this_services_spec(client):
    html = client.get("/docs").get_data(as_text=True)
    spec_url = re.search(r'url: "([^"]+)"', html).group(1)
    assert spec_url == "/api/v1/openapi.json"
    assert client.get(spec_url).json["openapi"] == "3.1.0"
    assert '"validatorUrl": null' in html   # no badge fetched from validator.swagger.io


@pytest.mark.parametrize("path", HTML_PAGES)
def test_no_docs_page_or_resource_it_loads_points_outside_the_service(client, path):
    html, resources = fetch_page_and_resources(client, path)
    assert external_urls(html) == [], path
    for url, response in resources.items():
        if url.endswith(".css"):
            css = response.get_data(as_text=True)
            assert [u for u in CSS_URLS.findall(css) if not u.startswith("data:")] == [], url


@pytest.mark.parametrize("path", [
    "/docs/assets/swagger_ui/vendor/index.html",     # the bundle's demo page, which loads the petstore
    "/docs/assets/__init__.py",
    "/docs/assets/swagger_ui/__init__.py",
    "/docs/assets/redoc/vendor/redoc.standalone.js",
    "/docs/assets/swagger_ui/vendor/../../__about__.py",
    "/docs/assets/swagger_ui/vendor/",
    "/docs/assets/swagger_ui/vendor/nope.js",
])
def test_the_asset_route_serves_only_swagger_ui_files(client, path):
    response = client.get(path)
    assert response.status_code == 404 and response.content_type == "application/problem+json"


def test_problem_index_links_every_code_page(client):
    html, resources = fetch_page_and_resources(client, "/docs/api/problems/")
    linked = {urlsplit(url).path for url in resources}
    assert {f"/docs/api/problems/{code}" for code in CODES} <= linked
    assert "/docs" in linked


@pytest.mark.parametrize("code", CODES)
def test_each_problem_page_explains_its_code(client, code):
    html = client.get(f"/docs/api/problems/{code}").get_data(as_text=True)
    status, title, meaning = CODES[code]
    assert title in html and f"<strong>{status}</strong>" in html
    assert meaning.split("`")[0][:40] in html


# --- the OpenAPI document --------------------------------------------------------------------

@pytest.fixture
def spec(client):
    response = client.get("/api/v1/openapi.json")
    assert response.status_code == 200 and response.content_type == "application/json"
    return response.json


METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}


def operations(spec):
    for path, item in spec["paths"].items():
        for method, operation in item.items():
            if method in METHODS:
                yield path, method, operation


def test_openapi_is_3_1_with_the_bearer_scheme_required_by_default(spec):
    assert spec["openapi"] == "3.1.0"
    assert spec["components"]["securitySchemes"] == {"bearerAuth": {"type": "http", "scheme": "bearer"}}
    assert spec["security"] == [{"bearerAuth": []}]


PUBLIC_PATHS = {"/healthz", "/readyz", "/forms/{form_id}", "/api/v1/forms/{form_id}/submissions",
                "/api/v1/intake/{conn_id}", "/api/v1/intake/{conn_id}/{key}"}


def test_probes_web_forms_and_intake_are_the_only_public_operations(spec):
    for path in ("/healthz", "/readyz"):
        assert spec["paths"][path]["get"]["security"] == []
    public = {path for path, _, operation in operations(spec) if operation.get("security") == []}
    assert public == PUBLIC_PATHS


def test_every_error_response_is_a_problem_document(spec):
    responses = spec["components"]["responses"]
    for name, response in responses.items():
        if "content" in response:
            assert list(response["content"]) == ["application/problem+json"], name
            assert response["content"]["application/problem+json"]["schema"] == {"$ref": "#/components/schemas/Problem"}
    for path, method, operation in operations(spec):
        # A page for people (the web form) answers its errors as pages too.
        allowed = {"application/problem+json"}
        if "text/html" in operation["responses"].get("200", {}).get("content", {}):
            allowed.add("text/html")
        for status, response in operation["responses"].items():
            if status == "default" or int(status) >= 400:
                if "$ref" in response:
                    response = responses[response["$ref"].rsplit("/", 1)[1]]
                content = response["content"]
                assert set(content) <= allowed, (path, method, status)
                if "application/problem+json" in content:
                    assert content["application/problem+json"]["schema"] == {"$ref": "#/components/schemas/Problem"}
    problem = spec["components"]["schemas"]["Problem"]
    assert set(problem["required"]) == {"type", "title", "status", "detail", "code", "request_id"}
    assert set(problem["properties"]["code"]["enum"]) == set(CODES)


def test_every_authenticated_operation_documents_401_and_has_a_summary(spec):
    for path, method, operation in operations(spec):
        assert operation.get("summary"), (path, method)
        if operation.get("security") != []:
            assert "401" in operation["responses"], (path, method)


def test_the_served_document_is_the_same_on_every_request(client, spec):
    """It is rewritten as it is served (problem responses): never the spec apispec keeps."""
    assert client.get("/api/v1/openapi.json").json == client.get("/api/v1/openapi.json").json == spec


def test_served_spec_names_the_root_as_its_server_when_not_mounted(spec):
    assert spec["servers"] == [{"url": "/"}]


def test_every_operation_has_a_unique_camel_case_operation_id(spec):
    ids = [operation.get("operationId") for _, _, operation in operations(spec)]
    assert all(re.fullmatch(r"[a-z]+(?:[A-Z][a-z]+)+", str(name)) for name in ids), ids
    assert len(set(ids)) == len(ids)


def test_the_license_is_the_one_in_the_repository(spec):
    assert spec["info"]["license"] == {"name": "MIT", "identifier": "MIT"}
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")


def test_custom_fields_are_limited_by_their_number_of_keys(spec):
    schemas = spec["components"]["schemas"]
    for name in ("LeadCreate", "LeadPatch", "FormSubmission"):
        custom_fields = schemas[name]["properties"]["custom_fields"]
        assert custom_fields["type"] == "object" and custom_fields["maxProperties"] == 50, name
        assert "maxLength" not in custom_fields, name


def test_text_the_service_refuses_blank_is_documented_as_not_blank(spec):
    schemas = spec["components"]["schemas"]
    for name, field in (("NoteCreate", "body"), ("ActivityCreate", "summary")):
        assert schemas[name]["properties"][field] | {"minLength": 1, "pattern": NOT_BLANK_PATTERN} == schemas[name]["properties"][field]
    for name in ("LeadCreate", "LeadPatch", "FormSubmission"):
        assert schemas[name]["properties"]["phone"]["minLength"] == schemas[name]["properties"]["email"]["minLength"] == 1


def test_every_time_is_a_date_time(spec):
    """In every response document, and in every input that takes one."""
    times = {(name, field): schema for name, component in spec["components"]["schemas"].items()
             for field, schema in component.get("properties", {}).items() if field == "at" or field.endswith("_at")}
    assert ("Lead", "last_activity_at") in times and ("ActivityCreate", "occurred_at") in times
    assert {key for key, schema in times.items() if schema.get("format") != "date-time"} == set()


def test_a_lead_needs_a_phone_or_an_email_in_the_schema_too(spec):
    schemas = spec["components"]["schemas"]
    for name in ("LeadCreate", "FormSubmission"):
        assert schemas[name]["anyOf"] == [{"required": ["phone"]}, {"required": ["email"]}], name
    form_fields = spec["paths"]["/api/v1/forms/{form_id}/submissions"]["post"]["requestBody"]["content"][
        "application/x-www-form-urlencoded"]["schema"]
    assert [branch["required"] for branch in form_fields["anyOf"]] == [["phone"], ["email"]]


def test_the_status_is_no_field_of_an_update(spec, client, make_lead, ws):
    lead = make_lead(ws)
    assert "status" not in spec["components"]["schemas"]["LeadPatch"]["properties"]
    assert spec["components"]["schemas"]["LeadPatch"]["additionalProperties"] is False
    response = client.patch(f"/api/v1/leads/{lead['id']}", json={"status": ws.ids.statuses["Contacted"]},
                            headers=ws.headers())
    assert response.status_code == 422 and "/status" in response.json["errors"]["status"][0]


def test_every_answer_a_post_can_replay_names_the_replay_header(spec):
    for path, method, operation in operations(spec):
        if method != "post":
            continue
        replayable = {status for status in operation["responses"]
                      if status == "default" or status[0] in "234" and status not in ("401", "403", "429")}
        named = {status for status, response in operation["responses"].items()
                 if "Idempotent-Replayed" in response.get("headers", {})}
        assert named == replayable, path


def test_web_form_submissions_document_their_html_answers(spec):
    responses = spec["paths"]["/api/v1/forms/{form_id}/submissions"]["post"]["responses"]
    assert set(responses["200"]["content"]) == {"text/html"}
    assert set(responses["422"]["content"]) == {"application/problem+json", "text/html"}
    assert set(responses["201"]["content"]) == {"application/json"}


def test_a_conditional_read_documents_304_and_if_none_match(spec, client, make_lead, ws):
    lead = make_lead(ws)
    operation = spec["paths"]["/api/v1/leads/{public_id}"]["get"]
    assert "304" in operation["responses"]
    assert "If-None-Match" in {parameter.get("name") for parameter in operation["parameters"]}
    tag = client.get(f"/api/v1/leads/{lead['id']}", headers=ws.headers()).headers["ETag"]
    response = client.get(f"/api/v1/leads/{lead['id']}", headers={**ws.headers(), "If-None-Match": tag})
    assert response.status_code == 304


def test_no_component_is_left_unused(spec):
    text = json.dumps({key: value for key, value in spec.items() if key != "components"})
    components = spec["components"]
    used = set(re.findall(r'"#/components/([^/"]+)/([^"]+)"', text))
    while True:   # and what those refer to
        more = {ref for kind, name in used for ref in re.findall(r'"#/components/([^/"]+)/([^"]+)"',
                                                                   json.dumps(components[kind][name]))}
        if more <= used:
            break
        used |= more
    declared = {(kind, name) for kind, members in components.items() if kind != "securitySchemes" for name in members}
    assert declared == used


@pytest.mark.parametrize("path", ["/docs", "/docs/api/problems/", "/docs/api/problems/not_found", "/nope",
                                  "/api/v1/openapi.json", "/docs/assets/swagger_ui/vendor/swagger-ui.css"])
def test_docs_and_problem_answers_cannot_be_framed_or_sniffed(client, path):
    response = client.get(path)
    assert response.status_code in (200, 404)
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert response.headers["Content-Security-Policy"] == "frame-ancestors 'none'"
    assert response.headers["X-Frame-Options"] == "DENY"
