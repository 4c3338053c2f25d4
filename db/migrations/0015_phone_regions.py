"""workspace.phone_regions: the regions whose mobiles a workspace's leads may have (setup's
[workspace] phone_regions), comma-separated; every existing workspace keeps India alone."""
from peewee import *


def up(migrator, db):
    db.execute_sql('ALTER TABLE "workspace" ADD COLUMN "phone_regions" VARCHAR(1000) NOT NULL DEFAULT \'IN\'')


def down(migrator, db):
    migrator.migrate(migrator.drop_column('workspace', 'phone_regions'))
