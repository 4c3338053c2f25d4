"""Keyset cursors: opaque, URL-safe, bound to the sort and filters they came from.

A cursor holds the last row's sort value and public id, never an internal id. Pages are
`WHERE (sort_key, public_id) < (last)` in the sort's direction, on indexes that end in
(sort_key, public_id), so a page costs the same at any depth and rows inserted meanwhile are
neither repeated nor able to shift the walk.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable

import peewee as pw

from .models import public_id_pattern
from .problems import ValidationFailed

PAGE_AFTER = "page[after]"


@dataclass(frozen=True)
class Order:
    """A keyset order: a sort column, its direction, and the unique public id as tie-breaker."""

    column: pw.Field
    tiebreak: pw.Field
    descending: bool

    def apply(self, query: pw.ModelSelect, after: tuple[Any, str] | None) -> pw.ModelSelect:
        if after is not None:
            key, last = pw.Tuple(self.column, self.tiebreak), pw.Tuple(*after)
            query = query.where(key < last if self.descending else key > last)
        if self.descending:
            return query.order_by(self.column.desc(), self.tiebreak.desc())
        return query.order_by(self.column.asc(), self.tiebreak.asc())

    @property
    def id_pattern(self) -> re.Pattern[str]:
        return public_id_pattern(self.tiebreak.prefix)

    def position(self, row: Any) -> tuple[Any, str]:
        return getattr(row, self.column.name), getattr(row, self.tiebreak.name)

    def check(self, value: Any) -> Any:
        """A cursor's sort value, if it has the column's type."""
        if isinstance(self.column, pw.DateTimeField):
            if isinstance(value, datetime) and value.tzinfo is None:   # naive UTC, as encode writes it
                return value
        elif isinstance(value, int) and not isinstance(value, bool) and -2**31 <= value < 2**31:
            return value
        raise ValueError("sort value of the wrong type")


def fingerprint(*parts: Any) -> str:
    """A short digest of what a cursor is bound to (sort and normalized filters)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:12]


def encode(binding: str, value: Any, public_id: str) -> str:
    if isinstance(value, datetime):
        value = {"t": value.isoformat()}
    raw = json.dumps([binding, value, public_id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def decode(cursor: str, binding: str, order: Order) -> tuple[Any, str]:
    """The (sort value, public id) in a cursor, or 422 if it is malformed or bound to something else."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        bound_to, value, public_id = json.loads(raw)
        if isinstance(value, dict):
            value = datetime.fromisoformat(value["t"])
        value = order.check(value)
        if not isinstance(bound_to, str) or not isinstance(public_id, str) or not order.id_pattern.match(public_id):
            raise ValueError
    # RecursionError: JSON nested deeper than the parser's stack, which no cursor of ours is.
    except (ValueError, TypeError, KeyError, binascii.Error, UnicodeDecodeError, RecursionError):
        raise ValidationFailed.field(PAGE_AFTER, "Not a cursor this service made; follow links.next as given.") from None
    if bound_to != binding:
        raise ValidationFailed.field(PAGE_AFTER, "This cursor belongs to another sort or other filters; "
                                                 "start again without page[after].")
    return value, public_id


def page(query: pw.ModelSelect, order: Order, size: int, binding: str, after: str | None, *,
         fetch: Callable[[pw.ModelSelect], list] = list) -> tuple[list, str | None]:
    """One page of rows and the cursor of the next page (None on the last); `fetch` runs the
    query (the lead list reads plain rows: db.read_rows)."""
    position = decode(after, binding, order) if after else None
    rows = fetch(order.apply(query, position).limit(size + 1))
    if len(rows) <= size:
        return rows, None
    rows = rows[:size]
    return rows, encode(binding, *order.position(rows[-1]))


@dataclass(frozen=True)
class Phase:
    """One walk of a list read as several keyset walks in turn (a lead's open tasks, then its
    closed ones): its rows, their order, and the binding that names the phase in a cursor."""

    query: pw.ModelSelect
    order: Order
    binding: str


def phased_page(phases: list[Phase], size: int, after: str | None) -> tuple[list, str | None]:
    """One page of rows across the phases, in turn, and the cursor of the next page (None on the
    last). A cursor holds the last row's position in its own phase's order and binding."""
    start, position = 0, None
    if after:
        start, position = _phase_of(after, phases)
    rows: list[tuple[int, Any]] = []
    for index in range(start, len(phases)):
        phase = phases[index]
        query = phase.order.apply(phase.query, position if index == start else None)
        rows += [(index, row) for row in query.limit(size + 1 - len(rows))]
        if len(rows) > size:
            break
    if len(rows) <= size:
        return [row for _, row in rows], None
    index, last = rows[size - 1]
    return [row for _, row in rows[:size]], encode(phases[index].binding, *phases[index].order.position(last))


def _phase_of(after: str, phases: list[Phase]) -> tuple[int, tuple[Any, str]]:
    for index, phase in enumerate(phases):
        try:
            return index, decode(after, phase.binding, phase.order)
        except ValidationFailed:
            continue
    raise ValidationFailed.field(PAGE_AFTER, "Not a cursor of this list; follow links.next as given.")
