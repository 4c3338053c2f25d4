"""timer: the clock's "do this at that time" (leadsvc/clock.py), one row per armed timer.

A timer is its kind and the integer id of the row it is about (unique together, so arming again
moves it), the time it was armed for (due_at) and the time a tick next takes it (fire_at: due_at,
or later after its handler failed). A tick reads only the fire_at index, so its cost follows what
is due. The workspace goes with its timers.
"""
from peewee import *


def up(migrator, db):
    class Workspace(Model):
        class Meta:
            database = db
            table_name = 'workspace'

    class Timer(Model):
        workspace = ForeignKeyField(Workspace, on_delete='CASCADE', index=False)
        kind = CharField(max_length=48)
        subject = IntegerField()
        due_at = DateTimeField()
        fire_at = DateTimeField(index=True)

        class Meta:
            database = db
            table_name = 'timer'
            indexes = ((('kind', 'subject'), True),)

    db.create_tables([Timer])


def down(migrator, db):
    db.execute_sql('DROP TABLE IF EXISTS "timer"')
