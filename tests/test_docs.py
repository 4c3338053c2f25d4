"""Docs: Swagger UI 5 served from a Python package, problem pages, and the OpenAPI document, all offline."""

import re
from urllib.parse import urljoin, urlsplit

import pytest

from leadsvc.problems import CODES

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


PUBLIC_PATHS = {"/healthz", "/readyz", "/forms/{form_id}", "/api/v1/forms/{form_id}/submissions"}


def test_probes_and_web_forms_are_the_only_public_operations(spec):
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
        if "text/html" in operation["responses"].get("200", {}).get("content", {}):
            continue   # a page for people (the web form) answers its errors as pages too
        for status, response in operation["responses"].items():
            if status == "default" or int(status) >= 400:
                ref = response["$ref"].rsplit("/", 1)[1]
                assert list(responses[ref]["content"]) == ["application/problem+json"], (path, method, status)
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


def test_served_spec_has_no_servers_when_not_mounted(spec):
    assert "servers" not in spec
