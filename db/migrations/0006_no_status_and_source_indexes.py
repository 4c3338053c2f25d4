"""No single-column indexes on the status and source of leads and transitions.

Every create wrote them (a page each on SQLite, and a B-tree insert each on PostgreSQL) and no
query reads them: the report indexes (0003) lead with the workspace, then the status (and the
source, for leads), and lists filter within a scope index. They only served the foreign-key check
when a status or source row is deleted, which the service never does while leads use it (a
setup removes nothing); such a delete now scans those tables once.
"""

INDEXES = {   # name: (table, column)
    "lead_status_id": ('"lead"', '"status_id"'),
    "lead_source_id": ('"lead"', '"source_id"'),
    "transition_from_status_id": ('"transition"', '"from_status_id"'),
    "transition_to_status_id": ('"transition"', '"to_status_id"'),
}


def up(migrator, db):
    for name in INDEXES:
        db.execute_sql(f'DROP INDEX IF EXISTS "{name}"')


def down(migrator, db):
    for name, (table, column) in INDEXES.items():
        db.execute_sql(f'CREATE INDEX IF NOT EXISTS "{name}" ON {table} ({column})')
