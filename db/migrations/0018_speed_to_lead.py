"""Speed to lead and stale leads (DESIGN section 18).

- workspace.working_hours (setup's [working_hours], null: around the clock) and
  workspace.first_response_minutes (setup's [sla], null: no response due time);
  source.first_response_minutes (a source's own, which wins for its leads);
  status.stale_after_days (an open status's leads go stale after that many untouched days);
- lead.response_due_at (null: no SLA), lead.first_response_at and lead.first_response_seconds
  (working seconds from creation), lead.stale_since; lead.response_sort_at (response_due_at, or
  9999-12-31 without one) with an index per scope root for `sort=response_due_at`.

The lead's new columns are nullable or have DDL defaults, so SQLite adds them without rebuilding
the table, and bulk loaders that do not name them keep working. Existing leads get no due time:
they were created before their workspace had an SLA.
"""
from peewee import *


def up(migrator, db):
    timestamp = 'TIMESTAMP' if isinstance(db, PostgresqlDatabase) else 'DATETIME'
    migrator.migrate(
        migrator.add_column('workspace', 'working_hours', JSONField(null=True)),
        migrator.add_column('workspace', 'first_response_minutes', IntegerField(null=True)),
        migrator.add_column('source', 'first_response_minutes', IntegerField(null=True)),
        migrator.add_column('status', 'stale_after_days', IntegerField(null=True)),
    )
    for column in ('response_due_at', 'first_response_at', 'stale_since'):
        db.execute_sql(f'ALTER TABLE "lead" ADD COLUMN "{column}" {timestamp}')
    db.execute_sql('ALTER TABLE "lead" ADD COLUMN "first_response_seconds" INTEGER')
    db.execute_sql(f'ALTER TABLE "lead" ADD COLUMN "response_sort_at" {timestamp} NOT NULL '
                   'DEFAULT \'9999-12-31 00:00:00\'')
    for scope in ('workspace_id', 'team_id', 'owner_id'):
        db.execute_sql(f'CREATE INDEX "lead_{scope}_response_sort_at_public_id" ON "lead" ("{scope}", '
                       '"response_sort_at", "public_id")')
    # Statistics for the new indexes, as 0017 gathers them, for the same reason.
    if isinstance(db, PostgresqlDatabase):
        db.execute_sql('ANALYZE "lead" ("response_sort_at", "response_due_at", "first_response_at", "stale_since")')
    elif db.execute_sql("SELECT 1 FROM sqlite_master WHERE name = 'sqlite_stat1'").fetchone():
        db.execute_sql('PRAGMA analysis_limit = 1000')
        for scope in ('workspace_id', 'team_id', 'owner_id'):
            db.execute_sql(f'ANALYZE "lead_{scope}_response_sort_at_public_id"')
        db.execute_sql('PRAGMA analysis_limit = 0')


def down(migrator, db):
    for scope in ('workspace_id', 'team_id', 'owner_id'):
        db.execute_sql(f'DROP INDEX IF EXISTS "lead_{scope}_response_sort_at_public_id"')
    migrator.migrate(*(migrator.drop_column('lead', column) for column in (
        'response_due_at', 'first_response_at', 'first_response_seconds', 'response_sort_at', 'stale_since')),
        migrator.drop_column('workspace', 'working_hours'), migrator.drop_column('workspace', 'first_response_minutes'),
        migrator.drop_column('source', 'first_response_minutes'), migrator.drop_column('status', 'stale_after_days'))
