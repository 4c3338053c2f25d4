"""The timeline, report and web-form operations are in the published OpenAPI document as served."""

import json
from pathlib import Path

import pytest

PUBLISHED = Path(__file__).resolve().parent.parent / "schemas" / "openapi.json"
OPERATIONS = [
    ("post", "/api/v1/leads/{public_id}/notes", "bearerAuth"),
    ("post", "/api/v1/leads/{public_id}/activities", "bearerAuth"),
    ("get", "/api/v1/leads/{public_id}/transitions", "bearerAuth"),
    ("get", "/api/v1/leads/{public_id}/audit", "bearerAuth"),
    ("get", "/api/v1/reports/funnel", "bearerAuth"),
    ("get", "/api/v1/reports/velocity", "bearerAuth"),
    ("get", "/api/v1/reports/conversion", "bearerAuth"),
    ("get", "/api/v1/reports/response", "bearerAuth"),
    ("get", "/forms/{form_id}", None),
    ("post", "/api/v1/forms/{form_id}/submissions", None),
]


@pytest.fixture(scope="module")
def published():
    return json.loads(PUBLISHED.read_text(encoding="utf-8"))


@pytest.mark.parametrize("method, path, security", OPERATIONS)
def test_operation_is_published_with_its_security(client, published, method, path, security):
    served = client.get("/api/v1/openapi.json").json
    for spec in (published, served):
        operation = spec["paths"][path][method]
        assert operation["summary"]
        if security is None:
            assert operation["security"] == [], "web forms take no token"
        else:
            assert "security" not in operation and spec["security"] == [{security: []}]
            assert {"401", "403"} <= set(operation["responses"])
    assert published["paths"][path][method] == served["paths"][path][method], "run make openapi"


@pytest.mark.parametrize("name", ["Funnel", "Velocity", "Conversion", "ResponseReport"])
def test_report_response_shapes_are_documented(published, name):
    schema = published["components"]["schemas"][name]
    assert schema["required"] and all("type" in p or "$ref" in p for p in schema["properties"].values())
