"""Distribution rules join the cached reference tables.

Every create reads its workspace's rules; like statuses and sources they change rarely, so a
change of a rule now bumps workspace.refs_version (migration 0004) and processes cache them. The
rotation a rule keeps (rotation_last_member_id) changes with every lead it routes and is read
afresh under the rule's row lock, so writing it bumps nothing.
"""
from peewee import *

# Every column of rule but its rotation state.
RULE_COLUMNS = 'workspace_id, public_id, name, position, conditions, strategy, team_id, member_id'
BUMP = 'UPDATE "workspace" SET "refs_version" = "refs_version" + 1 WHERE "id" = '


def up(migrator, db):
    if isinstance(db, PostgresqlDatabase):
        # bump_refs_version() is 0004's: it bumps the old and the new workspace of the row.
        db.execute_sql('CREATE TRIGGER "rule_refs_version" AFTER INSERT OR DELETE OR UPDATE OF '
                       f'{RULE_COLUMNS} ON "rule" FOR EACH ROW EXECUTE FUNCTION bump_refs_version()')
        return
    db.execute_sql(f'CREATE TRIGGER "rule_refs_version_insert" AFTER INSERT ON "rule" BEGIN {BUMP}NEW.workspace_id; END')
    db.execute_sql(f'CREATE TRIGGER "rule_refs_version_update" AFTER UPDATE OF {RULE_COLUMNS} ON "rule" '
                   'BEGIN UPDATE "workspace" SET "refs_version" = "refs_version" + 1 '
                   'WHERE "id" IN (OLD.workspace_id, NEW.workspace_id); END')
    db.execute_sql(f'CREATE TRIGGER "rule_refs_version_delete" AFTER DELETE ON "rule" BEGIN {BUMP}OLD.workspace_id; END')


def down(migrator, db):
    if isinstance(db, PostgresqlDatabase):
        db.execute_sql('DROP TRIGGER IF EXISTS "rule_refs_version" ON "rule"')
        return
    for event in ('insert', 'update', 'delete'):
        db.execute_sql(f'DROP TRIGGER IF EXISTS "rule_refs_version_{event}"')
