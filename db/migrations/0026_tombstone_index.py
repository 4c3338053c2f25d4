"""An index of the tombstones (0024) by their survivor.

lead.merged_into_id references lead. Deleting a lead makes the database check that no tombstone
points at it, and without an index on the column that check reads the whole lead table for each
deleted row. The index holds only tombstones (the column is null for every other lead), so a
create writes nothing to it.
"""
from peewee import *

NAME = 'lead_merged_into_id'


def up(migrator, db):
    db.execute_sql(f'CREATE INDEX IF NOT EXISTS "{NAME}" ON "lead" ("merged_into_id") WHERE "merged_into_id" IS NOT NULL')


def down(migrator, db):
    db.execute_sql(f'DROP INDEX IF EXISTS "{NAME}"')
