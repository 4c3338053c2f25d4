"""GET /api/v1/leads/export.csv: the caller's leads as CSV, read in keyset chunks.

The rows are the caller's scope (visible_leads) narrowed by the list's filters, read a chunk at a
time on the list's keyset order, so an export of any size holds one chunk in memory. Free-text
cells that a spreadsheet would run as a formula are defused with a leading apostrophe.

Each export is written to a temporary file that the WSGI server is given to send
(wsgi.file_wrapper): the worker thread is free once the file is written, and waitress sends it
from the file at the client's pace, holding none of it in memory. Writing takes a thread for
seconds, so at most half the server's threads write exports at once: the rest always serve
everything else, and an export beyond that is a 429 (docs/design.md, "Slow export readers").
"""

from __future__ import annotations

import csv
import io
import tempfile
import threading
from datetime import date
from typing import IO, Any, Iterator

import marshmallow as ma
from flask import Response, current_app, request
from flask.views import MethodView
from werkzeug.wsgi import wrap_file

from .auth import requires, visible_leads
from .config import settings
from .extensions import Blueprint
from .fields import rfc3339
from .listing import SORTS, LeadFilterQuery, filter_leads, unknown_filters
from .models import ATTRIBUTION_KEYS, Lead
from .problems import TooManyRequests
from .refs import Refs, request_refs
from .schemas import ATTRIBUTION_PREFIX
from .scoring import band

blp = Blueprint("export", __name__, url_prefix="/api/v1/leads",
                description="The caller's leads as a CSV file.")

CHUNK = 500
RETRY_AFTER_BUSY = 5   # seconds a client waits when every export writer is busy
# The attribution's columns are named as in the lead document (attribution.utm_source): a custom
# field's name, snake_case, never holds a dot, so no custom field column can take one of theirs.
ATTRIBUTION_COLUMNS = tuple(ATTRIBUTION_PREFIX + key for key in ("channel", "connector", *ATTRIBUTION_KEYS))
# The import's columns first, so an export can be imported into another workspace as it is; the
# import ignores the others (csv_import.IGNORED_COLUMNS). New columns go last, before the custom
# fields, so that readers going by position keep theirs.
COLUMNS = ("id", "first_name", "last_name", "phone", "email", "source", "estimated_value", "currency",
           "status", "owner", "owner_email", "team", "score", "score_band", "created_at", "updated_at",
           "status_changed_at", "last_activity_at", "lost_reason", "next_task_due_at", *ATTRIBUTION_COLUMNS)
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


class ExportQuery(LeadFilterQuery):
    sort = ma.fields.String(load_default="-created_at", validate=ma.validate.OneOf(list(SORTS)),
                            metadata={"description": "The list's sorts; ties are broken by the lead's id."})


CSV_RESPONSE = {"type": "string", "description": "A header row, then one row per lead. Custom fields follow "
                                                 "the fixed columns, one column each, named by the field."}


@blp.route("/export.csv")
class LeadExport(MethodView):
    @blp.doc(operationId="exportLeads")
    @requires("leads:read")
    @blp.arguments(ExportQuery(), location="query")
    @blp.response(200, CSV_RESPONSE, content_type="text/csv",
                  description="The leads in the caller's scope that match the filters, as CSV (UTF-8). "
                              "An unknown filter[...] gives only the header row, and names the key in "
                              "X-Unknown-Filters.",
                  headers={"Content-Disposition": {"schema": {"type": "string"}},
                           "X-Unknown-Filters": {"schema": {"type": "string"},
                                                 "description": "filter[...] keys the service does not know."}})
    def get(self, params):
        """Export the leads in the caller's scope as CSV, with the list's filters"""
        refs = request_refs()
        unknown = unknown_filters(request.args)
        headers = {"Content-Disposition": f'attachment; filename="leads-{date.today().isoformat()}.csv"'}
        if unknown:
            headers["X-Unknown-Filters"] = ",".join(unknown)
        if request.method == "HEAD":
            # The GET's headers without writing the export: its length is known only once it is
            # written, and HTTP lets a HEAD leave Content-Length out (never send a wrong one).
            response = Response(mimetype="text/csv", headers=headers)
            response.automatically_set_content_length = False
            return response
        filters = {key: value for key, value in params.items() if key != "sort"}
        query = None if unknown else filter_leads(visible_leads(), filters, refs, settings())
        file, size = written(csv_rows(query, params["sort"], refs))
        response = Response(wrap_file(request.environ, file), mimetype="text/csv", direct_passthrough=True,
                            headers=headers)
        response.content_length = size
        return response


@blp.record_once
def _writers(state: Any) -> None:
    """The app's export writers: half its server threads, at least one."""
    threads = state.app.config["LEADSVC"]["server"]["threads"]
    state.app.extensions["leadsvc.export_writers"] = threading.BoundedSemaphore(max(1, threads // 2))


def written(rows: Iterator[str]) -> tuple[IO[bytes], int]:
    """The rows in a temporary file, rewound, and its size. One of the app's export writers is
    taken while they are written: a 429 when none is free."""
    writers = current_app.extensions["leadsvc.export_writers"]
    if not writers.acquire(blocking=False):
        raise TooManyRequests("The service is writing as many exports as it writes at once; "
                              f"retry in {RETRY_AFTER_BUSY} seconds.", RETRY_AFTER_BUSY)
    file = tempfile.TemporaryFile()
    try:
        for chunk in rows:
            file.write(chunk.encode())
        size = file.tell()
        file.seek(0)
        return file, size
    except BaseException:
        file.close()
        raise
    finally:
        writers.release()


def csv_rows(query: Any, sort: str, refs: Refs) -> Iterator[str]:
    """The header, then the query's leads a chunk at a time (None: the header alone)."""
    fields = [f.name for f in sorted(refs.custom_fields.values(), key=lambda f: (f.position, f.name))]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n")
    writer.writerow([*COLUMNS, *(safe_cell(name) for name in fields)])
    yield _drain(buffer)
    if query is None:
        return
    order = SORTS[sort]
    after = None
    while True:
        rows = list(order.apply(query, after).limit(CHUNK))
        for lead in rows:
            writer.writerow(lead_row(lead, refs, fields))
        yield _drain(buffer)
        if len(rows) < CHUNK:
            return
        after = order.position(rows[-1])


def _drain(buffer: io.StringIO) -> str:
    text = buffer.getvalue()
    buffer.seek(0)
    buffer.truncate()
    return text


def lead_row(lead: Lead, refs: Refs, fields: list[str]) -> list[Any]:
    source, owner = refs.sources.get(lead.source_id), refs.members.get(lead.owner_id)
    team = refs.teams.get(lead.team_id)
    status, lost_reason = refs.statuses[lead.status_id], refs.lost_reasons.get(lead.lost_reason_id)
    custom, attribution = lead.custom_fields or {}, lead.attribution or {}
    connector = refs.connectors.get(lead.connector_id)
    # The phone is E.164 checked on the way in (a + and digits): it stays as it is.
    return [lead.public_id, safe_cell(lead.first_name), safe_cell(lead.last_name), lead.phone or "",
            safe_cell(lead.email or ""), safe_cell(source.name) if source else "",
            "" if lead.estimated_value is None else f"{lead.estimated_value:.2f}", refs.workspace.currency,
            safe_cell(status.name), safe_cell(owner.name) if owner else "", safe_cell(owner.email) if owner else "",
            safe_cell(team.name) if team else "", lead.score, band(lead.score, refs.settings),
            rfc3339(lead.created_at), rfc3339(lead.updated_at), rfc3339(lead.status_changed_at),
            rfc3339(lead.last_activity_at) or "", safe_cell(lost_reason.name) if lost_reason else "",
            rfc3339(lead.next_task_due_at) or "", lead.channel, safe_cell(connector.name) if connector else "",
            *(safe_cell(attribution.get(key, "")) for key in ATTRIBUTION_KEYS),
            *(_custom_cell(custom.get(name)) for name in fields)]


def _custom_cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return safe_cell(value) if isinstance(value, str) else value


def safe_cell(text: str) -> str:
    """Text a spreadsheet would run as a formula (=, +, -, @ first), prefixed with an apostrophe."""
    return "'" + text if text.startswith(FORMULA_STARTS) else text
