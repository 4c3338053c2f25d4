"""Indexes the reports read alone at a million leads: funnel, time in status, conversion, time to won."""
from peewee import *
from playhouse.migrate import make_index_name


def up(migrator, db):
    migrator.migrate(
        # funnel: distinct leads per status entered, per workspace
        migrator.add_index('transition', ('workspace_id', 'to_status_id', 'lead_id')),
        # velocity: time in each status, walked in order to each percentile's rank
        migrator.add_index('transition', ('workspace_id', 'from_status_id', 'seconds_in_from')),
        # conversion by status, source and owner; time from creation to won
        migrator.add_index('lead', ('workspace_id', 'status_id', 'source_id', 'owner_id', 'created_at',
                                    'status_changed_at')),
    )


def down(migrator, db):
    migrator.migrate(
        migrator.drop_index('lead', make_index_name('lead', ('workspace_id', 'status_id', 'source_id', 'owner_id', 'created_at', 'status_changed_at'))),
        migrator.drop_index('transition', 'transition_workspace_id_from_status_id_seconds_in_from'),
        migrator.drop_index('transition', 'transition_workspace_id_to_status_id_lead_id'),
    )
