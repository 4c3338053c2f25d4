"""The lead a recorded Idempotency-Key response belongs to.

idempotency_key.lead_public_id: the public id of the lead the request's path names (a note, an
activity, a move, a task of that lead), so that erasing the lead deletes every recorded response of
it, whether or not its body repeats the person's contact. A partial index: most keys name no lead.
A nullable column without a default, so neither database rewrites the table.
"""
from peewee import *

INDEX = ('CREATE INDEX "idempotency_key_lead" ON "idempotency_key" ("lead_public_id") '
         'WHERE "lead_public_id" IS NOT NULL')


def up(migrator, db):
    db.execute_sql('ALTER TABLE "idempotency_key" ADD COLUMN "lead_public_id" VARCHAR(48)')
    db.execute_sql(INDEX)


def down(migrator, db):
    db.execute_sql('DROP INDEX "idempotency_key_lead"')
    db.execute_sql('ALTER TABLE "idempotency_key" DROP COLUMN "lead_public_id"')
