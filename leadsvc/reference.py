"""Reference data: the public ids a client must send (statuses, sources, teams, custom fields, lost
reasons, forms; members are members.py's), served from the workspace's cached reference tables (refs.py); forms, which
no lead document needs, are read from the database."""

from __future__ import annotations

import peewee as pw
from flask import url_for
from flask.views import MethodView

from .auth import caller, requires
from .documents import (CustomFieldSchema, FormSchema, LostReasonSchema, SourceSchema, StatusSchema, TeamSchema,
                        page_of, whole_page)
from .extensions import Blueprint
from .models import Form, Source
from .refs import request_refs
from .schemas import NoQuery

blp = Blueprint("reference", __name__, url_prefix="/api/v1", description="Reference data of the caller's workspace.")


@blp.route("/statuses")
class Statuses(MethodView):
    @blp.doc(operationId="listStatuses")
    @requires()
    @blp.arguments(NoQuery, location="query", as_kwargs=True)
    @blp.response(200, page_of(StatusSchema))
    def get(self):
        """List the pipeline's statuses in order"""
        statuses = request_refs().pipeline()
        # Documents, not the cached rows: those are shared by every request of the workspace.
        return whole_page({"public_id": status.public_id, "name": status.name, "position": status.position,
                           "kind": status.kind, "next": status.next_ids(statuses)} for status in statuses)


@blp.route("/sources")
class Sources(MethodView):
    @blp.doc(operationId="listSources")
    @requires()
    @blp.arguments(NoQuery, location="query", as_kwargs=True)
    @blp.response(200, page_of(SourceSchema))
    def get(self):
        """List the lead sources"""
        return whole_page(request_refs().sources.values())


@blp.route("/teams")
class Teams(MethodView):
    @blp.doc(operationId="listTeams")
    @requires()
    @blp.arguments(NoQuery, location="query", as_kwargs=True)
    @blp.response(200, page_of(TeamSchema))
    def get(self):
        """List the teams"""
        return whole_page(request_refs().teams.values())


@blp.route("/custom-fields")
class CustomFields(MethodView):
    @blp.doc(operationId="listCustomFields")
    @requires()
    @blp.arguments(NoQuery, location="query", as_kwargs=True)
    @blp.response(200, page_of(CustomFieldSchema))
    def get(self):
        """List the custom fields a lead may carry"""
        return whole_page(sorted(request_refs().custom_fields.values(), key=lambda f: (f.position, f.name)))


@blp.route("/lost-reasons")
class LostReasons(MethodView):
    @blp.doc(operationId="listLostReasons")
    @requires()
    @blp.arguments(NoQuery, location="query", as_kwargs=True)
    @blp.response(200, page_of(LostReasonSchema))
    def get(self):
        """List the reasons a move to a lost status may give"""
        return whole_page(request_refs().lost_reasons.values())


@blp.route("/forms")
class Forms(MethodView):
    @blp.doc(operationId="listForms")
    @requires()
    @blp.arguments(NoQuery, location="query", as_kwargs=True)
    @blp.response(200, page_of(FormSchema))
    def get(self):
        """List the web forms, each with the path of its page"""
        forms = list(Form.select(Form, Source).join(Source, pw.JOIN.LEFT_OUTER)
                     .where(Form.workspace == caller().workspace.id).order_by(Form.name, Form.id))
        for form in forms:
            form.page_url = url_for("forms.FormPage", form_id=form.public_id)
        return whole_page(forms)
