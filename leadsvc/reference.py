"""Reference data: the public ids a client must send (statuses, sources, members, teams, custom fields,
lost reasons, forms)."""

from __future__ import annotations

import peewee as pw
from flask import url_for
from flask.views import MethodView

from .auth import caller, requires
from .extensions import Blueprint
from .models import CustomField, Form, LostReason, Member, Source, Status, Team
from .schemas import (CustomFieldSchema, FormSchema, LostReasonSchema, MemberSchema, NoQuery, SourceSchema,
                      StatusSchema, TeamSchema, page_of, whole_page)

blp = Blueprint("reference", __name__, url_prefix="/api/v1", description="Reference data of the caller's workspace.")


def pipeline(workspace_id: int) -> list[Status]:
    """The workspace's statuses in pipeline order."""
    return list(Status.select().where(Status.workspace == workspace_id).order_by(Status.position, Status.id))


@blp.route("/statuses")
class Statuses(MethodView):
    @blp.doc(operationId="listStatuses")
    @requires()
    @blp.arguments(NoQuery, location="query", as_kwargs=True)
    @blp.response(200, page_of(StatusSchema))
    def get(self):
        """List the pipeline's statuses in order"""
        statuses = pipeline(caller().workspace.id)
        for status in statuses:
            status.next = status.next_ids(statuses)
        return whole_page(statuses)


@blp.route("/sources")
class Sources(MethodView):
    @blp.doc(operationId="listSources")
    @requires()
    @blp.arguments(NoQuery, location="query", as_kwargs=True)
    @blp.response(200, page_of(SourceSchema))
    def get(self):
        """List the lead sources"""
        return whole_page(Source.select().where(Source.workspace == caller().workspace.id).order_by(Source.name))


@blp.route("/members")
class Members(MethodView):
    @blp.doc(operationId="listMembers")
    @requires()
    @blp.arguments(NoQuery, location="query", as_kwargs=True)
    @blp.response(200, page_of(MemberSchema))
    def get(self):
        """List the workspace's members"""
        return whole_page(Member.select(Member, Team).join(Team, pw.JOIN.LEFT_OUTER)
                          .where(Member.workspace == caller().workspace.id).order_by(Member.name, Member.id))


@blp.route("/teams")
class Teams(MethodView):
    @blp.doc(operationId="listTeams")
    @requires()
    @blp.arguments(NoQuery, location="query", as_kwargs=True)
    @blp.response(200, page_of(TeamSchema))
    def get(self):
        """List the teams"""
        return whole_page(Team.select().where(Team.workspace == caller().workspace.id).order_by(Team.name))


@blp.route("/custom-fields")
class CustomFields(MethodView):
    @blp.doc(operationId="listCustomFields")
    @requires()
    @blp.arguments(NoQuery, location="query", as_kwargs=True)
    @blp.response(200, page_of(CustomFieldSchema))
    def get(self):
        """List the custom fields a lead may carry"""
        return whole_page(CustomField.select().where(CustomField.workspace == caller().workspace.id)
                          .order_by(CustomField.position, CustomField.name))


@blp.route("/lost-reasons")
class LostReasons(MethodView):
    @blp.doc(operationId="listLostReasons")
    @requires()
    @blp.arguments(NoQuery, location="query", as_kwargs=True)
    @blp.response(200, page_of(LostReasonSchema))
    def get(self):
        """List the reasons a move to a lost status may give"""
        return whole_page(LostReason.select().where(LostReason.workspace == caller().workspace.id)
                          .order_by(LostReason.position, LostReason.id))


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
