"""Search (`q`): the data each kind of search is matched against, and its backfill.

- lead.phone_reversed, the phone's digits back to front, indexed after the workspace (only the
  leads with a phone): a phone suffix is a prefix range there;
- lead_name_part, each lead's names and their parts folded, indexed (workspace, part, lead): a
  name word is a prefix range there; and (lead, part): a lead's parts, probed while a list walks
  its sort index for a common word.

An e-mail search needs nothing new: the unique (workspace, email) index serves its prefix range.
The backfill derives both from the names and phones with the service's own rules (leadsvc.search),
so that migrated rows match exactly as new ones do.
"""
from peewee import *

from leadsvc.search import name_parts, phone_reversed

BATCH = 5000


def up(migrator, db):
    db.execute_sql('ALTER TABLE "lead" ADD COLUMN "phone_reversed" VARCHAR(16)')

    class Workspace(Model):
        class Meta:
            database = db
            table_name = 'workspace'

    class Lead(Model):
        workspace = ForeignKeyField(Workspace)
        first_name = CharField()
        last_name = CharField()
        phone = CharField(null=True)
        phone_reversed = CharField(null=True)
        class Meta:
            database = db
            table_name = 'lead'

    class LeadNamePart(Model):
        lead = ForeignKeyField(Lead, on_delete='CASCADE', index=False)
        workspace = ForeignKeyField(Workspace, on_delete='CASCADE', index=False)
        part = CharField(max_length=100)
        class Meta:
            database = db
            table_name = 'lead_name_part'
            indexes = ((('workspace', 'part', 'lead'), False), (('lead', 'part'), False))
    db.create_tables([LeadNamePart])

    last = 0
    while True:
        rows = list(Lead.select(Lead.id, Lead.workspace, Lead.first_name, Lead.last_name, Lead.phone)
                    .where(Lead.id > last).order_by(Lead.id).limit(BATCH).tuples())
        if not rows:
            break
        last = rows[-1][0]
        for i in range(0, len(rows), 500):
            phones = [(lead_id, phone_reversed(phone)) for lead_id, _, _, _, phone in rows[i:i + 500] if phone]
            if phones:
                Lead.update(phone_reversed=Case(Lead.id, phones)).where(
                    Lead.id.in_([lead_id for lead_id, _ in phones])).execute()
        parts = [{'lead': lead_id, 'workspace': ws, 'part': part} for lead_id, ws, first, last_name, _ in rows
                 for part in sorted(name_parts(first, last_name))]
        for i in range(0, len(parts), 500):
            LeadNamePart.insert_many(parts[i:i + 500]).execute()

    db.execute_sql('CREATE INDEX "lead_workspace_id_phone_reversed" ON "lead" ("workspace_id", "phone_reversed") '
                   'WHERE "phone_reversed" IS NOT NULL')


def down(migrator, db):
    db.execute_sql('DROP INDEX IF EXISTS "lead_workspace_id_phone_reversed"')
    db.execute_sql('DROP TABLE IF EXISTS "lead_name_part"')
    db.execute_sql('ALTER TABLE "lead" DROP COLUMN "phone_reversed"')
