"""Pipeline reports: funnel, velocity, conversion and first response, in SQL over the caller's scope.

Every report starts from the leads the caller may see (auth.lead_scope) narrowed by the report
filters (listing.filter_leads), so a manager's report counts only its team. The database does the
counting, grouping and ranking; Python only adds up and divides a handful of aggregates and names
them.

Percentiles are by nearest rank: the p-th percentile of n sorted values is the value at 1-based
rank ceil(p * n / 100), so the median of an even count is the lower middle value, and every
reported time is one that really occurred. The same SQL picks it on SQLite and PostgreSQL.

Breakdowns by source, owner, channel and campaign list those with at least one counted lead, by
name, the leads without one last.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Mapping

import marshmallow as ma
import peewee as pw
from flask.views import MethodView

from . import sla
from .auth import Caller, caller, lead_scope, requires, sees_whole_workspace
from .db import database, is_postgres
from .documents import MemberRefSchema, RefSchema, StatusRefSchema, one
from .extensions import Blueprint
from .listing import ReportFilterQuery, filter_leads
from .models import CHANNELS, Lead, Transition, utcnow
from .refs import Refs, request_refs

blp = Blueprint("reports", __name__, url_prefix="/api/v1/reports",
                description="Funnel, velocity, conversion and speed to lead of the leads in the caller's scope.")

PERCENTILES = (50, 90)
PERCENTILE_NAMES = ("median_seconds", "p90_seconds")
RATE_DIGITS = 4

# PostgreSQL sorts each status's lead ids for the funnel's COUNT(DISTINCT) in work_mem. At its
# default, the sort over a large workspace's transitions spills to disk and the funnel is slower
# (bench/RESULTS.md); this much keeps it in memory.
FUNNEL_WORK_MEM = "32MB"


def rate(numerator: int, denominator: int) -> float | None:
    return round(numerator / denominator, RATE_DIGITS) if denominator else None


def scoped(query: pw.ModelSelect, who: Caller, filters: Mapping[str, Any], refs: Refs) -> pw.ModelSelect:
    """A query over Lead (or joined to it) narrowed to the caller's scope and the report filters."""
    return filter_leads(query.where(lead_scope(who)), filters, refs, refs.settings)


def seconds_between(start: pw.Node, end: pw.Node) -> pw.Node:
    """end - start in whole seconds, in the dialect of the database in use."""
    if is_postgres():
        return pw.Cast(pw.fn.ROUND(pw.fn.EXTRACT(pw.NodeList((pw.SQL("EPOCH FROM"), end - start)))), "BIGINT")
    return pw.Cast(pw.fn.ROUND((pw.fn.julianday(end) - pw.fn.julianday(start)) * 86400), "INTEGER")


def whole_workspace(who: Caller, filters: Mapping[str, Any]) -> bool:
    """Whether the report covers every lead of the workspace (an admin without filters)."""
    return sees_whole_workspace(who) and not filters


def transitions(who: Caller, filters: Mapping[str, Any], refs: Refs) -> pw.ModelSelect:
    """Transitions of the leads in scope that match the filters.

    For the whole workspace no lead is needed: the transition's own workspace column is the
    scope, and the transition indexes answer alone (0003_report_indexes). Otherwise the leads are
    a semi-join (IN), answered from a lead index without visiting a lead row per transition.
    """
    query = Transition.select().where(Transition.workspace == who.workspace.id)
    if whole_workspace(who, filters):
        return query
    return query.where(Transition.lead.in_(scoped(Lead.select(Lead.id), who, filters, refs)))


Durations = dict[str, "int | None"]


def ranked(query: pw.ModelSelect, value: pw.Node, bucket: pw.Node) -> dict[Any, Durations]:
    """{bucket: {count, median_seconds, p90_seconds}} of the values the query yields, in one pass.

    A window numbers the values within each bucket, then each percentile's rank is picked out.
    """
    rows = query.select(
        bucket.alias("bucket"), value.alias("val"),
        pw.fn.ROW_NUMBER().over(partition_by=[bucket], order_by=[value]).alias("pos"),
        pw.fn.COUNT(pw.SQL("*")).over(partition_by=[bucket]).alias("n"),
    ).alias("ranked")
    # ceil(n * p / 100) in integer arithmetic, the same on both databases.
    picks = [pw.fn.MAX(pw.Case(None, [(rows.c.pos == (rows.c.n * pw.SQL(str(p)) + pw.SQL("99")) / pw.SQL("100"),
                                       rows.c.val)]))
             for p in PERCENTILES]
    outer = pw.Select([rows], [rows.c.bucket, pw.fn.MAX(rows.c.n), *picks]).group_by(rows.c.bucket)
    return {key: {"count": int(count), **dict(zip(PERCENTILE_NAMES, map(int, values)))}
            for key, count, *values in outer.bind(database).tuples()}


def ranked_by_offset(query: pw.ModelSelect, value: pw.Node, count: int) -> Durations:
    """The same as ranked() for one group of `count` values: ORDER BY value LIMIT 1 OFFSET, from
    whichever end is nearer the rank (the value at rank r ascending is the one at rank count + 1 - r
    descending), so a p90 walks a tenth of the values. The query must yield no NULL values.

    On a covering index of the value this walks to each rank without reading a row or sorting,
    which a window over the whole workspace cannot avoid; otherwise it is a bounded top-N sort.
    """
    found: Durations = {"count": count}
    for p, name in zip(PERCENTILES, PERCENTILE_NAMES):
        rank = -(-count * p // 100)   # ceil(count * p / 100)
        order, skip = (value, rank - 1) if rank - 1 <= count - rank else (value.desc(), count - rank)
        found[name] = int(query.select(value).order_by(order).limit(1).offset(skip).scalar()) if count else None
    return found


def by_name(table: Mapping[int, Any]):
    """The sort key of (id, tally) items: by the record's name, the item without one (None) last."""
    return lambda item: (item[0] is None, table[item[0]].name if item[0] is not None else "", item[0] or 0)


# --- what the reports look like ---------------------------------------------------------------

RATE_HELP = "Rounded to 4 decimals; null when there is nothing to divide by."
RANK_HELP = "Nearest rank: the smallest value with at least p% of the values at or below it."


class FunnelStageSchema(ma.Schema):
    status = ma.fields.Nested(StatusRefSchema, required=True)
    reached = ma.fields.Integer(required=True, metadata={
        "description": "Leads with at least one transition into this status (each lead counted once)."})
    conversion = ma.fields.Float(allow_none=True, required=True, metadata={
        "description": "reached / reached of the previous stage that is not `lost`, in pipeline order; "
                       "null for the first stage and for lost stages. " + RATE_HELP})


class FunnelSchema(ma.Schema):
    leads = ma.fields.Integer(required=True, metadata={"description": "Leads in scope that match the filters."})
    stages = ma.fields.List(ma.fields.Nested(FunnelStageSchema), required=True,
                            metadata={"description": "Every status, in pipeline order."})


class DurationsSchema(ma.Schema):
    count = ma.fields.Integer(required=True)
    median_seconds = ma.fields.Integer(allow_none=True, required=True, metadata={
        "description": "The 50th percentile by nearest rank (of an even number of values, the lower middle one)."})
    p90_seconds = ma.fields.Integer(allow_none=True, required=True, metadata={
        "description": "The 90th percentile by nearest rank. " + RANK_HELP})


class VelocityStageSchema(DurationsSchema):
    status = ma.fields.Nested(StatusRefSchema, required=True, metadata={
        "description": "Time spent in this status, from every transition out of it."})


class VelocitySchema(ma.Schema):
    stages = ma.fields.List(ma.fields.Nested(VelocityStageSchema), required=True,
                            metadata={"description": "Every status, in pipeline order."})
    time_to_won = ma.fields.Nested(DurationsSchema, required=True, metadata={
        "description": "From a lead's creation to its move into the won status it is in now."})


class OutcomeSchema(ma.Schema):
    leads = ma.fields.Integer(required=True)
    open = ma.fields.Integer(required=True)
    won = ma.fields.Integer(required=True)
    lost = ma.fields.Integer(required=True)
    won_rate = ma.fields.Float(allow_none=True, required=True, metadata={
        "description": "won / (won + lost), by each lead's current status. " + RATE_HELP})


class SourceOutcomeSchema(OutcomeSchema):
    source = ma.fields.Nested(RefSchema, allow_none=True, required=True)


class OwnerOutcomeSchema(OutcomeSchema):
    owner = ma.fields.Nested(MemberRefSchema, allow_none=True, required=True)


class ChannelOutcomeSchema(OutcomeSchema):
    channel = ma.fields.String(required=True, metadata={"enum": list(CHANNELS)})


class CampaignOutcomeSchema(OutcomeSchema):
    campaign = ma.fields.String(allow_none=True, required=True, metadata={
        "description": "The leads' attribution.campaign_id, else their utm_campaign; null: leads with neither."})


class LostReasonCountSchema(ma.Schema):
    lost_reason = ma.fields.Nested(RefSchema, allow_none=True, required=True, metadata={
        "description": "null: lost leads without a reason (lost before the workspace defined reasons)."})
    count = ma.fields.Integer(required=True, metadata={"description": "Leads in a lost status with this reason."})


class ConversionSchema(ma.Schema):
    overall = ma.fields.Nested(OutcomeSchema, required=True)
    by_source = ma.fields.List(ma.fields.Nested(SourceOutcomeSchema), required=True,
                               metadata={"description": "Sources with at least one lead, by name; no source last."})
    by_owner = ma.fields.List(ma.fields.Nested(OwnerOutcomeSchema), required=True,
                              metadata={"description": "Owners with at least one lead, by name; no owner last."})
    by_channel = ma.fields.List(ma.fields.Nested(ChannelOutcomeSchema), required=True, metadata={
        "description": "Channels (attribution.channel) with at least one lead, by name."})
    by_campaign = ma.fields.List(ma.fields.Nested(CampaignOutcomeSchema), required=True, metadata={
        "description": "Campaigns with at least one lead, by name; the leads without a campaign last."})
    by_lost_reason = ma.fields.List(ma.fields.Nested(LostReasonCountSchema), required=True, metadata={
        "description": "The leads now lost, by the reason of their move: every reason of the workspace in its "
                       "order, then lost leads without a reason (if any)."})


class ResponseTallySchema(DurationsSchema):
    class Meta:
        description = ("First responses to the leads that have a response due time (`sla.due_at`); leads created "
                       "without an SLA are not in the report. median_seconds and p90_seconds are of the responded "
                       "leads' `sla.response_seconds` (working seconds from creation to the first response), null "
                       "when none responded.")

    count = ma.fields.Integer(required=True, metadata={
        "description": "Leads with a response due time: responded + overdue + those still due."})
    responded = ma.fields.Integer(required=True, metadata={
        "description": "Leads with a first response: met + missed."})
    met = ma.fields.Integer(required=True, metadata={
        "description": "Leads whose first response came at or before their due time."})
    missed = ma.fields.Integer(required=True, metadata={
        "description": "Leads whose first response came after their due time."})
    overdue = ma.fields.Integer(required=True, metadata={
        "description": "Leads without a response whose due time has passed."})


class SourceResponseSchema(ResponseTallySchema):
    source = ma.fields.Nested(RefSchema, allow_none=True, required=True)


class OwnerResponseSchema(ResponseTallySchema):
    owner = ma.fields.Nested(MemberRefSchema, allow_none=True, required=True)


class ResponseReportSchema(ResponseTallySchema):
    by_owner = ma.fields.List(ma.fields.Nested(OwnerResponseSchema), required=True, metadata={
        "description": "Owners with at least one lead in the report, by name; no owner last."})
    by_source = ma.fields.List(ma.fields.Nested(SourceResponseSchema), required=True, metadata={
        "description": "Sources with at least one lead in the report, by name; no source last."})


# --- the reports -----------------------------------------------------------------------------

@contextlib.contextmanager
def sort_memory(size: str) -> Iterator[None]:
    """On PostgreSQL, a transaction whose sorts may use `size` of memory each (SET LOCAL: the
    pooled connection gets its default back when it ends); on SQLite nothing."""
    if not is_postgres():
        yield
        return
    with database.atomic():
        database.execute_sql(f"SET LOCAL work_mem = '{size}'")
        yield


def funnel(who: Caller, filters: Mapping[str, Any], refs: Refs) -> dict[str, Any]:
    """How many leads reached each status (from transitions), and each step's conversion."""
    with sort_memory(FUNNEL_WORK_MEM):
        reached = dict(transitions(who, filters, refs)
                       .select(Transition.to_status, pw.fn.COUNT(pw.fn.DISTINCT(Transition.lead)))
                       .group_by(Transition.to_status).tuples())
    leads = scoped(Lead.select(pw.fn.COUNT(pw.SQL("*"))), who, filters, refs).scalar()
    stages, previous = [], None
    for status in refs.pipeline():
        count = reached.get(status.id, 0)
        conversion = None
        if status.kind != "lost":
            conversion = rate(count, previous) if previous is not None else None
            previous = count
        stages.append({"status": status, "reached": count, "conversion": conversion})
    return {"leads": leads, "stages": stages}


def velocity(who: Caller, filters: Mapping[str, Any], refs: Refs) -> dict[str, Any]:
    """Median and p90 time spent in each status, and from creation to won."""
    moves = transitions(who, filters, refs).where(Transition.from_status.is_null(False)
                                                  & Transition.seconds_in_from.is_null(False))
    if whole_workspace(who, filters):
        counts = dict(moves.select(Transition.from_status, pw.fn.COUNT(pw.SQL("*")))
                      .group_by(Transition.from_status).tuples())
        in_status = {status_id: ranked_by_offset(moves.where(Transition.from_status == status_id),
                                                 Transition.seconds_in_from, count)
                     for status_id, count in counts.items()}
    else:
        in_status = ranked(moves, Transition.seconds_in_from, bucket=Transition.from_status)
    won = scoped(Lead.select().where(Lead.status.in_(
        [status.id for status in refs.statuses.values() if status.kind == "won"] or [0])), who, filters, refs)
    to_won = ranked_by_offset(won, seconds_between(Lead.created_at, Lead.status_changed_at),
                              won.select(pw.fn.COUNT(pw.SQL("*"))).scalar())
    empty = {"count": 0, **dict.fromkeys(PERCENTILE_NAMES)}
    return {"stages": [{"status": status, **in_status.get(status.id, empty)}
                       for status in refs.pipeline()],
            "time_to_won": to_won}


CONVERSION_GROUPS = (Lead.status, Lead.source, Lead.owner, Lead.channel, Lead.campaign)


def conversion_groups(who: Caller, filters: Mapping[str, Any], refs: Refs) -> pw.ModelSelect:
    """How many leads in scope have each combination of status, source, owner, channel and
    campaign: one GROUP BY for every breakdown, in the order of the report index (0021), which
    holds every column it reads."""
    return scoped(Lead.select(*CONVERSION_GROUPS, pw.fn.COUNT(pw.SQL("*"))), who, filters, refs) \
        .group_by(*CONVERSION_GROUPS)


def conversion(who: Caller, filters: Mapping[str, Any], refs: Refs) -> dict[str, Any]:
    """won / (won + lost) by each lead's current status: overall, by source, owner, channel and
    campaign; lost leads by reason."""
    overall: dict[str, int] = {"open": 0, "won": 0, "lost": 0}
    breakdowns: tuple[dict[Any, dict[str, int]], ...] = ({}, {}, {}, {})   # by source, owner, channel, campaign
    for status_id, *keys, count in conversion_groups(who, filters, refs).tuples():
        kind = refs.statuses[status_id].kind
        overall[kind] += count
        for breakdown, key in zip(breakdowns, keys):
            breakdown.setdefault(key, {"open": 0, "won": 0, "lost": 0})[kind] += count
    by_source, by_owner, by_channel, by_campaign = breakdowns

    def outcome(tally: dict[str, int]) -> dict[str, Any]:
        return {"leads": sum(tally.values()), **tally, "won_rate": rate(tally["won"], tally["won"] + tally["lost"])}

    # Only lost leads with a reason are in the partial index this reads (0010).
    lost_statuses = [status.id for status in refs.statuses.values() if status.kind == "lost"] or [0]
    reasons = dict(scoped(Lead.select(Lead.lost_reason, pw.fn.COUNT(pw.SQL("*"))), who, filters, refs)
                   .where(Lead.lost_reason.is_null(False) & Lead.status.in_(lost_statuses))
                   .group_by(Lead.lost_reason).tuples())
    by_lost_reason = [{"lost_reason": reason, "count": reasons.get(reason_id, 0)}
                      for reason_id, reason in refs.lost_reasons.items()]
    if without := overall["lost"] - sum(reasons.values()):
        by_lost_reason.append({"lost_reason": None, "count": without})

    return {
        "overall": outcome(overall),
        "by_source": [{"source": refs.sources.get(key), **outcome(tally)}
                      for key, tally in sorted(by_source.items(), key=by_name(refs.sources))],
        "by_owner": [{"owner": refs.members.get(key), **outcome(tally)}
                     for key, tally in sorted(by_owner.items(), key=by_name(refs.members))],
        "by_channel": [{"channel": key, **outcome(tally)} for key, tally in sorted(by_channel.items())],
        "by_campaign": [{"campaign": key, **outcome(tally)} for key, tally in
                        sorted(by_campaign.items(), key=lambda item: (item[0] is None, item[0] or ""))],
        "by_lost_reason": by_lost_reason,
    }


RESPONSE_STATES = ("met", "missed", "overdue")


def response(who: Caller, filters: Mapping[str, Any], refs: Refs) -> dict[str, Any]:
    """First responses met, missed and overdue, and their working seconds, overall, by owner and by source.

    One GROUP BY owner, source counts each pair (sla.condition is the rule of each state), which
    Python adds up per owner, per source and overall. The percentiles are of the responded leads:
    for the whole workspace each owner's, each source's and the overall ones are walks down an
    index of the seconds (0019); otherwise a window per breakdown ranks the leads in scope, and
    the overall ones are a top-N sort.
    """
    leads = scoped(Lead.select(), who, filters, refs).where(Lead.response_due_at.is_null(False))
    now = utcnow()
    in_state = [pw.fn.COUNT(pw.Case(None, [(sla.condition([state], now), 1)])) for state in RESPONSE_STATES]
    cells = leads.select(Lead.owner, Lead.source, pw.fn.COUNT(pw.SQL("*")), pw.fn.COUNT(Lead.first_response_at),
                         *in_state).group_by(Lead.owner, Lead.source).tuples()
    keys = ("count", "responded", *RESPONSE_STATES)
    overall: dict[str, int] = dict.fromkeys(keys, 0)
    by_owner: dict[int | None, dict[str, int]] = {}
    by_source: dict[int | None, dict[str, int]] = {}
    for owner_id, source_id, *counts in cells:
        for tally in (overall, by_owner.setdefault(owner_id, dict.fromkeys(keys, 0)),
                      by_source.setdefault(source_id, dict.fromkeys(keys, 0))):
            for key, count in zip(keys, counts):
                tally[key] += count

    answered = leads.where(Lead.first_response_seconds.is_null(False))
    seconds = Lead.first_response_seconds

    def percentiles(column: pw.Field, tallies: dict[int | None, dict[str, int]]) -> dict[int | None, Durations]:
        if whole_workspace(who, filters):
            return {key: ranked_by_offset(answered.where(column == key), seconds, tally["responded"])
                    for key, tally in tallies.items() if tally["responded"]}
        return ranked(answered, seconds, bucket=column)

    def with_percentiles(tally: dict[str, int], durations: Durations | None) -> dict[str, Any]:
        found = durations or {}
        return {**tally, **{name: found.get(name) for name in PERCENTILE_NAMES}}

    owner_times, source_times = percentiles(Lead.owner, by_owner), percentiles(Lead.source, by_source)
    return {
        **with_percentiles(overall, ranked_by_offset(answered, seconds, overall["responded"])),
        "by_owner": [{"owner": refs.members.get(key), **with_percentiles(tally, owner_times.get(key))}
                     for key, tally in sorted(by_owner.items(), key=by_name(refs.members))],
        "by_source": [{"source": refs.sources.get(key), **with_percentiles(tally, source_times.get(key))}
                      for key, tally in sorted(by_source.items(), key=by_name(refs.sources))],
    }


# --- views -----------------------------------------------------------------------------------

@blp.route("/funnel")
class Funnel(MethodView):
    @blp.doc(operationId="getFunnelReport")
    @requires("reports:read")
    @blp.arguments(ReportFilterQuery(), location="query")
    @blp.response(200, one(FunnelSchema))
    def get(self, filters):
        """How many leads reached each status, and step-to-step conversion"""
        return {"data": funnel(caller(), filters, request_refs())}


@blp.route("/velocity")
class Velocity(MethodView):
    @blp.doc(operationId="getVelocityReport")
    @requires("reports:read")
    @blp.arguments(ReportFilterQuery(), location="query")
    @blp.response(200, one(VelocitySchema))
    def get(self, filters):
        """Median and p90 time in each status, and median time to won"""
        return {"data": velocity(caller(), filters, request_refs())}


@blp.route("/conversion")
class Conversion(MethodView):
    @blp.doc(operationId="getConversionReport")
    @requires("reports:read")
    @blp.arguments(ReportFilterQuery(), location="query")
    @blp.response(200, one(ConversionSchema))
    def get(self, filters):
        """Won rate overall and by source, owner, channel and campaign; lost leads by reason"""
        return {"data": conversion(caller(), filters, request_refs())}


@blp.route("/response")
class ResponseReport(MethodView):
    @blp.doc(operationId="getResponseReport")
    @requires("reports:read")
    @blp.arguments(ReportFilterQuery(), location="query")
    @blp.response(200, one(ResponseReportSchema))
    def get(self, filters):
        """First responses met, missed and overdue, and working time to the first response"""
        return {"data": response(caller(), filters, request_refs())}
