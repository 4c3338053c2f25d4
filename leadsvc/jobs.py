"""Jobs: long changes (a deactivation's reassignments, bulk changes, imports) run in batches, with
progress, resumed after a crash.

A request that starts one calls `start()` in its transaction: the job row, its items in order
(fixed now: the leads a filter matched, the rows of a CSV file) and a `job` timer due at once.
The clock (clock.py) fires the timer in one transaction; `run_batch` does the next few items,
each in a savepoint through the same code a single change takes (a PATCH, a status move, a
create), moves the job's position past them and arms the timer again while items remain. The
items' changes and the job's progress commit together, so a process that dies mid-batch leaves
neither, and whichever process runs the clock next does that batch again: no item twice, none
skipped. A batch stops after BATCH_ITEMS items or BATCH_SECONDS, whichever comes first, so the
SQLite write lock is held briefly and API writes go on between batches.

Each kind of job is one function, registered with `@work(kind)`, that does one item as the job's
creator (its token and member are the actor, its scope bounds what the job touches). A Problem
or a validation error fails that item alone: counted in `failed`, the first JOB_ERRORS_KEPT
listed in `errors`, and the others go on. A job whose creator was deactivated stops (`failed`).
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any, Callable, Iterable, Mapping

import marshmallow as ma
import peewee as pw
from flask.views import MethodView

from . import clock
from .auth import Caller, effective_abilities, requires, visible_job_or_404
from .db import for_update, insert_rows, transaction
from .documents import JobSchema, one
from .extensions import Blueprint
from .history import Actor
from .models import JOB_ERRORS_KEPT, Job, JobItem, Lead, Member, Token, Workspace, utcnow
from .pipeline import item_failure
from .problems import Problem
from .refs import Refs, cached_refs
from .schemas import NoQuery

TIMER = "job"
# Items one firing does at most, and the time after which it stops early: a lead's change costs a
# few milliseconds, so a batch holds the SQLite write lock for tens of them.
BATCH_ITEMS = 25
BATCH_SECONDS = 0.05
ITEM_CHUNK = 500   # item rows per INSERT, within every database's limit on parameters
# What a batch reads of its items' leads: enough to name them, to lock them again, and to route them.
LEAD_COLUMNS = (Lead.id, Lead.public_id, Lead.workspace, Lead.owner, Lead.team, Lead.source, Lead.estimated_value,
                Lead.custom_fields)

# do(job, item, actor, refs): one item, in a savepoint of the batch; raises Problem or
# marshmallow's ValidationError when the item fails. `item` is the JobItem row.
Work = Callable[[Job, JobItem, Actor, Refs], None]
WORK: dict[str, Work] = {}

blp = Blueprint("jobs", __name__, url_prefix="/api/v1/jobs", description="Long changes run in batches: their progress.")


def work(kind: str) -> Callable[[Work], Work]:
    """Register the function that does one item of jobs of this kind."""
    def register(do: Work) -> Work:
        if WORK.setdefault(kind, do) is not do:
            raise ValueError(f"job kind {kind!r} already done by {WORK[kind].__qualname__}")
        return do
    return register


def start(kind: str, who: Caller, request_id: str | None, params: Mapping[str, Any],
          items: Iterable[Mapping[str, Any]]) -> Job:
    """A new queued job of this kind for the caller, with its items ({"lead": id} or {"data": ...})
    in order, due to run at once: in the caller's transaction, with the change that starts it."""
    if kind not in WORK:
        raise ValueError(f"no work is registered for job kind {kind!r}")
    rows = [{"position": position, "lead": item.get("lead"), "data": item.get("data")}
            for position, item in enumerate(items)]
    with transaction():
        job = Job.create(workspace=who.workspace.id, kind=kind, member=who.member.id, token=who.token.id,
                         request_id=request_id, params=dict(params), total=len(rows))
        for first in range(0, len(rows), ITEM_CHUNK):
            insert_rows(JobItem, [{"job": job.id, **row} for row in rows[first:first + ITEM_CHUNK]])
        clock.arm(TIMER, job.id, job.workspace_id, utcnow())
    return job


@clock.timer(TIMER)
def run_batch(job_id: int, due: datetime, now: datetime, settings: dict) -> None:
    """The next batch of a job's items, and its progress, in the clock's transaction; the timer
    is armed again while items remain."""
    job = for_update(Job.select().where(Job.id == job_id)).first()
    if job is None or job.state in ("succeeded", "failed"):
        return
    member = Member.get_or_none(Member.id == job.member_id)
    do = WORK.get(job.kind)
    if do is None or member is None or not member.active:
        _stop(job, "The member who started the job was deactivated; what it had done stays done."
              if do is not None else f"This version of leadsvc cannot run jobs of kind {job.kind}.")
        return
    workspace = Workspace.get_by_id(job.workspace_id)
    token = Token.get_by_id(job.token_id)
    who = Caller(token=token, member=member, workspace=workspace,
                 abilities=effective_abilities(member.role, token.abilities))
    actor = Actor(workspace=workspace, token=token, member=member, request_id=job.request_id, caller=who)
    refs = cached_refs(workspace, settings)
    job.state = "running"
    # Each item with what the kinds read of its lead (each change locks the lead again), in one
    # query for the batch.
    items = list(JobItem.select(JobItem, *LEAD_COLUMNS)
                 .join(Lead, pw.JOIN.LEFT_OUTER, on=(JobItem.lead == Lead.id))
                 .where((JobItem.job == job.id) & (JobItem.position >= job.position))
                 .order_by(JobItem.position).limit(BATCH_ITEMS))
    began = time.monotonic()
    for item in items:
        try:
            with transaction():   # a savepoint: an item that fails undoes only its own writes
                do(job, item, actor, refs)
        except (ma.ValidationError, Problem) as exc:
            if isinstance(exc, Problem) and exc.status >= 500:   # the database, not the item: the batch again later
                raise
            _failed(job, item, exc)
        job.done += 1
        job.position = item.position + 1
        if time.monotonic() - began >= BATCH_SECONDS:
            break
    if job.position >= job.total or not items:
        _finish(job, "succeeded")
    else:
        clock.arm(TIMER, job.id, job.workspace_id, now)
        job.save()


def item_name(item: JobItem) -> str:
    """How the job's errors name an item: a CSV row by its number, else the lead's public id."""
    if item.data is not None and "row" in item.data:
        return f"row {item.data['row']}"
    return item.lead.public_id if item.lead is not None else f"item {item.position + 1}"


def _failed(job: Job, item: JobItem, exc: ma.ValidationError | Problem) -> None:
    job.failed += 1
    if len(job.errors) >= JOB_ERRORS_KEPT:
        return
    status, messages = item_failure(exc, "item")
    code = exc.code if isinstance(exc, Problem) else "validation_failed"
    detail = " ".join(f"{name}: {text}" if name not in ("item", "row", "body") else text
                      for name, texts in messages.items() for text in texts)
    job.errors = [*job.errors, {"item": item_name(item), "code": code, "detail": detail}]


def _stop(job: Job, why: str) -> None:
    """The job itself cannot go on: failed, with why in its errors."""
    if len(job.errors) < JOB_ERRORS_KEPT:
        job.errors = [*job.errors, {"item": None, "code": "job_stopped", "detail": why}]
    _finish(job, "failed")


def _finish(job: Job, state: str) -> None:
    job.state, job.finished_at = state, utcnow()
    job.save()
    JobItem.delete().where(JobItem.job == job.id).execute()   # rows of a CSV hold personal data


def forget_rows(workspace_id: int, matches: Callable[[dict[str, str]], bool]) -> int:
    """Blank the waiting CSV rows of the workspace's unfinished imports that `matches` (given a
    row's cells by column: an erasure's phone or e-mail), in the caller's transaction; how many. A
    blank row is passed over when its turn comes, as a blank line of the file is."""
    waiting = (JobItem.select(JobItem.job, JobItem.position, JobItem.data, Job.params)
               .join(Job, on=(JobItem.job == Job.id))
               .where((Job.workspace == workspace_id) & Job.state.in_(["queued", "running"])
                      & JobItem.data.is_null(False) & (JobItem.position >= Job.position)).tuples())
    blanked = 0
    for job_id, position, data, params in list(waiting):
        if matches(dict(zip(params["columns"], data["cells"]))):
            (JobItem.update(data={"row": data["row"], "cells": []})
             .where((JobItem.job == job_id) & (JobItem.position == position)).execute())
            blanked += 1
    return blanked


@blp.route("/<job_id:public_id>")
class JobResource(MethodView):
    @blp.doc(operationId="getJob")
    @requires()
    @blp.arguments(NoQuery, location="query", as_kwargs=True)
    @blp.response(200, one(JobSchema))
    @blp.alt_response(404, response="NOT_FOUND")
    def get(self, public_id):
        """Read a job's progress (its creator and admins)"""
        return {"data": visible_job_or_404(public_id)}
