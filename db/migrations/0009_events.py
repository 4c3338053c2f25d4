"""Events and webhooks: webhook, event and delivery, a transactional outbox.

A change of a webhook's subscription (its workspace, events or active flag) bumps
workspace.refs_version like a change of the other reference tables (0004), so a process caches
which webhooks want which event types and a create with no webhook subscribed costs no query.
Delivery bookkeeping (failing_since, secret rotation) bumps nothing.
"""
from peewee import *

BUMP = 'UPDATE "workspace" SET "refs_version" = "refs_version" + 1 WHERE "id" = '
SUBSCRIPTION = 'workspace_id, events, active'


def up(migrator, db):
    class Workspace(Model):
        class Meta:
            database = db
            table_name = 'workspace'

    class Webhook(Model):
        workspace = ForeignKeyField(Workspace, on_delete='CASCADE', index=False)
        public_id = CharField(max_length=48, unique=True)
        url = CharField(max_length=2048)
        events = JSONField(default=list)
        description = CharField(max_length=500, default='')
        active = BooleanField(default=True)
        disabled_reason = CharField(max_length=500, null=True)
        secret_salt = CharField(max_length=64)
        previous_salt = CharField(max_length=64, null=True)
        previous_expires_at = DateTimeField(null=True)
        failing_since = DateTimeField(null=True)
        created_at = DateTimeField()

        class Meta:
            database = db
            table_name = 'webhook'
            indexes = ((('workspace', 'created_at', 'public_id'), False),)

    class Lead(Model):
        class Meta:
            database = db
            table_name = 'lead'

    class Event(Model):
        workspace = ForeignKeyField(Workspace, on_delete='CASCADE', index=False)
        public_id = CharField(max_length=48, unique=True)
        lead = ForeignKeyField(Lead, null=True, on_delete='CASCADE')
        type = CharField(max_length=48)
        body = TextField()
        created_at = DateTimeField()

        class Meta:
            database = db
            table_name = 'event'

    class Delivery(Model):
        webhook = ForeignKeyField(Webhook, on_delete='CASCADE', index=False)
        event = ForeignKeyField(Event, on_delete='CASCADE', index=False)
        public_id = CharField(max_length=48, unique=True)
        state = CharField(max_length=16, default='pending')
        attempts = IntegerField(default=0)
        failures = IntegerField(default=0)
        last_status = SmallIntegerField(null=True)
        last_error = CharField(max_length=500, null=True)
        last_response = TextField(null=True)
        last_attempt_at = DateTimeField(null=True)
        next_attempt_at = DateTimeField(null=True)
        duration_ms = IntegerField(null=True)
        created_at = DateTimeField()

        class Meta:
            database = db
            table_name = 'delivery'
            indexes = ((('webhook', 'created_at', 'public_id'), False),)

    db.create_tables([Webhook, Event, Delivery])
    db.execute_sql('CREATE INDEX "delivery_due" ON "delivery" ("next_attempt_at") WHERE "next_attempt_at" IS NOT NULL')

    if isinstance(db, PostgresqlDatabase):
        # bump_refs_version() is 0004's: it bumps the old and the new workspace of the row.
        db.execute_sql('CREATE TRIGGER "webhook_refs_version" AFTER INSERT OR DELETE OR UPDATE OF '
                       f'{SUBSCRIPTION} ON "webhook" FOR EACH ROW EXECUTE FUNCTION bump_refs_version()')
        return
    db.execute_sql(f'CREATE TRIGGER "webhook_refs_version_insert" AFTER INSERT ON "webhook" '
                   f'BEGIN {BUMP}NEW.workspace_id; END')
    db.execute_sql(f'CREATE TRIGGER "webhook_refs_version_update" AFTER UPDATE OF {SUBSCRIPTION} ON "webhook" '
                   'BEGIN UPDATE "workspace" SET "refs_version" = "refs_version" + 1 '
                   'WHERE "id" IN (OLD.workspace_id, NEW.workspace_id); END')
    db.execute_sql(f'CREATE TRIGGER "webhook_refs_version_delete" AFTER DELETE ON "webhook" '
                   f'BEGIN {BUMP}OLD.workspace_id; END')


def down(migrator, db):
    if isinstance(db, PostgresqlDatabase):
        db.execute_sql('DROP TRIGGER IF EXISTS "webhook_refs_version" ON "webhook"')
    else:
        for event in ('insert', 'update', 'delete'):
            db.execute_sql(f'DROP TRIGGER IF EXISTS "webhook_refs_version_{event}"')
    for table in ('delivery', 'event', 'webhook'):
        db.execute_sql(f'DROP TABLE IF EXISTS "{table}"')
