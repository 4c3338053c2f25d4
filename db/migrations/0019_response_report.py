"""The response report (DESIGN section 18) for a whole workspace from indexes alone.

- lead (workspace_id, owner_id, source_id, response_due_at, first_response_at), of the leads with a
  response due time: the report's counts by owner and source, grouped in the index's order;
- lead (workspace_id, owner_id, first_response_seconds), (workspace_id, source_id,
  first_response_seconds) and (workspace_id, first_response_seconds), of the responded leads with
  a due time: each owner's, source's and the overall median and p90 are walks down one of them
  (reports.ranked_by_offset). A create writes none of these three: a new lead has no response.
"""
from peewee import *

WITH_DUE_TIME = '"response_due_at" IS NOT NULL'
RESPONDED = f'({WITH_DUE_TIME}) AND ("first_response_seconds" IS NOT NULL)'
INDEXES = (
    ('lead_workspace_id_owner_id_source_id_response',
     ('workspace_id', 'owner_id', 'source_id', 'response_due_at', 'first_response_at'), WITH_DUE_TIME),
    ('lead_workspace_id_owner_id_first_response_seconds', ('workspace_id', 'owner_id', 'first_response_seconds'),
     RESPONDED),
    ('lead_workspace_id_source_id_first_response_seconds', ('workspace_id', 'source_id', 'first_response_seconds'),
     RESPONDED),
    ('lead_workspace_id_first_response_seconds', ('workspace_id', 'first_response_seconds'), RESPONDED),
)


def up(migrator, db):
    for name, columns, where in INDEXES:
        listed = ', '.join(f'"{column}"' for column in columns)
        db.execute_sql(f'CREATE INDEX "{name}" ON "lead" ({listed}) WHERE ({where})')
    # Statistics for the new indexes, as 0017 and 0018 gather them: without any, a SQLite planner
    # that has statistics for the others could take a new index for the best.
    if isinstance(db, PostgresqlDatabase):
        db.execute_sql('ANALYZE "lead" ("first_response_seconds")')
    elif db.execute_sql("SELECT 1 FROM sqlite_master WHERE name = 'sqlite_stat1'").fetchone():
        db.execute_sql('PRAGMA analysis_limit = 1000')
        for name, _, _ in INDEXES:
            db.execute_sql(f'ANALYZE "{name}"')
        db.execute_sql('PRAGMA analysis_limit = 0')


def down(migrator, db):
    for name, _, _ in INDEXES:
        db.execute_sql(f'DROP INDEX IF EXISTS "{name}"')
