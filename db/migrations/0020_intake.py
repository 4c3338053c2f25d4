"""Intake: connectors, what they received, and where every lead came from (DESIGN section 19).

- connector: an inbound feed of a workspace (kind, source, the salt its key derives from, what
  setup says of it, its health, a pulling connector's window);
- intake: one payload a connector received, its sender's id (unique per connector), outcome,
  lead, problems and raw payload, and a queued fetch's attempts (Meta's Graph API);
- lead.channel, lead.connector, lead.attribution and lead.campaign;
- actor_connector on every history table: a connector is the actor of what it creates;
- consent.connector: a connector with a notice_version records its leads' consent, as a form does.

The lead's new columns are nullable or have DDL defaults, so SQLite adds them without rebuilding
the table and bulk loaders that do not name them keep working. Existing leads are counted as
`api`: which of them a form or an import made was not recorded on the lead.
"""
from peewee import *


def up(migrator, db):
    json = 'JSONB' if isinstance(db, PostgresqlDatabase) else 'TEXT'
    class Workspace(Model):
        class Meta:
            database = db
            table_name = 'workspace'

    class Source(Model):
        class Meta:
            database = db
            table_name = 'source'

    class Lead(Model):
        class Meta:
            database = db
            table_name = 'lead'

    class Connector(Model):
        workspace = ForeignKeyField(Workspace, on_delete='CASCADE', index=False)
        public_id = CharField(max_length=48, unique=True)
        name = CharField(max_length=100)
        kind = CharField(max_length=16)
        source = ForeignKeyField(Source, null=True, index=False)
        key_salt = CharField(max_length=64)
        settings = JSONField()
        last_received_at = DateTimeField(null=True)
        last_error = CharField(max_length=500, null=True)
        last_error_at = DateTimeField(null=True)
        pulled_until = DateTimeField(null=True)
        pull_after = DateTimeField(null=True)
        created_at = DateTimeField()

        class Meta:
            database = db
            table_name = 'connector'
            indexes = ((('workspace', 'name'), True),)

    class Intake(Model):
        workspace = ForeignKeyField(Workspace, on_delete='CASCADE', index=False)
        connector = ForeignKeyField(Connector, on_delete='CASCADE', index=False)
        public_id = CharField(max_length=48, unique=True)
        external_id = CharField(max_length=200, null=True)
        outcome = CharField(max_length=16)
        lead = ForeignKeyField(Lead, null=True, on_delete='SET NULL', index=False)
        errors = JSONField(null=True)
        payload = JSONField(null=True)
        received_at = DateTimeField()
        updated_at = DateTimeField()
        attempts = IntegerField()
        failures = IntegerField()
        last_error = CharField(max_length=500, null=True)
        next_attempt_at = DateTimeField(null=True)

        class Meta:
            database = db
            table_name = 'intake'
            indexes = (
                (('connector', 'received_at', 'public_id'), False),
                (('connector', 'outcome', 'received_at', 'public_id'), False),
            )

    Intake.add_index(Intake.index(Intake.connector, Intake.external_id, unique=True,
                                  where=Intake.external_id.is_null(False), name='intake_connector_id_external_id'))
    Intake.add_index(Intake.index(Intake.lead, where=Intake.lead.is_null(False), name='intake_lead_id'))
    Intake.add_index(Intake.index(Intake.next_attempt_at, where=Intake.next_attempt_at.is_null(False),
                                  name='intake_due'))
    # What the 30-day cut reads: the payloads still kept of created and duplicate intakes, oldest
    # first per connector (rejected, test and pending ones keep theirs, and stay out of it).
    Intake.add_index(Intake.index(Intake.connector, Intake.received_at,
                                  where=Intake.payload.is_null(False) & Intake.outcome.in_(['created', 'duplicate']),
                                  name='intake_payload_kept'))
    db.create_tables([Connector, Intake])

    db.execute_sql('ALTER TABLE "lead" ADD COLUMN "channel" VARCHAR(16) NOT NULL DEFAULT \'api\'')
    db.execute_sql('ALTER TABLE "lead" ADD COLUMN "connector_id" INTEGER REFERENCES "connector" ("id")')
    db.execute_sql(f'ALTER TABLE "lead" ADD COLUMN "attribution" {json}')
    db.execute_sql('ALTER TABLE "lead" ADD COLUMN "campaign" VARCHAR(200)')
    for table in ('transition', 'activity', 'note', 'audit_entry', 'task', 'consent'):
        column = 'connector_id' if table == 'consent' else 'actor_connector_id'
        db.execute_sql(f'ALTER TABLE "{table}" ADD COLUMN "{column}" INTEGER REFERENCES "connector" ("id")')


def down(migrator, db):
    for table in ('transition', 'activity', 'note', 'audit_entry', 'task'):
        migrator.migrate(migrator.drop_column(table, 'actor_connector_id'))
    migrator.migrate(migrator.drop_column('consent', 'connector_id'))
    migrator.migrate(*(migrator.drop_column('lead', column)
                       for column in ('channel', 'connector_id', 'attribution', 'campaign')))
    db.execute_sql('DROP TABLE IF EXISTS "intake"')
    db.execute_sql('DROP TABLE IF EXISTS "connector"')
