"""No input reaches a 500: the cursor decoder, the query-parameter schemas and the date parsers,
fed anything, answer or raise the validation error they are meant to, and nothing else."""

from __future__ import annotations

import base64
import json
import string
from datetime import date, datetime, timedelta, timezone

import marshmallow as ma
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from leadsvc import cursor
from leadsvc.export import ExportQuery
from leadsvc.listing import SORTS, LeadListQuery, Period, ReportFilterQuery, binding, parse_period
from leadsvc.problems import ValidationFailed
from leadsvc.schemas import ActivityCreateSchema, PageQuery, LeadReadQuery
from leadsvc.timeline import HISTORY_ORDERS

# Reproducible in CI; enough examples to reach the corners the strategies aim at.
EXAMPLES = settings(max_examples=300, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

ORDERS = [*SORTS.values(), *HISTORY_ORDERS.values()]
BINDING = "b1nd1ng"

# Any JSON value, nested a little; deep nesting has its own strategy below.
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12)
offsets = st.timedeltas(min_value=timedelta(hours=-23, minutes=-59), max_value=timedelta(hours=23, minutes=59)) \
    .map(lambda delta: timezone(delta))
# Datetimes anywhere in the calendar, and often within a day of its ends (where an offset can
# push the time out of it), naive or with any offset, as ISO text.
moments = st.one_of(st.datetimes(),
                    st.datetimes(max_value=datetime.min + timedelta(days=1)),
                    st.datetimes(min_value=datetime.max - timedelta(days=1)))
iso_datetimes = st.builds(lambda moment, zone, spec: moment.replace(tzinfo=zone).isoformat(timespec=spec),
                          moments, st.none() | offsets, st.sampled_from(["seconds", "microseconds", "auto"]))
iso_dates = st.dates(min_value=date.min, max_value=date.max).map(date.isoformat)
# Text near the formats the parsers expect, and text of anything at all.
date_like = st.text(alphabet="0123456789-:.TZz+ ", max_size=40)
any_text = st.text(max_size=60)


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


cursors = st.one_of(
    any_text,
    st.binary(max_size=200).map(b64),
    json_values.map(lambda value: b64(json.dumps(value).encode())),
    st.integers(1, 100_000).map(lambda depth: b64(b"[" * depth)),
    st.integers(1, 100_000).map(lambda depth: b64(b'{"t":' * depth)),
    st.tuples(st.sampled_from([BINDING, "other"]), json_values | iso_datetimes.map(lambda t: {"t": t})
              | date_like.map(lambda t: {"t": t}), any_text | st.just("ld_" + "A" * 16))
      .map(lambda parts: b64(json.dumps(list(parts)).encode())),
)


@pytest.mark.parametrize("order", ORDERS, ids=[f"{o.column.model.__name__}.{o.column.name}" for o in ORDERS])
@EXAMPLES
@given(text=cursors)
def test_a_cursor_decodes_to_a_position_of_its_sort_or_is_a_422_on_page_after(order, text):
    try:
        value, public_id = cursor.decode(text, BINDING, order)
    except ValidationFailed as exc:
        assert list(exc.errors) == ["page[after]"]
        return
    assert order.check(value) == value and order.id_pattern.match(public_id)
    if isinstance(value, datetime):
        assert value.tzinfo is None, "cursors hold naive UTC, as the columns do"


def test_a_cursor_made_by_the_service_decodes_to_where_it_was():
    order = SORTS["-created_at"]
    moment, public_id = datetime(2026, 1, 2, 3, 4, 5, 6), "ld_" + "a1" * 8
    assert cursor.decode(cursor.encode(BINDING, moment, public_id), BINDING, order) == (moment, public_id)


@EXAMPLES
@given(text=st.one_of(any_text, date_like, st.sampled_from(["today", "last_7_days", "this_quarter", ".."]),
                      st.tuples(st.one_of(st.just(""), iso_dates, iso_datetimes, date_like),
                                st.one_of(st.just(""), iso_dates, iso_datetimes, date_like))
                      .map(lambda ends: "..".join(ends))),
       zone=st.sampled_from(["Asia/Kolkata", "Pacific/Kiritimati", "Etc/GMT+12", "UTC", "America/St_Johns"]),
       today=st.dates(min_value=date(1900, 1, 1), max_value=date(9998, 12, 31)))
def test_a_created_at_period_parses_to_bounds_in_any_time_zone_or_is_a_value_error(text, zone, today):
    try:
        period = parse_period(text)
    except ValueError as exc:
        assert str(exc), "a message a person can act on"
        return
    assert isinstance(period, Period)
    start, end = period.utc_bounds(zone, today)
    assert start is None or end is None or start < end


QUERY_SCHEMAS = {
    "lead list": (LeadListQuery, ["filter[status]", "filter[owner]", "filter[source]", "filter[score_band]",
                                  "filter[created_at]", "filter[bogus]", "sort", "page[size]", "page[after]"]),
    "export": (ExportQuery, ["filter[status]", "filter[source]", "filter[score_band]", "filter[created_at]", "sort"]),
    "reports": (ReportFilterQuery, ["filter[created_at]", "filter[source]", "filter[owner]"]),
    "history": (PageQuery, ["page[size]", "page[after]"]),
    "lead read": (LeadReadQuery, ["include"]),
}
ID_LIKE = st.lists(st.sampled_from(["st_", "mem_", "src_", "ld_", ""]).flatmap(
    lambda prefix: st.text(string.ascii_letters + string.digits, min_size=0, max_size=20).map(lambda s: prefix + s)),
    min_size=1, max_size=4).map(",".join)


@pytest.mark.parametrize("name", QUERY_SCHEMAS)
@EXAMPLES
@given(data=st.data())
def test_query_parameters_load_or_are_a_validation_error(name, data):
    schema, keys = QUERY_SCHEMAS[name]
    values = st.one_of(any_text, date_like, ID_LIKE, iso_dates, st.integers().map(str),
                       st.sampled_from(["hot", "warm,cold", "-created_at", "score", "activities,notes", "today"]))
    query = data.draw(st.dictionaries(st.sampled_from(keys), values, max_size=len(keys)))
    try:
        schema().load(query, unknown=ma.EXCLUDE)
    except ma.ValidationError as exc:
        assert set(exc.messages) <= set(keys), exc.messages


@EXAMPLES
@given(moment=st.one_of(iso_datetimes, iso_dates, date_like, any_text, st.integers(), st.floats(), st.none()))
def test_an_activity_occurred_at_loads_as_naive_utc_or_is_a_validation_error_on_it(moment):
    try:
        data = ActivityCreateSchema().load({"kind": "call", "summary": "Called", "occurred_at": moment})
    except ma.ValidationError as exc:
        assert set(exc.messages) == {"occurred_at"}, exc.messages
        return
    assert data["occurred_at"].tzinfo is None


positions = st.one_of(moments.map(lambda m: {"t": m.isoformat()}),
                      st.tuples(moments, offsets).map(lambda p: {"t": p[0].replace(tzinfo=p[1]).isoformat()}),
                      st.integers(-2**40, 2**40), json_values)
public_ids = st.text(string.ascii_letters + string.digits, min_size=16, max_size=40)


@pytest.mark.parametrize("sort", list(SORTS))
@settings(EXAMPLES, max_examples=60)
@given(value=positions, suffix=public_ids)
def test_a_cursor_bound_to_its_list_with_any_position_in_it_is_a_page_or_a_422(client, ws, sort, value, suffix):
    """Past the decoder, into SQL on each database: a 200 or a 422, never a 500."""
    text = b64(json.dumps([binding(sort, {}), value, "ld_" + suffix]).encode())
    response = client.get(f"/api/v1/leads?sort={sort}&page[after]={text}", headers=ws.headers())
    assert response.status_code in (200, 422), response.get_data(as_text=True)
    if response.status_code == 422:
        assert list(response.json["errors"]) == ["page[after]"]


@settings(EXAMPLES, max_examples=60)
@given(value=positions, suffix=public_ids)
def test_a_history_cursor_with_any_position_in_it_is_a_page_or_a_422(client, ws, value, suffix):
    lead = client.post("/api/v1/leads", json={"email": "history@example.com"}, headers=ws.headers()).json["data"]["id"]
    for kind in ("transitions", "audit"):
        public_id = HISTORY_ORDERS[kind].tiebreak.prefix + suffix
        text = b64(json.dumps([cursor.fingerprint(kind, lead), value, public_id]).encode())
        response = client.get(f"/api/v1/leads/{lead}/{kind}?page[after]={text}", headers=ws.headers())
        assert response.status_code in (200, 422), response.get_data(as_text=True)
