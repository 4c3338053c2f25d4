"""The tasks blueprint: follow-ups on leads. Views only; the writes are in followups.py.

Every route finds the task (or its lead) through the caller's scope first, so a task on a lead
outside it is 404 exactly like a missing one.
"""

from __future__ import annotations

from flask import request
from flask.views import MethodView

from . import cursor, followups
from .auth import caller, requires, visible_lead_or_404, visible_task_or_404, visible_tasks
from .conditional import ETAG_HEADER, etag
from .documents import LeadListMetaSchema, TaskDocumentSchema, TaskSchema, page_of, prebuilt_response, task_documents
from .extensions import Blueprint
from .history import actor
from .listing import TaskListQuery, page_document, task_page, unknown_filters
from .models import Lead, Task
from .refs import request_refs
from .schemas import PageQuery, TaskCompleteSchema, TaskCreateSchema, TaskPatchSchema

blp = Blueprint("tasks", __name__, url_prefix="/api/v1",
                description="Follow-ups on leads: who to call next, and what came of it.")


def task_url(public_id: str) -> str:
    return f"{request.script_root}{blp.url_prefix}/tasks/{public_id}"


def answer(task: Task, status: int = 200, headers: dict[str, str] | None = None):
    """A task's document, with its ETag."""
    return prebuilt_response({"data": task_documents([task], request_refs())[0]}, status,
                             {"ETag": etag(task), **(headers or {})})


def lead_task_phases(lead: Lead) -> list[cursor.Phase]:
    """A lead's tasks: open ones first, earliest due first; then done and cancelled ones, most
    recently closed first."""
    of_lead = Task.select().where(Task.lead == lead.id)
    return [cursor.Phase(of_lead.where(Task.state == "open"), cursor.Order(Task.due_at, Task.public_id, False),
                         cursor.fingerprint("lead-tasks", lead.public_id, "open")),
            cursor.Phase(of_lead.where(Task.state.in_(["done", "cancelled"])),
                         cursor.Order(Task.closed_at, Task.public_id, True),
                         cursor.fingerprint("lead-tasks", lead.public_id, "closed"))]


@blp.route("/leads/<lead_id:public_id>/tasks")
class LeadTasks(MethodView):
    @blp.doc(operationId="listLeadTasks")
    @requires("leads:read")
    @blp.arguments(PageQuery(), location="query")
    @blp.response(200, page_of(TaskSchema, LeadListMetaSchema))
    def get(self, params, public_id):
        """List a lead's tasks: open ones by due time, then closed ones, most recent first"""
        lead = visible_lead_or_404(public_id)
        rows, after = cursor.phased_page(lead_task_phases(lead), params["page_size"], params.get("page_after"))
        return prebuilt_response(page_document(task_documents(rows, request_refs()), after))

    @blp.doc(operationId="createLeadTask")
    @requires("tasks:write")
    @blp.arguments(TaskCreateSchema())
    @blp.response(201, TaskDocumentSchema, description="Created; Location points at the new task.",
                  headers={"Location": {"schema": {"type": "string"}}, **ETAG_HEADER})
    @blp.alt_response(409, response="CONFLICT")
    def post(self, data, public_id):
        """Add a follow-up task to a lead"""
        task = followups.create_task(visible_lead_or_404(public_id), data, actor(), request_refs())
        return answer(task, 201, {"Location": task_url(task.public_id)})


@blp.route("/tasks")
class Tasks(MethodView):
    @blp.doc(operationId="listTasks")
    @requires("leads:read")
    @blp.arguments(TaskListQuery(), location="query")
    @blp.response(200, page_of(TaskSchema, LeadListMetaSchema))
    def get(self, params):
        """List the tasks on leads in the caller's scope (open ones by default, earliest due first)"""
        unknown = unknown_filters(request.args, TaskListQuery)
        if unknown:
            return {"data": [], "links": {"next": None}, "meta": {"has_more": False, "unknown_filters": unknown}}
        refs = request_refs()
        rows, after = task_page(visible_tasks(), params, refs, caller().member.id)
        return prebuilt_response(page_document(task_documents(rows, refs), after))


@blp.route("/tasks/<task_id:public_id>")
class TaskResource(MethodView):
    @blp.doc(operationId="getTask")
    @requires("leads:read")
    @blp.response(200, TaskDocumentSchema, headers=ETAG_HEADER)
    def get(self, public_id):
        """Read a task"""
        return answer(visible_task_or_404(public_id))

    @blp.doc(operationId="updateTask")
    @requires("tasks:write")
    @blp.arguments(TaskPatchSchema())
    @blp.response(200, TaskDocumentSchema, headers=ETAG_HEADER)
    @blp.alt_response(409, response="CONFLICT")
    @blp.alt_response(412, response="PRECONDITION_FAILED")
    def patch(self, changes, public_id):
        """Change an open task (moving due_at or remind_at arms its reminders again)"""
        task = followups.update_task(visible_task_or_404(public_id), changes, actor(), request_refs(),
                                     if_match=request.headers.get("If-Match"))
        return answer(task)


@blp.route("/tasks/<task_id:public_id>/complete")
class TaskCompletion(MethodView):
    @blp.doc(operationId="completeTask")
    @requires("tasks:write")
    @blp.arguments(TaskCompleteSchema(), required=False)
    @blp.response(200, TaskDocumentSchema, headers=ETAG_HEADER)
    @blp.alt_response(409, response="CONFLICT")
    @blp.alt_response(412, response="PRECONDITION_FAILED")
    def post(self, data, public_id):
        """Complete a task; a contact task logs its activity on the lead"""
        task = followups.complete_task(visible_task_or_404(public_id), data.get("outcome"), actor(), request_refs(),
                                       if_match=request.headers.get("If-Match"))
        return answer(task)


@blp.route("/tasks/<task_id:public_id>/cancel")
class TaskCancellation(MethodView):
    @blp.doc(operationId="cancelTask")
    @requires("tasks:write")
    @blp.response(200, TaskDocumentSchema, headers=ETAG_HEADER)
    @blp.alt_response(409, response="CONFLICT")
    @blp.alt_response(412, response="PRECONDITION_FAILED")
    def post(self, public_id):
        """Cancel an open task"""
        task = followups.cancel_task(visible_task_or_404(public_id), actor(), request_refs(),
                                     if_match=request.headers.get("If-Match"))
        return answer(task)
