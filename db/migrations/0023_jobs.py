"""Jobs (DESIGN section 20): long changes run in batches by the clock, resumed after a crash.

- job: kind, state, progress (total, done, failed, the first errors), the creator's member and
  token (the actor of every change), its parameters and its position (every item before it is
  done, committed with that batch's work);
- job_item: the job's items in order, fixed when the job is created: a lead by internal id or,
  for an import, a CSV row (its number and cells). A finished job's items are deleted. Its lead
  column has no index: the lead table's deletes (none but a workspace's) check it by a scan.
"""
from peewee import *


def up(migrator, db):
    class Workspace(Model):
        class Meta:
            database = db
            table_name = 'workspace'

    class Member(Model):
        class Meta:
            database = db
            table_name = 'member'

    class Token(Model):
        class Meta:
            database = db
            table_name = 'token'

    class Lead(Model):
        class Meta:
            database = db
            table_name = 'lead'

    class Job(Model):
        workspace = ForeignKeyField(Workspace, on_delete='CASCADE', index=False)
        public_id = CharField(max_length=48, unique=True)
        kind = CharField(max_length=32)
        state = CharField(max_length=16)
        member = ForeignKeyField(Member, on_delete='CASCADE', index=False)
        token = ForeignKeyField(Token, on_delete='CASCADE', index=False)
        request_id = CharField(max_length=200, null=True)
        params = JSONField()
        total = IntegerField()
        position = IntegerField()
        done = IntegerField()
        failed = IntegerField()
        errors = JSONField()
        created_at = DateTimeField()
        finished_at = DateTimeField(null=True)

        class Meta:
            database = db
            table_name = 'job'
            indexes = ((('workspace', 'state'), False),)

    class JobItem(Model):
        job = ForeignKeyField(Job, on_delete='CASCADE', index=False)
        position = IntegerField()
        lead = ForeignKeyField(Lead, null=True, on_delete='SET NULL', index=False)
        data = JSONField(null=True)

        class Meta:
            database = db
            table_name = 'job_item'
            primary_key = CompositeKey('job', 'position')

    db.create_tables([Job, JobItem])


def down(migrator, db):
    db.execute_sql('DROP TABLE IF EXISTS "job_item"')
    db.execute_sql('DROP TABLE IF EXISTS "job"')
