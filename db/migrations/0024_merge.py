"""Merging duplicates (DESIGN section 21).

- lead.merged_into: the survivor a merged lead (a tombstone) went into; null for every other
  lead. A tombstone stays in the lead table with its phone and e-mail, so the contact indexes
  keep matching them (a create's duplicate lookup stays one indexed lookup, and their
  uniqueness stays the database's) while the scope condition every lead query starts from
  leaves it out. No index of its own: tombstones are found through their merge. The conversion
  report's index (0021) takes it last, so that report still reads the index alone.
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


def down(migrator, db):
    migrator.migrate(migrator.drop_index('lead', make_index_name('lead', REPORT_AFTER)),
                     migrator.add_index('lead', REPORT_BEFORE))
    db.execute_sql('DROP TABLE IF EXISTS "merge_move"')
    db.execute_sql('DROP TABLE IF EXISTS "merge"')
    migrator.migrate(migrator.drop_column('lead', 'merged_into_id'))
