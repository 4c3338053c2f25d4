"""Privacy (India's DPDP Act 2023): erasure, consent and personal custom fields.

- lead: do_not_contact, erased_at, and consent (the latest consent record's document);
- consent: each consent given through a form or an API create, and its withdrawal;
- custom_field.personal: values an erasure clears (text fields are personal unless set false);
- form: the privacy notice its page shows, the notice's version, and whether consent is required;
- activity.summary, activity.data and note.body may be null: an erased lead's history keeps its
  kinds, actors and times without the text.

New NOT NULL columns come with a DDL default, so SQLite adds them without rebuilding the table
(and bulk loaders that do not name them keep working). Only the columns and tables of this
feature are touched: the migration applies with or without 0009 and 0010.
"""
from peewee import *


def up(migrator, db):
    boolean = 'BOOLEAN' if isinstance(db, PostgresqlDatabase) else 'INTEGER'
    json = 'JSONB' if isinstance(db, PostgresqlDatabase) else 'TEXT'
    timestamp = 'TIMESTAMP' if isinstance(db, PostgresqlDatabase) else 'DATETIME'
    db.execute_sql(f'ALTER TABLE "lead" ADD COLUMN "do_not_contact" {boolean} NOT NULL DEFAULT FALSE')
    db.execute_sql(f'ALTER TABLE "lead" ADD COLUMN "erased_at" {timestamp}')
    db.execute_sql(f'ALTER TABLE "lead" ADD COLUMN "consent" {json}')
    db.execute_sql(f'ALTER TABLE "custom_field" ADD COLUMN "personal" {boolean} NOT NULL DEFAULT FALSE')
    db.execute_sql(f'UPDATE "custom_field" SET "personal" = TRUE WHERE "type" = \'text\'')
    db.execute_sql('ALTER TABLE "form" ADD COLUMN "notice" TEXT')
    db.execute_sql('ALTER TABLE "form" ADD COLUMN "notice_version" VARCHAR(64)')
    db.execute_sql(f'ALTER TABLE "form" ADD COLUMN "consent_required" {boolean} NOT NULL DEFAULT FALSE')

    migrator.migrate(migrator.drop_not_null('activity', 'summary'), migrator.drop_not_null('activity', 'data'),
                     migrator.drop_not_null('note', 'body'))

    class Workspace(Model):
        class Meta:
            database = db
            table_name = 'workspace'

    class Lead(Model):
        class Meta:
            database = db
            table_name = 'lead'

    class Form(Model):
        class Meta:
            database = db
            table_name = 'form'

    class Token(Model):
        class Meta:
            database = db
            table_name = 'token'

    class Consent(Model):
        workspace = ForeignKeyField(Workspace, on_delete='CASCADE', index=False)
        public_id = CharField(max_length=48, unique=True)
        lead = ForeignKeyField(Lead, on_delete='CASCADE', index=False)
        purpose = CharField(max_length=200, null=True)
        notice_version = CharField(max_length=64, null=True)
        form = ForeignKeyField(Form, null=True, index=False)
        token = ForeignKeyField(Token, null=True, index=False)
        given_at = DateTimeField(null=True)
        ip = CharField(max_length=64, null=True)
        withdrawn_at = DateTimeField(null=True)

        class Meta:
            database = db
            table_name = 'consent'
            indexes = ((('lead', 'id'), False),)
    db.create_tables([Consent])


def down(migrator, db):
    db.execute_sql('DROP TABLE IF EXISTS "consent"')
    migrator.migrate(
        migrator.drop_column('lead', 'do_not_contact'), migrator.drop_column('lead', 'erased_at'),
        migrator.drop_column('lead', 'consent'), migrator.drop_column('custom_field', 'personal'),
        migrator.drop_column('form', 'notice'), migrator.drop_column('form', 'notice_version'),
        migrator.drop_column('form', 'consent_required'))
