"""Embedding: LeadService mounts the API under a host Flask app's prefix without touching the host's pages."""

import os
import re
from urllib.parse import urljoin, urlsplit

import pytest
from flask import Flask, jsonify

from conftest import config_for
from leadsvc import LeadService


@pytest.fixture
def host(database_url, app):
    """A host site with its own pages and its own 404 and 500 pages, with the API under /crm."""
    site = Flask("host_site")

    @site.errorhandler(404)
    def host_not_found(error):
        return "<h1>host 404</h1>", 404

    @site.errorhandler(500)
    def host_error(error):
        return "<h1>host 500</h1>", 500

    @site.get("/")
    def home():
        return "<h1>Acme home</h1>"

    @site.get("/about.json")
    def about():
        return jsonify(site="acme")

    @site.get("/crash")
    def crash():
        raise RuntimeError("host bug")

    LeadService(site, url_prefix="/crm", config=config_for(database_url), config_file=os.devnull)
    return site


@pytest.fixture
def browser(host):
    return host.test_client()


def test_host_pages_and_host_404_stay_the_hosts(browser):
    assert browser.get("/").get_data(as_text=True) == "<h1>Acme home</h1>"
    assert browser.get("/about.json").json == {"site": "acme"}
    for path in ("/nope", "/api/v1/statuses", "/docs", "/crmx/api/v1/statuses"):
        response = browser.get(path)
        assert response.status_code == 404 and response.get_data(as_text=True) == "<h1>host 404</h1>", path
        assert "X-Request-ID" not in response.headers


def test_host_500_page_stays_the_hosts(host):
    host.config["PROPAGATE_EXCEPTIONS"] = False
    response = host.test_client().get("/crash")
    assert response.status_code == 500 and response.get_data(as_text=True) == "<h1>host 500</h1>"


def test_unknown_path_under_the_prefix_is_a_problem_404(browser):
    response = browser.get("/crm/api/v1/nope")
    assert response.status_code == 404 and response.content_type == "application/problem+json"
    assert response.json["code"] == "not_found"
    assert response.json["type"] == "/crm/docs/api/problems/not_found", "under the mount prefix, from no header"
    assert browser.get(response.json["type"]).status_code == 200


def test_the_api_answers_under_the_prefix_with_a_token(browser, ws):
    response = browser.get("/crm/api/v1/statuses", headers=ws.headers())
    assert response.status_code == 200 and response.json["data"][0]["name"] == "New"
    assert response.headers["X-Request-ID"]
    unauthenticated = browser.get("/crm/api/v1/statuses")
    assert unauthenticated.status_code == 401 and unauthenticated.headers["WWW-Authenticate"].startswith("Bearer")
    assert browser.get("/crm/healthz").json == {"status": "ok"}


def test_swagger_ui_and_its_assets_resolve_under_the_prefix(browser):
    page = browser.get("/crm/docs")
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    references = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert len(references) == 3
    for reference in references:
        path = urlsplit(urljoin("http://localhost/crm/docs", reference)).path
        assert path.startswith("/crm/docs/assets/swagger_ui/vendor/")
        assert browser.get(path).status_code == 200, path
    spec_url = re.search(r'url: "([^"]+)"', html).group(1)
    assert spec_url == "/crm/api/v1/openapi.json"
    spec = browser.get(spec_url).json
    # "Try it out" builds request URLs from `servers`: they must stay under the prefix.
    assert spec["servers"] == [{"url": "/crm"}] and "/api/v1/leads" in spec["paths"]


def test_problem_pages_link_under_the_prefix(browser):
    html = browser.get("/crm/docs/api/problems/").get_data(as_text=True)
    assert 'href="/crm/docs/api/problems/not_found"' in html and 'href="/crm/docs"' in html


def test_location_and_next_links_carry_the_prefix(browser, ws):
    headers = ws.headers()
    created = browser.post("/crm/api/v1/leads", json={"phone": "9876500001"}, headers=headers)
    assert created.status_code == 201
    location = created.headers["Location"]
    assert urlsplit(location).path == f"/crm/api/v1/leads/{created.json['data']['id']}"
    assert browser.get(location, headers=headers).json["data"]["id"] == created.json["data"]["id"]
    browser.post("/crm/api/v1/leads", json={"phone": "9876500002"}, headers=headers)
    page = browser.get("/crm/api/v1/leads?page[size]=1", headers=headers).json
    assert page["links"]["next"].startswith("/crm/api/v1/leads?")
    assert browser.get(page["links"]["next"], headers=headers).status_code == 200


def test_mounting_at_the_root_is_refused():
    with pytest.raises(ValueError, match="prefix"):
        LeadService(Flask("host_site"), url_prefix="/")


def test_the_services_root_and_form_pages_are_under_the_prefix(browser, make_workspace):
    tenant = make_workspace(lambda data: data.update(forms=[{"name": "Enquiry", "allowed_origins": []}]))
    root = browser.get("/crm/")
    assert root.status_code == 302 and root.headers["Location"] == "/crm/docs"
    [form] = browser.get("/crm/api/v1/forms", headers=tenant.headers()).json["data"]
    assert form["page_url"] == f"/crm/forms/{tenant.ids.forms['Enquiry']}"
    assert browser.get(form["page_url"]).status_code == 200
