"""Tasks: follow-ups on leads, and what a lead shows of its open ones.

- task: kind, title, notes, due and reminder times, assignee, state, outcome, who created it; the
  lead's owner and team copied beside it, so that the task list's indexes start with the scope
  columns as the lead list's do;
- lead.next_task_due_at and lead.open_tasks, kept by every task change, and lead.task_sort_at
  (next_task_due_at, or 9999-12-31 without one) with an index per scope root for
  `sort=next_task_due_at` and `filter[next_task]`.

The lead's new columns have DDL defaults, so SQLite adds them without rebuilding the table, and
bulk loaders that do not name them keep working. Existing leads have no tasks: the defaults are
their true values.
"""
from peewee import *


def up(migrator, db):
    timestamp = 'TIMESTAMP' if isinstance(db, PostgresqlDatabase) else 'DATETIME'
    db.execute_sql(f'ALTER TABLE "lead" ADD COLUMN "next_task_due_at" {timestamp}')
    db.execute_sql('ALTER TABLE "lead" ADD COLUMN "open_tasks" INTEGER NOT NULL DEFAULT 0')
    db.execute_sql(f'ALTER TABLE "lead" ADD COLUMN "task_sort_at" {timestamp} NOT NULL DEFAULT \'9999-12-31 00:00:00\'')
    for scope in ('workspace_id', 'team_id', 'owner_id'):
        db.execute_sql(f'CREATE INDEX "lead_{scope}_task_sort_at_public_id" ON "lead" ("{scope}", "task_sort_at", '
                       '"public_id")')

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

    class Team(Model):
        class Meta:
            database = db
            table_name = 'team'

    class Token(Model):
        class Meta:
            database = db
            table_name = 'token'

    class Form(Model):
        class Meta:
            database = db
            table_name = 'form'

    class Task(Model):
        actor_token = ForeignKeyField(Token, null=True, index=False)
        actor_member = ForeignKeyField(Member, null=True, index=False)
        actor_form = ForeignKeyField(Form, null=True, index=False)
        workspace = ForeignKeyField(Workspace, on_delete='CASCADE', index=False)
        public_id = CharField(max_length=48, unique=True)
        lead = ForeignKeyField(Lead, on_delete='CASCADE', index=False)
        lead_owner = ForeignKeyField(Member, null=True, index=False)
        lead_team = ForeignKeyField(Team, null=True, index=False)
        kind = CharField(max_length=16)
        title = CharField(max_length=200, null=True)
        notes = TextField(null=True)
        due_at = DateTimeField()
        remind_at = DateTimeField(null=True)
        assignee = ForeignKeyField(Member, index=False)
        state = CharField(max_length=16)
        done_at = DateTimeField(null=True)
        closed_at = DateTimeField()
        outcome = TextField(null=True)
        version = IntegerField()
        created_at = DateTimeField()
        updated_at = DateTimeField()

        class Meta:
            database = db
            table_name = 'task'
            indexes = (
                (('workspace', 'state', 'due_at', 'public_id'), False),
                (('lead_team', 'state', 'due_at', 'public_id'), False),
                (('lead_owner', 'state', 'due_at', 'public_id'), False),
                (('workspace', 'state', 'closed_at', 'public_id'), False),
                (('lead_team', 'state', 'closed_at', 'public_id'), False),
                (('lead_owner', 'state', 'closed_at', 'public_id'), False),
                (('workspace', 'assignee', 'state', 'due_at', 'public_id'), False),
                (('lead', 'state', 'due_at', 'public_id'), False),
            )
    db.create_tables([Task])
    # Statistics for the new lead indexes and columns. A SQLite database that has statistics (a
    # bulk load gathers them) but none for these indexes has its planner take them for the best,
    # and every other sort's first page then sorts the workspace's leads.
    if isinstance(db, PostgresqlDatabase):
        db.execute_sql('ANALYZE "lead" ("task_sort_at", "next_task_due_at", "open_tasks")')
    elif db.execute_sql("SELECT 1 FROM sqlite_master WHERE name = 'sqlite_stat1'").fetchone():
        db.execute_sql('PRAGMA analysis_limit = 1000')   # a sample of each index is enough
        for scope in ('workspace_id', 'team_id', 'owner_id'):
            db.execute_sql(f'ANALYZE "lead_{scope}_task_sort_at_public_id"')
        db.execute_sql('PRAGMA analysis_limit = 0')


def down(migrator, db):
    db.execute_sql('DROP TABLE IF EXISTS "task"')
    for scope in ('workspace_id', 'team_id', 'owner_id'):
        db.execute_sql(f'DROP INDEX IF EXISTS "lead_{scope}_task_sort_at_public_id"')
    migrator.migrate(migrator.drop_column('lead', 'next_task_due_at'), migrator.drop_column('lead', 'open_tasks'),
                     migrator.drop_column('lead', 'task_sort_at'))
