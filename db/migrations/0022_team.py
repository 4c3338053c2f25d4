"""The team (DESIGN section 20): availability, capacity, and tokens listed by API.

- member.availability (available, away, on_leave; a DDL default, so SQLite adds it without
  rebuilding the table), member.until, member.max_open_leads, member.daily_leads. A member row
  change already bumps workspace.refs_version (0004), so routing reads them from the cached
  reference data.
- open_lead_count.routed_on and routed_today: the leads routing gave the member on its
  workspace's day routed_on, on the row that holds its open-lead count, so one conditional upsert
  checks both caps and counts the lead, under the row lock the create's trigger takes anyway.
- 0004's recount (after a status changes kind) kept only members with open leads and forgot the
  rest of the row; it now sets the counts in place and keeps the day's routed count.
- token: the list's keyset indexes, (workspace, created_at, public_id) and (member, created_at,
  public_id), which replace the single-column ones they start with.
"""
from peewee import *

RECOUNT = ('UPDATE open_lead_count SET open_leads = 0 WHERE member_id IN (SELECT id FROM member WHERE workspace_id = {0}); '
           'INSERT INTO open_lead_count (member_id, open_leads) '
           'SELECT l.owner_id, COUNT(*) FROM lead l JOIN status s ON s.id = l.status_id '
           "WHERE l.workspace_id = {0} AND l.owner_id IS NOT NULL AND s.kind = 'open' GROUP BY l.owner_id "
           'ON CONFLICT (member_id) DO UPDATE SET open_leads = excluded.open_leads')
OLD_RECOUNT = ('DELETE FROM open_lead_count WHERE member_id IN (SELECT id FROM member WHERE workspace_id = {0}); '
               'INSERT INTO open_lead_count (member_id, open_leads) '
               'SELECT l.owner_id, COUNT(*) FROM lead l JOIN status s ON s.id = l.status_id '
               "WHERE l.workspace_id = {0} AND l.owner_id IS NOT NULL AND s.kind = 'open' GROUP BY l.owner_id")
TOKEN_INDEXES = (('workspace_id', 'created_at', 'public_id'), ('member_id', 'created_at', 'public_id'))


def _recount_trigger(db, recount):
    if isinstance(db, PostgresqlDatabase):
        db.execute_sql(
            'CREATE OR REPLACE FUNCTION recount_open_leads() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN '
            f"{recount.format('NEW.workspace_id')}; RETURN NULL; END $$")
        return
    # SQLite takes an upsert after INSERT ... SELECT only when the SELECT has a WHERE (else ON
    # could be a join's); the recount has one.
    db.execute_sql('DROP TRIGGER IF EXISTS "status_open_count"')
    db.execute_sql('CREATE TRIGGER "status_open_count" AFTER UPDATE OF kind ON "status" '
                   "WHEN (OLD.kind = 'open') IS NOT (NEW.kind = 'open') "
                   f'BEGIN {recount.format("NEW.workspace_id")}; END')


def up(migrator, db):
    timestamp = 'TIMESTAMP' if isinstance(db, PostgresqlDatabase) else 'DATETIME'
    db.execute_sql('ALTER TABLE "member" ADD COLUMN "availability" VARCHAR(16) NOT NULL DEFAULT \'available\'')
    db.execute_sql(f'ALTER TABLE "member" ADD COLUMN "until" {timestamp}')
    db.execute_sql('ALTER TABLE "member" ADD COLUMN "max_open_leads" INTEGER')
    db.execute_sql('ALTER TABLE "member" ADD COLUMN "daily_leads" INTEGER')
    db.execute_sql('ALTER TABLE "open_lead_count" ADD COLUMN "routed_on" DATE')
    db.execute_sql('ALTER TABLE "open_lead_count" ADD COLUMN "routed_today" INTEGER NOT NULL DEFAULT 0')
    _recount_trigger(db, RECOUNT)
    for columns in TOKEN_INDEXES:
        quoted = ', '.join(f'"{column}"' for column in columns)
        db.execute_sql(f'CREATE INDEX "token_{"_".join(columns)}" ON "token" ({quoted})')
    db.execute_sql('DROP INDEX IF EXISTS "token_workspace_id"')
    db.execute_sql('DROP INDEX IF EXISTS "token_member_id"')


def down(migrator, db):
    db.execute_sql('CREATE INDEX IF NOT EXISTS "token_workspace_id" ON "token" ("workspace_id")')
    db.execute_sql('CREATE INDEX IF NOT EXISTS "token_member_id" ON "token" ("member_id")')
    for columns in TOKEN_INDEXES:
        db.execute_sql(f'DROP INDEX IF EXISTS "token_{"_".join(columns)}"')
    _recount_trigger(db, OLD_RECOUNT)
    migrator.migrate(*[migrator.drop_column('member', column)
                       for column in ('availability', 'until', 'max_open_leads', 'daily_leads')],
                     migrator.drop_column('open_lead_count', 'routed_on'),
                     migrator.drop_column('open_lead_count', 'routed_today'))
