"""Lost reasons: why leads are lost, chosen on a move to a lost status.

- lost_reason: a workspace's reasons (setup's [[lost_reasons]]), in the cached reference tables,
  so its changes bump workspace.refs_version like the other reference tables (0004);
- transition.lost_reason_id: the reason a move to a lost status gave;
- lead.lost_reason_id: the reason of the lost status the lead is in (NULL once re-opened), with a
  partial index for the conversion report's count by reason (only lost leads with a reason are in it).

Batch creates and upserts need no schema. Nothing here depends on the other migrations numbered
after 0008, so it applies with or without them.
"""
from peewee import *

BUMP = 'UPDATE "workspace" SET "refs_version" = "refs_version" + 1 WHERE "id" = '
LOST_INDEX = ('CREATE INDEX "lead_workspace_id_lost_reason_id_status_id" ON "lead" '
              '("workspace_id", "lost_reason_id", "status_id") WHERE "lost_reason_id" IS NOT NULL')


def up(migrator, db):
    class Workspace(Model):
        class Meta:
            database = db
            table_name = 'workspace'

    class LostReason(Model):
        workspace = ForeignKeyField(Workspace, on_delete='CASCADE', index=False)
        public_id = CharField(unique=True, max_length=48)
        name = CharField(max_length=100)
        position = IntegerField(default=0)
        class Meta:
            database = db
            table_name = 'lost_reason'
            indexes = ((('workspace', 'name'), True),)
    db.create_tables([LostReason])

    # Nullable columns without a default: no table rewrite on either database.
    for table in ('lead', 'transition'):
        db.execute_sql(f'ALTER TABLE "{table}" ADD COLUMN "lost_reason_id" INTEGER REFERENCES "lost_reason" ("id")')
    db.execute_sql(LOST_INDEX)

    if isinstance(db, PostgresqlDatabase):
        # bump_refs_version() is 0004's: it bumps the old and the new workspace of the row.
        db.execute_sql('CREATE TRIGGER "lost_reason_refs_version" AFTER INSERT OR UPDATE OR DELETE ON "lost_reason" '
                       'FOR EACH ROW EXECUTE FUNCTION bump_refs_version()')
        return
    db.execute_sql(f'CREATE TRIGGER "lost_reason_refs_version_insert" AFTER INSERT ON "lost_reason" '
                   f'BEGIN {BUMP}NEW.workspace_id; END')
    db.execute_sql('CREATE TRIGGER "lost_reason_refs_version_update" AFTER UPDATE ON "lost_reason" '
                   'BEGIN UPDATE "workspace" SET "refs_version" = "refs_version" + 1 '
                   'WHERE "id" IN (OLD.workspace_id, NEW.workspace_id); END')
    db.execute_sql(f'CREATE TRIGGER "lost_reason_refs_version_delete" AFTER DELETE ON "lost_reason" '
                   f'BEGIN {BUMP}OLD.workspace_id; END')


def down(migrator, db):
    if isinstance(db, PostgresqlDatabase):
        db.execute_sql('DROP TRIGGER IF EXISTS "lost_reason_refs_version" ON "lost_reason"')
    else:
        for event in ('insert', 'update', 'delete'):
            db.execute_sql(f'DROP TRIGGER IF EXISTS "lost_reason_refs_version_{event}"')
    db.execute_sql('DROP INDEX IF EXISTS "lead_workspace_id_lost_reason_id_status_id"')
    migrator.migrate(migrator.drop_column('transition', 'lost_reason_id'),
                     migrator.drop_column('lead', 'lost_reason_id'), migrator.drop_table('lost_reason'))
