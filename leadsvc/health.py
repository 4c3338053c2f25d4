"""Liveness and readiness probes for load balancers and orchestrators."""

from __future__ import annotations

import marshmallow as ma
from flask.views import MethodView

from .db import ping
from .extensions import Blueprint

blp = Blueprint("health", __name__, description="Probes for load balancers.")


class HealthSchema(ma.Schema):
    status = ma.fields.String(required=True)


@blp.route("/healthz")
class Health(MethodView):
    @blp.doc(operationId="checkHealth", security=[])
    @blp.response(200, HealthSchema)
    def get(self):
        """Answer while the process lives"""
        return {"status": "ok"}


@blp.route("/readyz")
class Ready(MethodView):
    @blp.doc(operationId="checkReadiness", security=[])
    @blp.response(200, HealthSchema)
    @blp.alt_response(503, response="SERVICE_UNAVAILABLE")
    def get(self):
        """Answer 200 only while the database answers"""
        ping()   # a database error becomes a 503 problem in problems.py
        return {"status": "ready"}
