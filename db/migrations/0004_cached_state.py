"""Cheaper hot paths at a million leads.

State the database keeps up to date itself, with triggers, so hot paths read it instead of
recomputing it:

- workspace.refs_version, bumped whenever a workspace's statuses, sources, members, teams or
  custom fields change, so a process can cache them and know when to read them again;
- open_lead_count, how many open leads each member owns, for least-open routing (counting them
  per create costs a scan of the team's leads).

And no index on the actor columns of history rows: nothing looks history up by its actor, and
each of those twelve indexes was written by every create, move and note.
"""
from peewee import *

REF_TABLES = ('status', 'source', 'member', 'team', 'custom_field')
# table -> the prefix 0001 gave its index names (peewee named audit_entry's after its model)
HISTORY_TABLES = {'transition': 'transition', 'activity': 'activity', 'note': 'note', 'audit_entry': 'auditentry'}
ACTORS = ('actor_token_id', 'actor_member_id', 'actor_form_id')

BUMP = 'UPDATE "workspace" SET "refs_version" = "refs_version" + 1 WHERE "id" = '
IS_OPEN = "(SELECT kind FROM status WHERE id = {0}.status_id) = 'open'"
ADD_ONE = ('INSERT INTO open_lead_count (member_id, open_leads) SELECT {0}.owner_id, 1 '
           'WHERE {0}.owner_id IS NOT NULL AND ' + IS_OPEN + ' '
           'ON CONFLICT (member_id) DO UPDATE SET open_leads = open_lead_count.open_leads + 1')
TAKE_ONE = ('UPDATE open_lead_count SET open_leads = open_leads - 1 '
            'WHERE member_id = {0}.owner_id AND ' + IS_OPEN)
RECOUNT = ('DELETE FROM open_lead_count WHERE member_id IN (SELECT id FROM member WHERE workspace_id = {0}); '
           'INSERT INTO open_lead_count (member_id, open_leads) '
           'SELECT l.owner_id, COUNT(*) FROM lead l JOIN status s ON s.id = l.status_id '
           "WHERE l.workspace_id = {0} AND l.owner_id IS NOT NULL AND s.kind = 'open' GROUP BY l.owner_id")


def up(migrator, db):
    migrator.migrate(*[migrator.drop_index(table, f'{prefix}_{column}')
                       for table, prefix in HISTORY_TABLES.items() for column in ACTORS])
    # A DDL default (not peewee's add_column): SQLite would otherwise rebuild the workspace table,
    # and dropping it with foreign keys on cascades into every table that refers to it.
    db.execute_sql('ALTER TABLE "workspace" ADD COLUMN "refs_version" INTEGER NOT NULL DEFAULT 0')

    class Member(Model):
        class Meta:
            database = db
            table_name = 'member'

    class OpenLeadCount(Model):
        member = ForeignKeyField(Member, primary_key=True, on_delete='CASCADE')
        open_leads = IntegerField(default=0)
        class Meta:
            database = db
            table_name = 'open_lead_count'
    db.create_tables([OpenLeadCount])
    db.execute_sql(
        'INSERT INTO open_lead_count (member_id, open_leads) '
        'SELECT l.owner_id, COUNT(*) FROM lead l JOIN status s ON s.id = l.status_id '
        "WHERE l.owner_id IS NOT NULL AND s.kind = 'open' GROUP BY l.owner_id")

    if isinstance(db, PostgresqlDatabase):
        db.execute_sql(
            'CREATE FUNCTION bump_refs_version() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN '
            f"IF TG_OP <> 'INSERT' THEN {BUMP}OLD.workspace_id; END IF; "
            "IF TG_OP = 'INSERT' OR (TG_OP = 'UPDATE' AND NEW.workspace_id IS DISTINCT FROM OLD.workspace_id) "
            f"THEN {BUMP}NEW.workspace_id; END IF; RETURN NULL; END $$")
        for table in REF_TABLES:
            db.execute_sql(f'CREATE TRIGGER "{table}_refs_version" AFTER INSERT OR UPDATE OR DELETE ON "{table}" '
                           'FOR EACH ROW EXECUTE FUNCTION bump_refs_version()')
        db.execute_sql(
            'CREATE FUNCTION count_open_leads() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN '
            f"IF TG_OP <> 'INSERT' THEN {TAKE_ONE.format('OLD')}; END IF; "
            f"IF TG_OP <> 'DELETE' THEN {ADD_ONE.format('NEW')}; END IF; RETURN NULL; END $$")
        db.execute_sql('CREATE TRIGGER "lead_open_count" AFTER INSERT OR DELETE OR UPDATE OF owner_id, status_id '
                       'ON "lead" FOR EACH ROW EXECUTE FUNCTION count_open_leads()')
        db.execute_sql(
            'CREATE FUNCTION recount_open_leads() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN '
            f"{RECOUNT.format('NEW.workspace_id')}; RETURN NULL; END $$")
        db.execute_sql('CREATE TRIGGER "status_open_count" AFTER UPDATE OF kind ON "status" FOR EACH ROW '
                       "WHEN ((OLD.kind = 'open') IS DISTINCT FROM (NEW.kind = 'open')) "
                       'EXECUTE FUNCTION recount_open_leads()')
        return

    for table in REF_TABLES:
        db.execute_sql(f'CREATE TRIGGER "{table}_refs_version_insert" AFTER INSERT ON "{table}" '
                       f'BEGIN {BUMP}NEW.workspace_id; END')
        db.execute_sql(f'CREATE TRIGGER "{table}_refs_version_update" AFTER UPDATE ON "{table}" '
                       'BEGIN UPDATE "workspace" SET "refs_version" = "refs_version" + 1 '
                       'WHERE "id" IN (OLD.workspace_id, NEW.workspace_id); END')
        db.execute_sql(f'CREATE TRIGGER "{table}_refs_version_delete" AFTER DELETE ON "{table}" '
                       f'BEGIN {BUMP}OLD.workspace_id; END')
    db.execute_sql(f'CREATE TRIGGER "lead_open_count_insert" AFTER INSERT ON "lead" '
                   f'BEGIN {ADD_ONE.format("NEW")}; END')
    db.execute_sql(f'CREATE TRIGGER "lead_open_count_delete" AFTER DELETE ON "lead" '
                   f'BEGIN {TAKE_ONE.format("OLD")}; END')
    db.execute_sql(f'CREATE TRIGGER "lead_open_count_update" AFTER UPDATE OF owner_id, status_id ON "lead" '
                   f'BEGIN {TAKE_ONE.format("OLD")}; {ADD_ONE.format("NEW")}; END')
    db.execute_sql('CREATE TRIGGER "status_open_count" AFTER UPDATE OF kind ON "status" '
                   "WHEN (OLD.kind = 'open') IS NOT (NEW.kind = 'open') "
                   f'BEGIN {RECOUNT.format("NEW.workspace_id")}; END')


def down(migrator, db):
    if isinstance(db, PostgresqlDatabase):
        for table in REF_TABLES:
            db.execute_sql(f'DROP TRIGGER IF EXISTS "{table}_refs_version" ON "{table}"')
        db.execute_sql('DROP TRIGGER IF EXISTS "lead_open_count" ON "lead"')
        db.execute_sql('DROP TRIGGER IF EXISTS "status_open_count" ON "status"')
        for function in ('bump_refs_version', 'count_open_leads', 'recount_open_leads'):
            db.execute_sql(f'DROP FUNCTION IF EXISTS {function}()')
    else:
        for table in REF_TABLES:
            for event in ('insert', 'update', 'delete'):
                db.execute_sql(f'DROP TRIGGER IF EXISTS "{table}_refs_version_{event}"')
        for name in ('lead_open_count_insert', 'lead_open_count_delete', 'lead_open_count_update',
                     'status_open_count'):
            db.execute_sql(f'DROP TRIGGER IF EXISTS "{name}"')
    migrator.migrate(migrator.drop_table('open_lead_count'), migrator.drop_column('workspace', 'refs_version'),
                     *[migrator.add_index(table, (column,)) for table in HISTORY_TABLES for column in ACTORS])
