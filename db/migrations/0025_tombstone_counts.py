"""A merged lead (a tombstone, 0024) is nobody's open lead.

open_lead_count (0004, 0022) counts the open-status leads a member owns, for least-open routing
and max_open_leads. A tombstone keeps its owner and status (an undo gives them back), so the
triggers now count a lead only while merged_into_id is null, and fire when merged_into_id
changes: a merge takes its duplicates off their owners' counts, an undo puts them back.
"""
from peewee import *

IS_OPEN = ("{0}.merged_into_id IS NULL AND (SELECT kind FROM status WHERE id = {0}.status_id) = 'open'")
OLD_IS_OPEN = "(SELECT kind FROM status WHERE id = {0}.status_id) = 'open'"


def add_one(is_open):
    return ('INSERT INTO open_lead_count (member_id, open_leads) SELECT {0}.owner_id, 1 '
            'WHERE {0}.owner_id IS NOT NULL AND ' + is_open + ' '
            'ON CONFLICT (member_id) DO UPDATE SET open_leads = open_lead_count.open_leads + 1')


def take_one(is_open):
    return 'UPDATE open_lead_count SET open_leads = open_leads - 1 WHERE member_id = {0}.owner_id AND ' + is_open


def recount(counted):
    return ('UPDATE open_lead_count SET open_leads = 0 WHERE member_id IN (SELECT id FROM member WHERE workspace_id = {0}); '
            'INSERT INTO open_lead_count (member_id, open_leads) '
            'SELECT l.owner_id, COUNT(*) FROM lead l JOIN status s ON s.id = l.status_id '
            "WHERE l.workspace_id = {0} AND l.owner_id IS NOT NULL AND s.kind = 'open'" + counted + ' GROUP BY l.owner_id '
            'ON CONFLICT (member_id) DO UPDATE SET open_leads = excluded.open_leads')


def _triggers(db, is_open, counted, columns):
    if isinstance(db, PostgresqlDatabase):
        db.execute_sql(
            'CREATE OR REPLACE FUNCTION count_open_leads() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN '
            f"IF TG_OP <> 'INSERT' THEN {take_one(is_open).format('OLD')}; END IF; "
            f"IF TG_OP <> 'DELETE' THEN {add_one(is_open).format('NEW')}; END IF; RETURN NULL; END $$")
        db.execute_sql('DROP TRIGGER IF EXISTS "lead_open_count" ON "lead"')
        db.execute_sql(f'CREATE TRIGGER "lead_open_count" AFTER INSERT OR DELETE OR UPDATE OF {columns} '
                       'ON "lead" FOR EACH ROW EXECUTE FUNCTION count_open_leads()')
        db.execute_sql(
            'CREATE OR REPLACE FUNCTION recount_open_leads() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN '
            f"{recount(counted).format('NEW.workspace_id')}; RETURN NULL; END $$")
        return
    for name in ('lead_open_count_insert', 'lead_open_count_delete', 'lead_open_count_update', 'status_open_count'):
        db.execute_sql(f'DROP TRIGGER IF EXISTS "{name}"')
    db.execute_sql(f'CREATE TRIGGER "lead_open_count_insert" AFTER INSERT ON "lead" '
                   f'BEGIN {add_one(is_open).format("NEW")}; END')
    db.execute_sql(f'CREATE TRIGGER "lead_open_count_delete" AFTER DELETE ON "lead" '
                   f'BEGIN {take_one(is_open).format("OLD")}; END')
    db.execute_sql(f'CREATE TRIGGER "lead_open_count_update" AFTER UPDATE OF {columns} ON "lead" '
                   f'BEGIN {take_one(is_open).format("OLD")}; {add_one(is_open).format("NEW")}; END')
    # SQLite takes an upsert after INSERT ... SELECT only when the SELECT has a WHERE; it has one.
    db.execute_sql('CREATE TRIGGER "status_open_count" AFTER UPDATE OF kind ON "status" '
                   "WHEN (OLD.kind = 'open') IS NOT (NEW.kind = 'open') "
                   f'BEGIN {recount(counted).format("NEW.workspace_id")}; END')


def _recount_workspaces_with_tombstones(db, counted):
    for (workspace_id,) in db.execute_sql('SELECT DISTINCT workspace_id FROM lead WHERE merged_into_id IS NOT NULL').fetchall():
        for sql in recount(counted).format(int(workspace_id)).split('; '):
            db.execute_sql(sql)


def up(migrator, db):
    _triggers(db, IS_OPEN, ' AND l.merged_into_id IS NULL', 'owner_id, status_id, merged_into_id')
    _recount_workspaces_with_tombstones(db, ' AND l.merged_into_id IS NULL')


def down(migrator, db):
    _triggers(db, OLD_IS_OPEN, '', 'owner_id, status_id')
    _recount_workspaces_with_tombstones(db, '')
