"""workspace.refs_version: bumped by triggers whenever a workspace's statuses, sources, members,
teams or custom fields change, so a process can cache them and know when to read them again."""
from peewee import *

TABLES = ('status', 'source', 'member', 'team', 'custom_field')


def up(migrator, db):
    # A DDL default (not peewee's add_column): SQLite would otherwise rebuild the workspace table,
    # and dropping it with foreign keys on cascades into every table that refers to it.
    db.execute_sql('ALTER TABLE "workspace" ADD COLUMN "refs_version" INTEGER NOT NULL DEFAULT 0')
    bump = 'UPDATE "workspace" SET "refs_version" = "refs_version" + 1 WHERE "id" = '
    if isinstance(db, PostgresqlDatabase):
        db.execute_sql(
            'CREATE OR REPLACE FUNCTION bump_refs_version() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN '
            f"IF TG_OP <> 'INSERT' THEN {bump}OLD.workspace_id; END IF; "
            f"IF TG_OP = 'INSERT' OR (TG_OP = 'UPDATE' AND NEW.workspace_id IS DISTINCT FROM OLD.workspace_id) "
            f"THEN {bump}NEW.workspace_id; END IF; "
            'RETURN NULL; END $$')
        for table in TABLES:
            db.execute_sql(f'CREATE TRIGGER "{table}_refs_version" AFTER INSERT OR UPDATE OR DELETE ON "{table}" '
                           'FOR EACH ROW EXECUTE FUNCTION bump_refs_version()')
        return
    for table in TABLES:
        db.execute_sql(f'CREATE TRIGGER "{table}_refs_version_insert" AFTER INSERT ON "{table}" '
                       f'BEGIN {bump}NEW.workspace_id; END')
        db.execute_sql(f'CREATE TRIGGER "{table}_refs_version_update" AFTER UPDATE ON "{table}" '
                       f'BEGIN UPDATE "workspace" SET "refs_version" = "refs_version" + 1 '
                       'WHERE "id" IN (OLD.workspace_id, NEW.workspace_id); END')
        db.execute_sql(f'CREATE TRIGGER "{table}_refs_version_delete" AFTER DELETE ON "{table}" '
                       f'BEGIN {bump}OLD.workspace_id; END')


def down(migrator, db):
    if isinstance(db, PostgresqlDatabase):
        for table in TABLES:
            db.execute_sql(f'DROP TRIGGER IF EXISTS "{table}_refs_version" ON "{table}"')
        db.execute_sql('DROP FUNCTION IF EXISTS bump_refs_version()')
    else:
        for table in TABLES:
            for event in ('insert', 'update', 'delete'):
                db.execute_sql(f'DROP TRIGGER IF EXISTS "{table}_refs_version_{event}"')
    migrator.migrate(migrator.drop_column('workspace', 'refs_version'))
