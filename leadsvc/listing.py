"""The lead list: filters, sorts and keyset pages, shared by the list, the CSV export and the reports;
and the task list, which takes the same kinds of filters."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from typing import Any, Iterable, Mapping
from urllib.parse import urlencode
from zoneinfo import ZoneInfo

import marshmallow as ma
import peewee as pw
from flask import request

from . import cursor, search, sla
from .config import Settings
from .db import any_of, read_rows
from .documents import LEAD_COLUMNS
from .fields import SPACE_PATTERN, Choices, comma_separated, list_items, trim
from .models import CHANNELS, NO_TASK, TASK_KINDS, TASK_STATES, Lead, Task, public_id_pattern, public_id_regex, utcnow
from .refs import Refs
from .schemas import PageQuery
from .scoring import band_ranges

PERIOD_KEYWORDS = ("today", "yesterday", "last_7_days", "last_30_days", "last_90_days", "this_week",
                   "this_month", "last_month", "this_quarter", "this_year")
BANDS = ("hot", "warm", "cold")
FILTER_KEY = re.compile(r"^filter\[.*\]$")
MIN_YEAR, MAX_YEAR = 1900, 9998


# --- created_at periods ----------------------------------------------------------------------

@dataclass(frozen=True)
class Period:
    """A created_at filter: a keyword, or a range whose ends are dates, datetimes or open."""

    keyword: str | None = None
    start: date | datetime | None = None
    end: date | datetime | None = None

    def utc_bounds(self, timezone: str, today: date | None = None) -> tuple[datetime | None, datetime | None]:
        """[start, end) as naive UTC datetimes; dates are whole days in the workspace's time zone."""
        zone = ZoneInfo(timezone)
        today = today or datetime.now(zone).date()
        if self.keyword:
            first, after = _keyword_days(self.keyword, today)
            return _utc(first, zone), _utc(after, zone)
        start = _utc(self.start, zone) if self.start is not None else None
        if self.end is None:
            end = None
        elif isinstance(self.end, datetime):
            end = _utc(self.end, zone) + timedelta(microseconds=1)   # datetimes: inclusive
        else:
            end = _utc(self.end + timedelta(days=1), zone)           # dates: the whole last day
        return start, end


def _keyword_days(keyword: str, today: date) -> tuple[date, date]:
    """The first day and the day after the last of a keyword period."""
    tomorrow = today + timedelta(days=1)
    if keyword == "today":
        return today, tomorrow
    if keyword == "yesterday":
        return today - timedelta(days=1), today
    if keyword == "tomorrow":
        return tomorrow, tomorrow + timedelta(days=1)
    if keyword == "next_7_days":
        return today, today + timedelta(days=7)
    if keyword.startswith("last_") and keyword.endswith("_days"):
        return today - timedelta(days=int(keyword.split("_")[1]) - 1), tomorrow
    if keyword == "this_week":
        monday = today - timedelta(days=today.weekday())
        return monday, monday + timedelta(days=7)
    month_start = today.replace(day=1)
    next_month = (month_start + timedelta(days=32)).replace(day=1)
    if keyword == "this_month":
        return month_start, next_month
    if keyword == "last_month":
        return (month_start - timedelta(days=1)).replace(day=1), month_start
    if keyword == "this_quarter":
        first = today.replace(month=3 * ((today.month - 1) // 3) + 1, day=1)
        return first, (first + timedelta(days=95)).replace(day=1)
    return today.replace(month=1, day=1), today.replace(year=today.year + 1, month=1, day=1)   # this_year


def _utc(value: date | datetime, zone: ZoneInfo) -> datetime:
    if not isinstance(value, datetime):
        value = datetime.combine(value, time.min)
    if value.tzinfo is None:
        value = value.replace(tzinfo=zone)
    return value.astimezone(ZoneInfo("UTC")).replace(tzinfo=None)


def parse_period(text: str, keywords: tuple[str, ...] = PERIOD_KEYWORDS) -> Period:
    """One of the keywords (`last_30_days`), or `FROM..TO` with ISO dates or datetimes and either end open."""
    text = trim(text)
    if text in keywords:
        return Period(keyword=text)
    if ".." not in text:
        raise ValueError(f"Use FROM..TO (ISO dates or datetimes, either end open) or one of: {', '.join(keywords)}.")
    first, _, last = text.partition("..")
    start, end = _moment(first), _moment(last)
    if start is None and end is None:
        raise ValueError("Give at least one end of the range, e.g. 2026-01-01.. or ..2026-01-31.")
    if start is not None and end is not None and _comparable(start) > _comparable(end):
        raise ValueError("The range starts after it ends.")
    return Period(start=start, end=end)


def _moment(text: str) -> date | datetime | None:
    text = trim(text)
    if not text:
        return None
    try:
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
            moment = date.fromisoformat(text)
        else:
            moment = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text!r} is not an ISO date (2026-01-31) or datetime (2026-01-31T09:00:00+05:30).") from None
    if not MIN_YEAR <= moment.year <= MAX_YEAR:   # the edges of the calendar cannot take a time zone shift
        raise ValueError(f"Use years from {MIN_YEAR} to {MAX_YEAR}.")
    return moment


def _comparable(value: date | datetime) -> datetime:
    if not isinstance(value, datetime):
        value = datetime.combine(value, time.min)
    return value.replace(tzinfo=None) if value.tzinfo is None else value.astimezone(ZoneInfo("UTC")).replace(tzinfo=None)


# --- query parameters ------------------------------------------------------------------------

class IdList(ma.fields.String):
    """Comma-separated public ids of one kind (OR)."""

    def __init__(self, prefix: str, **kwargs):
        self.pattern = public_id_pattern(prefix)
        self.prefix = prefix
        super().__init__(metadata={"description": f"{prefix}... ids, comma-separated for several.",
                                   "pattern": comma_separated(public_id_regex(prefix))}, **kwargs)

    def _deserialize(self, value, attr, data, **kwargs):
        ids = list_items(super()._deserialize(value, attr, data, **kwargs))
        bad = [i for i in ids if not self.pattern.match(i)]
        if bad:
            raise ma.ValidationError(f"Not {self.prefix}... ids: {', '.join(bad)}.")
        return ids


NO_OWNER = "none"


class MemberIds(IdList):
    """Member ids, or a keyword that stands for some (filter[owner]'s none, filter[assignee]'s me)."""

    def __init__(self, keyword: str, meaning: str, **kwargs):
        super().__init__("mem_", **kwargs)
        self.keyword = keyword
        self.metadata.update(description=f"mem_... ids, or {keyword} ({meaning}), comma-separated for several.",
                             pattern=comma_separated(f"({public_id_regex('mem_')}|{keyword})"))

    def _deserialize(self, value, attr, data, **kwargs):
        items = list_items(ma.fields.String._deserialize(self, value, attr, data, **kwargs))
        bad = [item for item in items if item != self.keyword and not self.pattern.match(item)]
        if bad:
            raise ma.ValidationError(f"Not mem_... ids nor {self.keyword}: {', '.join(bad)}.")
        return items


class Bands(ma.fields.String):
    def _deserialize(self, value, attr, data, **kwargs):
        bands = list_items(super()._deserialize(value, attr, data, **kwargs))
        if any(b not in BANDS for b in bands):
            raise ma.ValidationError("Use hot, warm and/or cold, comma-separated.")
        return list(dict.fromkeys(bands))   # each band once: one OR term per band, however often named


class CreatedAt(ma.fields.String):
    def _deserialize(self, value, attr, data, **kwargs):
        try:
            return parse_period(super()._deserialize(value, attr, data, **kwargs))
        except ValueError as exc:
            raise ma.ValidationError(str(exc)) from None


CREATED_AT_HELP = ("`FROM..TO` with ISO dates or datetimes, either end open (dates inclusive, in the "
                   "workspace's time zone), or one of: " + ", ".join(PERIOD_KEYWORDS) + ".")
# A keyword or anything with `..`: what parse_period takes apart (whether the ends are dates is
# for it to say).
CREATED_AT_PATTERN = rf"^{SPACE_PATTERN}*({'|'.join(PERIOD_KEYWORDS)}){SPACE_PATTERN}*$|\.\."


class ReportFilterQuery(ma.Schema):
    """The filters the reports take."""

    created_at = CreatedAt(data_key="filter[created_at]",
                           metadata={"description": CREATED_AT_HELP, "pattern": CREATED_AT_PATTERN})
    source = IdList("src_", data_key="filter[source]")
    owner = MemberIds(NO_OWNER, "unassigned leads", data_key="filter[owner]")


class SearchText(ma.fields.String):
    """`q`: parsed by search.parse, the one home of what a search string means."""

    def _deserialize(self, value, attr, data, **kwargs):
        try:
            return search.parse(super()._deserialize(value, attr, data, **kwargs))
        except ValueError as exc:
            raise ma.ValidationError(str(exc)) from None


SEARCH_HELP = ("Search, by what is typed: digits (and spaces, `+ - . ( )`) with at least 4 digits find phones "
               "ending in those digits; text with `@` finds e-mails equal to it or starting with it; anything "
               "else is name words, each the start of the first or last name or of a part of one (case and "
               "accents ignored). 2 to 100 characters once trimmed.")


NEXT_TASK = ("overdue", "today", "none", "scheduled")
NEXT_TASK_HELP = ("overdue: an open task is past due; today: the earliest open task is due today (in the workspace's "
                  "time zone); none: an open-status lead without an open task; scheduled: any open task.")


class LeadFilterQuery(ReportFilterQuery):
    """The filters of the lead list and its CSV export."""

    next_task = ma.fields.String(data_key="filter[next_task]", validate=ma.validate.OneOf(NEXT_TASK),
                                 metadata={"description": NEXT_TASK_HELP})

    sla_state = Choices(sla.SLA_STATES, data_key="filter[sla]")
    stale = ma.fields.Boolean(data_key="filter[stale]", metadata={
        "description": "true: leads whose stale_since has passed; false: every other lead."})

    q = SearchText(metadata={"description": SEARCH_HELP,
                             "examples": ["98765 43210", "asha@example.com", "asha r"]})
    status = IdList("st_", data_key="filter[status]")
    channel = Choices(CHANNELS, data_key="filter[channel]")
    score_band = Bands(data_key="filter[score_band]", metadata={"description": "hot, warm, cold; comma-separated.",
                                                                "pattern": comma_separated("(hot|warm|cold)")})

    @ma.pre_load
    def _set_aside_unknown_filters(self, data, **kwargs):
        # An unknown filter[...] is not an error (the spec): the view reports it in meta instead.
        known = {f.data_key for f in self.fields.values()}
        return {key: data[key] for key in data if key in known or not FILTER_KEY.match(key)}


SORTS: dict[str, cursor.Order] = {
    "-created_at": cursor.Order(Lead.created_at, Lead.public_id, descending=True),
    "score": cursor.Order(Lead.score, Lead.public_id, descending=False),
    # Leads never contacted carry the epoch here, so they come last.
    "-last_activity_at": cursor.Order(Lead.activity_sort_at, Lead.public_id, descending=True),
    # Leads without an open task carry the end of the calendar here, so they come last.
    "next_task_due_at": cursor.Order(Lead.task_sort_at, Lead.public_id, descending=False),
    # Leads without a response due time carry the end of the calendar here, so they come last.
    "response_due_at": cursor.Order(Lead.response_sort_at, Lead.public_id, descending=False),
}


class LeadListQuery(PageQuery, LeadFilterQuery):
    sort = ma.fields.String(load_default="-created_at", validate=ma.validate.OneOf(list(SORTS)),
                            metadata={"description": "Ties are broken by the lead's id; leads with no activity sort last "
                                                     "under -last_activity_at, leads without an open task last under "
                                                     "next_task_due_at, leads without sla.due_at last under "
                                                     "response_due_at."})


def unknown_filters(args: Iterable[str], schema: type[ma.Schema] = LeadFilterQuery) -> list[str]:
    known = _filter_keys(schema)
    return sorted(key for key in args if FILTER_KEY.match(key) and key not in known)


@functools.cache
def _filter_keys(schema: type[ma.Schema]) -> frozenset[str]:
    return frozenset(f.data_key for f in schema().fields.values())   # a schema instance per request costs


# --- applying filters ------------------------------------------------------------------------

def filter_leads(query: pw.ModelSelect, filters: Mapping[str, Any], refs: Refs, settings: Settings) -> pw.ModelSelect:
    """The query narrowed by the filters; ids that match nothing in the workspace match no lead."""
    for name, table, column in (("status", refs.statuses, Lead.status), ("source", refs.sources, Lead.source),
                                ("owner", refs.members, Lead.owner)):
        if name in filters:
            wanted = set(filters[name])
            matching = column.in_([row.id for row in table.values() if row.public_id in wanted] or [0])
            query = query.where(matching | column.is_null() if NO_OWNER in wanted else matching)
    if "channel" in filters:
        # No index of its own: the page reads its scope's sort index in order and checks each lead's
        # channel, as for a status. An index per channel, sort and scope would cost every create,
        # and the leads of a channel are a share of the pipeline, seldom a needle in it.
        query = query.where(Lead.channel.in_(filters["channel"]))
    if "score_band" in filters:
        query = query.where(any_of([Lead.score.between(low, high)
                                          for low, high in band_ranges(filters["score_band"], settings)]))
    if "created_at" in filters:
        start, end = filters["created_at"].utc_bounds(refs.workspace.timezone)
        if start is not None:
            query = query.where(Lead.created_at >= start)
        if end is not None:
            query = query.where(Lead.created_at < end)
    if "q" in filters:
        query = query.where(search.matching(filters["q"], refs.workspace.id))
    if "next_task" in filters:
        query = query.where(next_task_condition(filters["next_task"], refs))
    if "sla_state" in filters:
        query = query.where(sla.condition(filters["sla_state"], utcnow()))
    if "stale" in filters:
        query = query.where(sla.stale_condition(filters["stale"], utcnow(),
                                                (status.stale_after_days for status in refs.statuses.values())))
    return query


def next_task_condition(wanted: str, refs: Refs) -> pw.Expression:
    """filter[next_task] on the lead's task_sort_at (its next_task_due_at, or NO_TASK), the column its
    sort reads, so that each value is a range of that index."""
    if wanted == "overdue":
        return Lead.task_sort_at < utcnow()
    if wanted == "today":
        start, end = Period(keyword="today").utc_bounds(refs.workspace.timezone)
        return (Lead.task_sort_at >= start) & (Lead.task_sort_at < end)
    if wanted == "scheduled":
        return Lead.task_sort_at < NO_TASK
    open_statuses = [status.id for status in refs.statuses.values() if status.kind == "open"] or [0]
    return (Lead.task_sort_at == NO_TASK) & Lead.status.in_(open_statuses)   # none: no next step


def next_link(path: str, query: Mapping[str, Any], after: str | None) -> str | None:
    """links.next: the same path with every filter, the sort, page[size] and page[after]."""
    if after is None:
        return None
    params = {key: value for key, value in query.items() if key != "page[after]"}
    params["page[after]"] = after
    return f"{path}?{urlencode(params)}"


def page_document(data: list, after: str | None) -> dict[str, Any]:
    """A page of the current request's list in the list envelope; links.next repeats its query."""
    return {"data": data, "links": {"next": next_link(request.script_root + request.path, request.args.to_dict(), after)},
            "meta": {"has_more": after is not None}}


def binding(sort: str, filters: Mapping[str, Any]) -> str:
    """What a cursor is bound to: the sort and the filters, in a normalized form."""
    normalized = {key: (sorted(value) if isinstance(value, list) else value) for key, value in filters.items()}
    return cursor.fingerprint(sort, normalized)


def lead_page(query: pw.ModelSelect, params: Mapping[str, Any], refs: Refs, settings: Settings) -> tuple[list, str | None]:
    """One page of the filtered, sorted query and the cursor of the next."""
    filters = {key: value for key, value in params.items() if key not in ("sort", "page_size", "page_after")}
    return cursor.page(filter_leads(query, filters, refs, settings), SORTS[params["sort"]], params["page_size"],
                       binding(params["sort"], filters), params.get("page_after"), fetch=_document_rows)


# What a page of the list reads: the document's columns, and those the sorts order by besides.
PAGE_COLUMNS = (*LEAD_COLUMNS, Lead.activity_sort_at, Lead.task_sort_at, Lead.response_sort_at)


def _document_rows(query: pw.ModelSelect) -> list:
    return read_rows(PAGE_COLUMNS, *query.select(*PAGE_COLUMNS).sql())


# --- the task list ---------------------------------------------------------------------------

DUE_KEYWORDS = ("today", "tomorrow", "this_week", "next_7_days")
DUE_HELP = ("overdue (due_at has passed), " + ", ".join(DUE_KEYWORDS) + " (in the workspace's time zone), or "
            "`FROM..TO` with ISO dates or datetimes, either end open, as in filter[created_at].")
DUE_PATTERN = rf"^{SPACE_PATTERN}*(overdue|{'|'.join(DUE_KEYWORDS)}){SPACE_PATTERN}*$|\.\."
ME = "me"


class Due(ma.fields.String):
    """filter[due]: `overdue`, a day keyword or a range, loaded as "overdue" or a Period."""

    def _deserialize(self, value, attr, data, **kwargs):
        text = trim(super()._deserialize(value, attr, data, **kwargs))
        if text == "overdue":
            return text
        try:
            return parse_period(text, DUE_KEYWORDS)
        except ValueError as exc:
            raise ma.ValidationError(f"{exc} Or: overdue.") from None


TASK_SORTS: dict[str, cursor.Order] = {
    "due_at": cursor.Order(Task.due_at, Task.public_id, descending=False),
    # Open tasks carry the epoch here, so they come last.
    "-done_at": cursor.Order(Task.closed_at, Task.public_id, descending=True),
}


class TaskFilterQuery(ma.Schema):
    assignee = MemberIds(ME, "the caller's own member", data_key="filter[assignee]")
    state = Choices(TASK_STATES, data_key="filter[state]", load_default=["open"])
    due = Due(data_key="filter[due]", metadata={"description": DUE_HELP, "pattern": DUE_PATTERN})
    kind = Choices(TASK_KINDS, data_key="filter[kind]")
    lead = IdList("ld_", data_key="filter[lead]")

    @ma.pre_load
    def _set_aside_unknown_filters(self, data, **kwargs):
        known = {f.data_key for f in self.fields.values()}
        return {key: data[key] for key in data if key in known or not FILTER_KEY.match(key)}


class TaskListQuery(PageQuery, TaskFilterQuery):
    sort = ma.fields.String(load_default="due_at", validate=ma.validate.OneOf(list(TASK_SORTS)), metadata={
        "description": "due_at: earliest first; -done_at: most recently closed (done or cancelled) first, open "
                       "tasks last. Ties are broken by the task's id."})


def filter_tasks(query: pw.ModelSelect, filters: Mapping[str, Any], refs: Refs, me: int) -> pw.ModelSelect:
    """The task query narrowed by the filters; `me` is the caller's member id."""
    if "assignee" in filters:
        wanted = set(filters["assignee"])
        ids = [me] if ME in wanted else []
        ids += [member.id for member in refs.members.values() if member.public_id in wanted]
        query = query.where(Task.workspace == refs.workspace.id, Task.assignee.in_(ids or [0]))
    states = filters["state"]
    query = query.where(Task.state == states[0] if len(states) == 1 else Task.state.in_(states))
    if "kind" in filters:
        query = query.where(Task.kind.in_(filters["kind"]))
    if "lead" in filters:
        query = query.where(Task.lead.in_(Lead.select(Lead.id).where(
            (Lead.workspace == refs.workspace.id) & Lead.public_id.in_(filters["lead"]))))
    if "due" in filters:
        if filters["due"] == "overdue":
            query = query.where(Task.due_at < utcnow())
        else:
            start, end = filters["due"].utc_bounds(refs.workspace.timezone)
            if start is not None:
                query = query.where(Task.due_at >= start)
            if end is not None:
                query = query.where(Task.due_at < end)
    return query


def task_page(query: pw.ModelSelect, params: Mapping[str, Any], refs: Refs, me: int) -> tuple[list, str | None]:
    """One page of the filtered, sorted task query and the cursor of the next."""
    filters = {key: value for key, value in params.items() if key not in ("sort", "page_size", "page_after")}
    # `me` means the caller's own member: a cursor made for one caller is not another's.
    bound = binding(params["sort"], {**filters, "me": me if ME in filters.get("assignee", ()) else None})
    return cursor.page(filter_tasks(query, filters, refs, me), TASK_SORTS[params["sort"]], params["page_size"],
                       bound, params.get("page_after"))
