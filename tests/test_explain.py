"""With 100,000 leads and the statistics a bulk load leaves, every list query (each sort x each
role's scope) reads an index for both its scope filter and its order: no full scan, no sort step,
at the first page and deep ones; and a create's duplicate lookup reads the contact indexes."""

import random

import pytest

from conftest import bulk_leads, plan
from leadsvc import pipeline
from leadsvc.auth import Caller, lead_scope
from leadsvc.bulk_load import gather_statistics
from leadsvc.db import is_postgres
from leadsvc.listing import SORTS
from leadsvc.models import Lead, Token, Workspace

ROLES = {"admin": ("admin@t.test", "lead_workspace_id"), "manager": ("nmgr@t.test", "lead_team_id"),
         "agent": ("n1@t.test", "lead_owner_id")}


@pytest.fixture
def big_ws(ws):
    bulk_leads(ws, 100_000, random.Random(100))   # none has an e-mail
    gather_statistics()   # as `leadsvc demo --leads` does after its load
    return ws


def test_list_queries_use_the_scope_index_for_filter_and_order(big_ws):
    for role, (email, index_prefix) in ROLES.items():
        member = big_ws.member(email)
        caller = Caller(Token(), member, member.workspace, frozenset())
        scoped = Lead.select().where(lead_scope(caller))
        for sort, order in SORTS.items():
            first = list(order.apply(scoped, None).limit(51))
            deep_row = list(order.apply(scoped, None).offset(20_000 if role == "admin" else 5_000).limit(1))[0]
            for position in (None, order.position(deep_row)):
                text = plan(*order.apply(scoped, position).limit(51).sql())
                column = order.column.column_name
                assert f"{index_prefix}_{column}_public_id" in text, (role, sort, text)
                if is_postgres():
                    assert '"Seq Scan"' not in text and '"Sort"' not in text, (role, sort, text)
                else:
                    assert text.startswith("SEARCH") and "TEMP B-TREE" not in text, (role, sort, text)
            assert len(first) == 51


def test_the_duplicate_lookup_reads_the_contact_indexes(big_ws):
    # A sample of the e-mail index sees only NULLs; planned on it, the lookup scanned the workspace.
    workspace = Workspace.get(Workspace.public_id == big_ws.public_id)
    text = plan(*pipeline.leads_with_contact(workspace.id, "+919800000042", "someone@example.test").sql())
    assert "lead_workspace_id_phone" in text and "lead_workspace_id_email" in text, text
    if is_postgres():
        assert '"Seq Scan"' not in text, text
    else:
        assert text.startswith("MULTI-INDEX OR"), text
