"""lead.name_key: the lead's name parts on its own row, each after U+001F (leadsvc.search).

A page that walks the list's sort index for a common name word checks the word there, on the row
it reads anyway, instead of looking up the lead's rows of lead_name_part one lead at a time. The
backfill joins those rows, which hold the same parts; inside a part U+001F becomes U+001E, as the
service writes keys.
"""
from peewee import *


def up(migrator, db):
    db.execute_sql('ALTER TABLE "lead" ADD COLUMN "name_key" TEXT')
    if isinstance(db, PostgresqlDatabase):
        db.execute_sql(
            'UPDATE "lead" SET "name_key" = "parts"."key" FROM ('
            ' SELECT "lead_id", string_agg(chr(31) || replace("part", chr(31), chr(30)), \'\' ORDER BY "part") AS "key"'
            ' FROM "lead_name_part" GROUP BY "lead_id") AS "parts" WHERE "parts"."lead_id" = "lead"."id"')
    else:
        db.execute_sql(
            'UPDATE "lead" SET "name_key" = (SELECT group_concat(char(31) || replace("part", char(31), char(30)), \'\')'
            ' FROM "lead_name_part" WHERE "lead_name_part"."lead_id" = "lead"."id")')


def down(migrator, db):
    migrator.migrate(migrator.drop_column('lead', 'name_key'))
