"""A workspace's reference data (statuses, sources, members, teams, custom fields, distribution
rules, webhooks, lost reasons, connectors), cached per process while the workspace's
refs_version stands: every lead document, the reference-data endpoints and the pipeline read it
from here."""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from typing import Any

from flask import g

from .db import database
from .documents import member_ref, ref, status_ref
from .models import Connector, CustomField, LostReason, Member, Rule, Source, Status, Team, Webhook, Workspace


@dataclass
class Refs:
    """A workspace's reference tables by internal id (custom fields by name); statuses, sources,
    members, teams and lost reasons in the order their reference-data endpoints list them (the
    order of custom fields is left as it was: a lead's score reasons follow it)."""

    workspace: Workspace
    statuses: dict[int, Status]
    sources: dict[int, Source]
    members: dict[int, Member]
    teams: dict[int, Team]
    custom_fields: dict[str, CustomField]   # by name
    rules: list[Rule]                        # in the order they are tried (their rotation is read afresh)
    settings: dict
    webhooks: list[tuple[int, frozenset[str]]]   # the active webhooks and the event types each wants
    lost_reasons: dict[int, LostReason]      # in setup order
    connectors: dict[int, Connector]         # in name order; each with its id, public id, name and kind only

    @classmethod
    def load(cls, workspace: Workspace, settings: dict) -> "Refs":
        ws = workspace.id
        return cls(
            workspace=workspace,
            statuses={s.id: s for s in Status.select().where(Status.workspace == ws)
                      .order_by(Status.position, Status.id)},
            sources={s.id: s for s in Source.select().where(Source.workspace == ws).order_by(Source.name)},
            members={m.id: m for m in Member.select().where(Member.workspace == ws).order_by(Member.name, Member.id)},
            teams={t.id: t for t in Team.select().where(Team.workspace == ws).order_by(Team.name)},
            custom_fields={f.name: f for f in CustomField.select().where(CustomField.workspace == ws)},
            rules=list(Rule.select().where(Rule.workspace == ws).order_by(Rule.position, Rule.id)),
            settings=settings,
            webhooks=[(hook.id, frozenset(hook.events)) for hook in Webhook.select(Webhook.id, Webhook.events)
                      .where((Webhook.workspace == ws) & Webhook.active)],
            lost_reasons={r.id: r for r in LostReason.select().where(LostReason.workspace == ws)
                          .order_by(LostReason.position, LostReason.id)},
            # Not the rest of the row: its health and pull window change without bumping refs_version (0021).
            connectors={c.id: c for c in Connector.select(Connector.id, Connector.public_id, Connector.name,
                                                          Connector.kind)
                        .where(Connector.workspace == ws).order_by(Connector.name)},
        )

    def webhooks_for(self, event_type: str) -> list[int]:
        """The active webhooks subscribed to this event type (or to "*")."""
        return [hook for hook, wanted in self.webhooks if event_type in wanted or "*" in wanted]

    def pipeline(self) -> list[Status]:
        return sorted(self.statuses.values(), key=lambda s: (s.position, s.id))

    def first_status(self) -> Status:
        return self.pipeline()[0]

    def by_public_id(self, table: dict[int, Any], public_id: str | None) -> Any:
        return next((row for row in table.values() if row.public_id == public_id), None)

    @functools.cached_property
    def refs_of_leads(self) -> dict[str, dict[int | None, dict | None]]:
        """The source, status, owner, team, lost reason and connector objects of lead documents by
        internal id, built once per request rather than once per lead (attributes of models cost a
        call each)."""
        return {"source": {None: None, **{i: ref(r) for i, r in self.sources.items()}},
                "status": {i: status_ref(r) for i, r in self.statuses.items()},
                "owner": {None: None, **{i: member_ref(r) for i, r in self.members.items()}},
                "team": {None: None, **{i: ref(r) for i, r in self.teams.items()}},
                "lost_reason": {None: None, **{i: ref(r) for i, r in self.lost_reasons.items()}},
                "connector": {None: None, **{i: ref(c) for i, c in self.connectors.items()}}}


# (database, workspace id) -> (refs_version, Refs): a workspace's reference tables, kept per
# process while the workspace's refs_version (bumped by database triggers on every change of a
# reference table) stands.
_refs_cache: dict[tuple[int, int], tuple[int, Refs]] = {}
_REFS_CACHE_SIZE = 256


def cached_refs(workspace: Workspace, settings: dict) -> Refs:
    """The workspace's reference tables as of its refs_version, read from the database only when
    that version moved; the workspace row and settings are the caller's own."""
    key = (id(database.obj), workspace.id)
    hit = _refs_cache.get(key)
    if hit is None or hit[0] != workspace.refs_version:
        # Loaded after the version was read, so a cached entry is never older than its version.
        loaded = Refs.load(workspace, settings)
        _ = loaded.refs_of_leads   # built now, once per version: the copies below share it
        hit = (workspace.refs_version, loaded)
        if len(_refs_cache) >= _REFS_CACHE_SIZE:
            _refs_cache.clear()
        _refs_cache[key] = hit
    # A shallow copy: the tables and the lead documents' reference objects are the cached ones.
    refs = copy.copy(hit[1])
    refs.workspace, refs.settings = workspace, settings
    return refs


def request_refs() -> Refs:
    """The caller's workspace reference tables, once per request (from the process cache)."""
    from .auth import caller
    from .config import settings

    refs = g.get("refs")
    if refs is None:
        refs = g.refs = cached_refs(caller().workspace, settings())
    return refs
