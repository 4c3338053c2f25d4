"""Tasks on leads: create, change, complete and cancel, one transaction each, with the audit entry,
timeline activity and event in it; and what a lead keeps of its open tasks (next_task_due_at,
open_tasks), rewritten in the same transaction as every task change.

A task belongs to its lead's scope: every write locks the lead through the caller's scope first
(404 outside it, 409 once erased), then the task. Completing a contact task logs its activity
through pipeline.log_activity, the code behind POST /leads/{id}/activities.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Callable, Iterable, Mapping

import peewee as pw

from . import clock, events, pipeline
from .auth import member_sees_lead
from .conditional import check_if_match, lock_lead
from .db import for_update, transaction
from .documents import task_documents
from .history import Actor, plain, record_activity, record_audit
from .models import CONTACT_KINDS, NO_TASK, Lead, Member, Task, Workspace, utcnow
from .problems import Conflict, NotFound, ValidationFailed
from .refs import Refs, cached_refs

# The timer each of a task's times arms: its reminder, and its going overdue.
REMINDERS = {"remind_at": "task.due", "due_at": "task.overdue"}
# The fields a PATCH may change, in the order an audit entry lists them.
TASK_FIELDS = ("kind", "title", "notes", "due_at", "remind_at", "assignee")


def arm_reminders(task: Task, moved: Iterable[str] = ("remind_at", "due_at")) -> None:
    """The task's timers, in the transaction of its change: while it is open, `task.due` at
    remind_at (if any) and `task.overdue` at due_at, armed again when that time moved (a change
    of anything else leaves a reminder that has fired alone); none once it is closed."""
    if task.state != "open":
        for kind in REMINDERS.values():
            clock.disarm(kind, task.id)
        return
    if "remind_at" in moved:
        if task.remind_at is None:
            clock.disarm(REMINDERS["remind_at"], task.id)
        else:
            clock.arm(REMINDERS["remind_at"], task.id, task.workspace_id, task.remind_at)
    if "due_at" in moved:
        clock.arm(REMINDERS["due_at"], task.id, task.workspace_id, task.due_at)


def arm_reminders_ahead(workspace_id: int, now: datetime) -> None:
    """The timers of the workspace's open tasks whose times are still ahead, for tasks written in
    bulk (the demo): as if the clock had run all along, what fell due before `now` has fired."""
    for column, kind in REMINDERS.items():
        time = getattr(Task, column)
        clock.arm_from(kind, Task.select().where((Task.workspace == workspace_id) & (Task.state == "open") & (time > now)),
                       Task.workspace, Task.id, time)


@clock.timer("task.due")
def remind(task_id: int, due: datetime, now: datetime, settings: dict) -> None:
    """An open task's reminder time came: task.due."""
    _announce("task.due", task_id, lambda task: task.remind_at == due, settings)


@clock.timer("task.overdue")
def overdue(task_id: int, due: datetime, now: datetime, settings: dict) -> None:
    """An open task's due time passed: task.overdue."""
    _announce("task.overdue", task_id, lambda task: task.due_at == due, settings)


def _announce(event_type: str, task_id: int, still_due: Callable[[Task], bool], settings: dict) -> None:
    """The task's event, if the task is still open, still due at the timer's time, and on a lead
    that was not erased. Read without locks: a change to the task locks it before its timer, the
    clock the timer first (docs/design.md, The clock)."""
    task = Task.get_or_none(Task.id == task_id)
    if task is None or task.state != "open" or not still_due(task):
        return
    lead = Lead.get_by_id(task.lead_id)
    if lead.erased_at is not None:
        return
    refs = cached_refs(Workspace.get_by_id(task.workspace_id), settings)
    events.record(refs, event_type, lead, lambda: {"task": task_documents([task], refs)[0]})


def create_task(lead: Lead, data: Mapping[str, Any], actor: Actor, refs: Refs) -> Task:
    """A new open task on the lead: its timeline entry, audit entry and event, and the lead's next task."""
    with transaction():
        current = lock_lead(lead, actor)
        _check_reachable(current, data["kind"])
        assignee = _assignee(data.get("assignee"), current, actor, refs)
        _check_reminder(data.get("remind_at"), data["due_at"])
        now = utcnow()
        task = Task.create(workspace=current.workspace_id, lead=current.id, lead_owner=current.owner_id,
                           lead_team=current.team_id, kind=data["kind"], title=data["title"], notes=data.get("notes"),
                           due_at=data["due_at"], remind_at=data.get("remind_at"), assignee=assignee.id,
                           created_at=now, updated_at=now, **actor.columns())
        record_activity(current, actor, "task_created", task.title,
                        {"task": task.public_id, "kind": task.kind, "due_at": plain(task.due_at)})
        sync_lead(current)
        recorded = {"kind": task.kind, "title": task.title, "notes": task.notes, "due_at": task.due_at,
                    "remind_at": task.remind_at, "assignee": assignee}
        record_audit(current, actor, "task_created", {
            "task": {"old": None, "new": task.public_id},
            **{name: {"old": None, "new": plain(value)} for name, value in recorded.items() if value is not None}})
        events.record(refs, "task.created", current, lambda: {"task": task_documents([task], refs)[0]})
        arm_reminders(task)
    return task


def update_task(task: Task, changes: Mapping[str, Any], actor: Actor, refs: Refs, *,
                if_match: str | None = None) -> Task:
    """Change the fields sent of an open task (409 once done or cancelled); none changed writes nothing."""
    with transaction():
        lead, current = lock_open_task(task, actor, if_match)
        wanted = {name: changes[name] for name in TASK_FIELDS if name in changes and name != "assignee"}
        if "assignee" in changes:
            wanted["assignee"] = _assignee(changes["assignee"], lead, actor, refs)
        if wanted.get("kind", current.kind) != current.kind:
            _check_reachable(lead, wanted["kind"])
        _check_reminder(wanted.get("remind_at", current.remind_at), wanted.get("due_at", current.due_at))
        diff: dict[str, dict[str, Any]] = {}
        for name, new in wanted.items():
            old = refs.members.get(current.assignee_id) if name == "assignee" else getattr(current, name)
            if plain(old) != plain(new):
                diff[name] = {"old": plain(old), "new": plain(new)}
                setattr(current, name, new)
        if not diff:
            return current
        current.version, current.updated_at = current.version + 1, utcnow()
        current.save()
        if "due_at" in diff:
            sync_lead(lead)
        _record_change(lead, current, diff, actor, refs)
    return current


def complete_task(task: Task, outcome: str | None, actor: Actor, refs: Refs, *, if_match: str | None = None) -> Task:
    """Mark an open task done (409 otherwise) and log what was done: a contact task's activity, as
    POST /leads/{id}/activities logs it (last_activity_at, score, do-not-contact), else task_completed."""
    with transaction():
        lead, current = lock_open_task(task, actor, if_match)
        now = utcnow()
        current.done_at, current.outcome = now, outcome
        summary, data = outcome or current.title, {"task": current.public_id}
        if current.kind in CONTACT_KINDS:
            lead, _ = pipeline.log_activity(lead, current.kind, summary, None, actor, refs, data)
        else:
            record_activity(lead, actor, "task_completed", summary, data)
        _close(lead, current, "done", now, actor, refs, {"outcome": {"old": None, "new": outcome}} if outcome else {})
    return current


def cancel_task(task: Task, actor: Actor, refs: Refs, *, if_match: str | None = None) -> Task:
    """Cancel an open task (409 otherwise): its timeline entry, audit entry and event."""
    with transaction():
        lead, current = lock_open_task(task, actor, if_match)
        record_activity(lead, actor, "task_cancelled", current.title, {"task": current.public_id})
        _close(lead, current, "cancelled", utcnow(), actor, refs)
    return current


# What closing a task in each way is called in audit entries (task_...) and events (task....).
CLOSED_AS = {"done": "completed", "cancelled": "cancelled"}


def _close(lead: Lead, task: Task, state: str, now: datetime, actor: Actor, refs: Refs,
           changes: Mapping[str, Any] | None = None) -> None:
    """Save the locked open task as closed (done or cancelled), then what every closing writes:
    the lead's next task, the audit entry, the event, and no more reminders."""
    task.state, task.closed_at = state, now
    task.version, task.updated_at = task.version + 1, now
    task.save()
    sync_lead(lead)
    named = CLOSED_AS[state]
    record_audit(lead, actor, f"task_{named}", {"task": {"old": task.public_id, "new": task.public_id},
                                               "state": {"old": "open", "new": state}, **(changes or {})})
    events.record(refs, f"task.{named}", lead, lambda: {"task": task_documents([task], refs)[0]})
    arm_reminders(task)


def follow_owner(lead: Lead, previous_owner_id: int | None, actor: Actor, refs: Refs) -> None:
    """After a change of the lead's owner (in its transaction, the lead locked): its tasks take the
    lead's new scope columns, and its open tasks assigned to the previous owner go to the new one.
    Every path that changes an owner calls this."""
    Task.update(lead_owner=lead.owner_id, lead_team=lead.team_id).where(Task.lead == lead.id).execute()
    if previous_owner_id is None or lead.owner_id is None:
        return   # nobody to take them over: they stay with whoever has them
    moving = for_update(Task.select().where((Task.lead == lead.id) & (Task.state == "open")
                                            & (Task.assignee == previous_owner_id)).order_by(Task.id))
    new_owner = refs.members.get(lead.owner_id)
    for task in list(moving):
        diff = {"assignee": {"old": plain(refs.members.get(previous_owner_id)), "new": plain(new_owner)}}
        task.assignee, task.version, task.updated_at = lead.owner_id, task.version + 1, utcnow()
        task.save()
        _record_change(lead, task, diff, actor, refs)


def lock_task(task: Task, actor: Actor) -> tuple[Lead, Task]:
    """The task's lead and the task, locked, if the actor may still change them: the lead in its
    scope (else 404) and not erased (409), the task still there (404)."""
    lead = lock_lead(Lead.get_by_id(task.lead_id), actor)
    current = for_update(Task.select().where(Task.id == task.id)).first()
    if current is None:
        raise NotFound(f"No task {task.public_id}.")
    return lead, current


def lock_open_task(task: Task, actor: Actor, if_match: str | None) -> tuple[Lead, Task]:
    """lock_task, then the task's If-Match (412) and its state: only an open task changes (409)."""
    lead, current = lock_task(task, actor)
    check_if_match(current, if_match, "task")
    if current.state != "open":
        raise Conflict(f"Task {current.public_id} is already {current.state}: only an open task can change.")
    return lead, current


def sync_lead(lead: Lead) -> None:
    """The locked lead's next_task_due_at and open_tasks from its open tasks, saved when they moved."""
    earliest, count = (Task.select(pw.fn.MIN(Task.due_at).python_value(Task.due_at.python_value), pw.fn.COUNT(Task.id))
                       .where((Task.lead == lead.id) & (Task.state == "open")).tuples().get())
    if (lead.next_task_due_at, lead.open_tasks) == (earliest, count):
        return
    lead.next_task_due_at, lead.open_tasks, lead.task_sort_at = earliest, count, earliest or NO_TASK
    lead.version, lead.updated_at = lead.version + 1, utcnow()
    lead.save()


def _record_change(lead: Lead, task: Task, diff: dict[str, dict[str, Any]], actor: Actor, refs: Refs) -> None:
    record_audit(lead, actor, "task_updated", {"task": {"old": task.public_id, "new": task.public_id}, **diff})
    events.record(refs, "task.updated", lead, lambda: {"task": task_documents([task], refs)[0], "changes": diff})
    arm_reminders(task, diff)


def _check_reachable(lead: Lead, kind: str) -> None:
    if lead.do_not_contact and kind in pipeline.OUTREACH_KINDS:
        raise Conflict(f"Lead {lead.public_id} is do-not-contact (its consent was withdrawn, or it was set): "
                       f"it takes no {kind} task.")


def _check_reminder(remind_at: datetime | None, due_at: datetime) -> None:
    if remind_at is not None and remind_at > due_at:
        raise ValidationFailed.field("remind_at", "The reminder must not come after due_at.")


def _assignee(public_id: str | None, lead: Lead, actor: Actor, refs: Refs) -> Member:
    """Who a task on the lead goes to: the one named, else the lead's owner, else the caller's
    member. Only someone who sees the lead may hold it (its owner, a manager of its team, an admin),
    so a task never widens a scope; and only an active member (else 422 on assignee)."""
    if public_id is None:
        member = refs.members.get(lead.owner_id) or actor.member
    else:
        member = refs.by_public_id(refs.members, public_id)
    if member is None or not member_sees_lead(member, lead):
        raise ValidationFailed.field("assignee", "The assignee must be the lead's owner, a manager of the lead's team "
                                                 "or an admin: someone who sees the lead.")
    if not member.active:
        raise ValidationFailed.field("assignee", "This member is deactivated and cannot hold tasks.")
    return member
