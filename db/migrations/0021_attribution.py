"""Attribution (DESIGN section 19) in the reports and the lead documents.

- The conversion report's lead index takes channel and campaign after owner, so its breakdowns by
  channel and by campaign come from the index alone, in the same pass as those by source and
  owner. It replaces 0003's index rather than adding one: every index costs every create.
- A change of a connector's name (or its workspace, public id or kind) bumps
  workspace.refs_version like a change of the other reference tables (0004), so lead documents
  name their connector from the cached reference data. Its health and pull window bump nothing.
"""
from peewee import *
from playhouse.migrate import make_index_name

BEFORE = ('workspace_id', 'status_id', 'source_id', 'owner_id', 'created_at', 'status_changed_at')
AFTER = ('workspace_id', 'status_id', 'source_id', 'owner_id', 'channel', 'campaign', 'created_at',
         'status_changed_at')
CACHED = 'workspace_id, public_id, name, kind'
BUMP = 'UPDATE "workspace" SET "refs_version" = "refs_version" + 1 WHERE "id" = '


def up(migrator, db):
    migrator.migrate(migrator.drop_index('lead', make_index_name('lead', BEFORE)),
                     migrator.add_index('lead', AFTER))
    if isinstance(db, PostgresqlDatabase):
        db.execute_sql('ANALYZE "lead" ("channel", "campaign")')
        # bump_refs_version() is 0004's: it bumps the old and the new workspace of the row.
        db.execute_sql('CREATE TRIGGER "connector_refs_version" AFTER INSERT OR DELETE OR UPDATE OF '
                       f'{CACHED} ON "connector" FOR EACH ROW EXECUTE FUNCTION bump_refs_version()')
        return
    # Statistics for the new index, as 0019 gathers them: without any, a planner that has
    # statistics for the others could misjudge it.
    if db.execute_sql("SELECT 1 FROM sqlite_master WHERE name = 'sqlite_stat1'").fetchone():
        db.execute_sql('PRAGMA analysis_limit = 1000')
        db.execute_sql(f'ANALYZE "{make_index_name("lead", AFTER)}"')
        db.execute_sql('PRAGMA analysis_limit = 0')
    db.execute_sql(f'CREATE TRIGGER "connector_refs_version_insert" AFTER INSERT ON "connector" '
                   f'BEGIN {BUMP}NEW.workspace_id; END')
    db.execute_sql(f'CREATE TRIGGER "connector_refs_version_update" AFTER UPDATE OF {CACHED} ON "connector" '
                   'BEGIN UPDATE "workspace" SET "refs_version" = "refs_version" + 1 '
                   'WHERE "id" IN (OLD.workspace_id, NEW.workspace_id); END')
    db.execute_sql(f'CREATE TRIGGER "connector_refs_version_delete" AFTER DELETE ON "connector" '
                   f'BEGIN {BUMP}OLD.workspace_id; END')


def down(migrator, db):
    if isinstance(db, PostgresqlDatabase):
        db.execute_sql('DROP TRIGGER IF EXISTS "connector_refs_version" ON "connector"')
    else:
        for event in ('insert', 'update', 'delete'):
            db.execute_sql(f'DROP TRIGGER IF EXISTS "connector_refs_version_{event}"')
    migrator.migrate(migrator.drop_index('lead', make_index_name('lead', AFTER)),
                     migrator.add_index('lead', BEFORE))
