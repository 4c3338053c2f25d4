"""Merging duplicates (DESIGN section 21).

- lead.merged_into: the survivor a merged lead (a tombstone) went into; null for every other
  lead. A tombstone stays in the lead table with its phone and e-mail, so the contact indexes
  keep matching them (a create's duplicate lookup stays one indexed lookup, and their
  uniqueness stays the database's) while the scope condition every lead query starts from
  leaves it out. No index of its own: tombstones are found through their merge. The report
  indexes (the conversion report's of 0021, the lost reasons' of 0010, the response report's of
  0019) take it last, so that the reports still read their indexes alone.
- merge: one merge, its survivor and duplicates, and what undoing it needs (the survivor's
  merged fields before and after, the duplicates' contact points and response due times before);
  an erasure clears them.
- merge_move: which history row (activity, note, task, transition, consent, audit entry) came
  from which duplicate, written by one INSERT ... SELECT per kind; an undo moves them back.
"""
from peewee import *
from playhouse.migrate import make_index_name

REPORT_BEFORE = ('workspace_id', 'status_id', 'source_id', 'owner_id', 'channel', 'campaign', 'created_at',
                 'status_changed_at')
REPORT_AFTER = (*REPORT_BEFORE, 'merged_into_id')
# The partial report indexes (0010, 0019), each rebuilt under its name with merged_into_id last.
WITH_DUE_TIME = '"response_due_at" IS NOT NULL'
RESPONDED = f'({WITH_DUE_TIME}) AND ("first_response_seconds" IS NOT NULL)'
PARTIAL = (
    ('lead_workspace_id_lost_reason_id_status_id', ('workspace_id', 'lost_reason_id', 'status_id'),
     '"lost_reason_id" IS NOT NULL'),
    ('lead_workspace_id_owner_id_source_id_response',
     ('workspace_id', 'owner_id', 'source_id', 'response_due_at', 'first_response_at'), WITH_DUE_TIME),
    ('lead_workspace_id_owner_id_first_response_seconds', ('workspace_id', 'owner_id', 'first_response_seconds'),
     RESPONDED),
    ('lead_workspace_id_source_id_first_response_seconds', ('workspace_id', 'source_id', 'first_response_seconds'),
     RESPONDED),
    ('lead_workspace_id_first_response_seconds', ('workspace_id', 'first_response_seconds'), RESPONDED),
)


def _partial(db, columns_of):
    for name, columns, where in PARTIAL:
        listed = ', '.join(f'"{column}"' for column in columns_of(columns))
        db.execute_sql(f'DROP INDEX IF EXISTS "{name}"')
        db.execute_sql(f'CREATE INDEX "{name}" ON "lead" ({listed}) WHERE ({where})')


def up(migrator, db):
    db.execute_sql('ALTER TABLE "lead" ADD COLUMN "merged_into_id" INTEGER REFERENCES "lead" ("id")')

    class Workspace(Model):
        class Meta:
            database = db
            table_name = 'workspace'

    class Lead(Model):
        class Meta:
            database = db
            table_name = 'lead'

    class Member(Model):
        class Meta:
            database = db
            table_name = 'member'

    class Token(Model):
        class Meta:
            database = db
            table_name = 'token'

    class Merge(Model):
        workspace = ForeignKeyField(Workspace, on_delete='CASCADE', index=False)
        public_id = CharField(max_length=48, unique=True)
        survivor = ForeignKeyField(Lead, on_delete='CASCADE', index=False)
        duplicates = JSONField()
        before = JSONField(null=True)
        after = JSONField(null=True)
        tombstones = JSONField(null=True)
        reassigned = JSONField(null=True)
        actor_token = ForeignKeyField(Token, null=True, index=False)
        actor_member = ForeignKeyField(Member, null=True, index=False)
        created_at = DateTimeField()
        undone_at = DateTimeField(null=True)

        class Meta:
            database = db
            table_name = 'merge'
            indexes = ((('survivor', 'created_at'), False),)

    class MergeMove(Model):
        merge = ForeignKeyField(Merge, on_delete='CASCADE', index=False)
        kind = CharField(max_length=16)
        row_id = IntegerField()
        lead = ForeignKeyField(Lead, on_delete='CASCADE', index=False)

        class Meta:
            database = db
            table_name = 'merge_move'
            indexes = ((('merge', 'kind', 'lead'), False),)

    db.create_tables([Merge, MergeMove])
    migrator.migrate(migrator.drop_index('lead', make_index_name('lead', REPORT_BEFORE)),
                     migrator.add_index('lead', REPORT_AFTER))
    _partial(db, lambda columns: (*columns, 'merged_into_id'))
    # Statistics for the rebuilt indexes, as 0017-0021 gather them: without any, a SQLite planner
    # that has statistics for the others could take one of them for the best (a list's order too).
    if isinstance(db, PostgresqlDatabase):
        db.execute_sql('ANALYZE "lead" ("merged_into_id")')
    elif db.execute_sql("SELECT 1 FROM sqlite_master WHERE name = 'sqlite_stat1'").fetchone():
        db.execute_sql('PRAGMA analysis_limit = 1000')
        for name in (make_index_name('lead', REPORT_AFTER), *(name for name, _, _ in PARTIAL)):
            db.execute_sql(f'ANALYZE "{name}"')
        db.execute_sql('PRAGMA analysis_limit = 0')


def down(migrator, db):
    _partial(db, lambda columns: columns)
    migrator.migrate(migrator.drop_index('lead', make_index_name('lead', REPORT_AFTER)),
                     migrator.add_index('lead', REPORT_BEFORE))
    db.execute_sql('DROP TABLE IF EXISTS "merge_move"')
    db.execute_sql('DROP TABLE IF EXISTS "merge"')
    migrator.migrate(migrator.drop_column('lead', 'merged_into_id'))
