"""`leadsvc import FILE.csv`: leads from a spreadsheet, through the same create path as the API.

Each row is read like an API body (LeadCreateSchema), then created by pipeline.create_lead with
a system actor, so validation, duplicate detection, routing, scoring and audit are the API's.
Each row is its own transaction: a bad row is reported and the others go in. A row whose phone
or e-mail matches a lead (one already there, or one an earlier row created) creates nothing and
is reported as a duplicate, so running the same file again creates nothing twice; with
on_duplicate `update` or `fill_empty` the row's cells then update that lead as an API upsert does.

Columns: first_name, last_name, phone, email, source (a name or a src_ id), estimated_value, the
attribution an API create may send (attribution.utm_source, attribution.gclid, ...), and one
column per custom field, named by the field. The columns an export adds (id, status, owner,
score, attribution.channel, ...) are ignored, so an export imports as it is; any other column is
an error. The leads' channel is `import`.
"""

from __future__ import annotations

import csv
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, TextIO

import marshmallow as ma

from . import pipeline
from .custom_fields import cell_value
from .export import COLUMNS as EXPORT_COLUMNS
from .export import FORMULA_STARTS
from .fields import phones_of, trim
from .history import Actor
from .models import Workspace
from .problems import Problem
from .refs import Refs
from .schemas import ATTRIBUTION_PREFIX, AttributionSentSchema, LeadCreateSchema

CONTACT_COLUMNS = ("first_name", "last_name", "phone", "email", "source", "estimated_value")
ATTRIBUTION_COLUMNS = tuple(ATTRIBUTION_PREFIX + name for name in AttributionSentSchema().fields)
IGNORED_COLUMNS = frozenset(EXPORT_COLUMNS) - set(CONTACT_COLUMNS) - set(ATTRIBUTION_COLUMNS)
AMOUNT = re.compile(r"^\d[\d,]*(\.\d+)?$")   # 250000, 2,50,000.50 (any digit grouping)


class ImportFileError(Exception):
    """A file that cannot be imported at all (its header); nothing was imported."""


@dataclass
class ImportReport:
    workspace: str
    rows: int = 0
    created: int = 0
    duplicates: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)   # {"row", "field", "message"}
    failed_rows: set[int] = field(default_factory=set)

    def as_json(self) -> dict[str, Any]:
        return {"workspace": self.workspace, "rows": self.rows, "created": self.created,
                "duplicates": len(self.duplicates), "failed": len(self.failed_rows),
                "errors": self.errors, "duplicate_rows": self.duplicates}

    def fail(self, row: int, messages: dict[str, list[str]]) -> None:
        self.failed_rows.add(row)
        for name, texts in messages.items():
            self.errors.extend({"row": row, "field": name, "message": text} for text in texts)


def count_rows(stream: TextIO) -> int:
    """Data rows in a CSV file (after its header), for the progress bar."""
    return max(0, sum(1 for _ in csv.reader(stream)) - 1)


def check_header(header: list[str] | None, refs: Refs) -> list[str]:
    """The column names, or ImportFileError naming the ones that are unknown or repeated."""
    if not header:
        raise ImportFileError("The file is empty; the first row must name the columns.")
    columns = [trim(name).lower() for name in header]
    known = set(CONTACT_COLUMNS) | set(ATTRIBUTION_COLUMNS) | set(refs.custom_fields) | IGNORED_COLUMNS
    unknown = [name for name in columns if name not in known]
    if unknown:
        raise ImportFileError(
            f"Unknown columns: {', '.join(unknown) or '(empty)'}. Use {', '.join(CONTACT_COLUMNS)}, the "
            f"attribution ({', '.join(ATTRIBUTION_COLUMNS)}) and the custom fields "
            f"({', '.join(sorted(refs.custom_fields)) or 'none defined'}).")
    repeated = sorted({name for name in columns if columns.count(name) > 1})
    if repeated:
        raise ImportFileError(f"Columns named more than once: {', '.join(repeated)}.")
    if "phone" not in columns and "email" not in columns:
        raise ImportFileError("The file needs a phone or an email column (or both).")
    return columns


def import_csv(stream: TextIO, workspace: Workspace, settings: dict, *,
               progress: Callable[[int], None] | None = None, on_duplicate: str = "ignore") -> ImportReport:
    """Create a lead from each row (a duplicate is left, updated or filled in, as on_duplicate
    says); returns what was created, the duplicates and each row's errors."""
    refs = Refs.load(workspace, settings)
    reader = csv.reader(stream)
    columns = check_header(next(reader, None), refs)
    actor = Actor(workspace=workspace, request_id=f"import-{uuid.uuid4().hex[:16]}", via="import")
    schema = LeadCreateSchema()
    report = ImportReport(workspace=workspace.public_id)
    created_by_row: dict[str, int] = {}   # lead id -> the row of this file that created it
    for row, cells in enumerate(reader, start=2):   # row 1 is the header, as a spreadsheet counts
        if progress:
            progress(1)
        if is_blank(cells):
            continue
        report.rows += 1
        try:
            data = read_row(columns, cells, refs, schema, on_duplicate)
        except RowError as exc:
            report.fail(row, exc.messages)
            continue
        try:
            created = pipeline.create_lead(data, actor, refs)
        except Problem as exc:
            report.fail(row, pipeline.item_failure(exc, "row")[1])
            continue
        lead_id = created.lead.public_id
        if created.duplicate:
            report.duplicates.append({"row": row, "lead": lead_id, "matched_on": created.matched_on,
                                      "first_row": created_by_row.get(lead_id),
                                      **({"updated_fields": created.updated_fields}
                                         if created.updated_fields is not None else {})})
        else:
            report.created += 1
            created_by_row[lead_id] = row
    return report


class RowError(Exception):
    """A row that cannot become a create body: every problem of the row, by column."""

    def __init__(self, messages: dict[str, list[str]]):
        super().__init__(messages)
        self.messages = messages


def read_row(columns: list[str], cells: list[str], refs: Refs, schema: ma.Schema, on_duplicate: str) -> dict[str, Any]:
    """A (non-blank) row's create data, as LeadCreateSchema loads an API body, in the workspace's
    phone regions; RowError with every problem of the row at once, not one per run."""
    if len(cells) > len(columns):
        raise RowError({"row": [f"{len(cells)} cells, but the header names {len(columns)} columns."]})
    body, problems = row_body(dict(zip(columns, cells)), refs)
    body["on_duplicate"] = on_duplicate
    try:
        with phones_of(refs.workspace):
            data = schema.load(body)
    except ma.ValidationError as exc:
        problems.update(pipeline.item_failure(exc, "row")[1])
    if problems:
        raise RowError(problems)
    return data


def is_blank(cells: list[str]) -> bool:
    """Whether a row has nothing in it (a blank line is not a lead)."""
    return not any(trim(cell) for cell in cells)


def row_body(cells: dict[str, str], refs: Refs) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """A create body from a row's text cells, and what could not be read (by column)."""
    body: dict[str, Any] = {}
    custom: dict[str, Any] = {}
    attribution: dict[str, str] = {}
    problems: dict[str, list[str]] = {}
    for name, raw in cells.items():
        text = _unescape(trim(raw))
        if not text or name in IGNORED_COLUMNS:
            continue
        try:
            if name in ("first_name", "last_name", "phone", "email"):
                body[name] = text
            elif name == "source":
                body["source"] = _source_id(text, refs)
            elif name == "estimated_value":
                body["estimated_value"] = _amount(text)
            elif name in ATTRIBUTION_COLUMNS:
                attribution[name.removeprefix(ATTRIBUTION_PREFIX)] = text
            else:
                custom[name] = cell_value(text, refs.custom_fields[name].type)
        except ValueError as exc:
            problems[name if name in CONTACT_COLUMNS else f"custom_fields.{name}"] = [str(exc)]
    if custom:
        body["custom_fields"] = custom
    if attribution:
        body["attribution"] = attribution
    return body, problems


def _unescape(text: str) -> str:
    """Undo an export's formula guard ('=...), so a round trip keeps the text as it was."""
    return text[1:] if text.startswith("'") and text[1:].startswith(FORMULA_STARTS) else text


def _source_id(text: str, refs: Refs) -> str:
    """A source by its id or, as people write it, by its name (any case)."""
    for source in refs.sources.values():
        if text == source.public_id or text.casefold() == source.name.casefold():
            return source.public_id
    names = ", ".join(sorted(s.name for s in refs.sources.values())) or "none defined"
    raise ValueError(f"Unknown source {text!r}; use one of: {names} (or its src_ id).")


def _amount(text: str) -> float:
    cleaned = text.replace(" ", "")
    if not AMOUNT.match(cleaned):
        raise ValueError(f"{text!r} is not an amount; write digits, e.g. 250000 or 2,50,000.50.")
    return float(cleaned.replace(",", ""))
