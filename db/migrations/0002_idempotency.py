"""Idempotency keys: the recorded responses of POSTs that carried an Idempotency-Key."""
from peewee import *


def up(migrator, db):
    class IdempotencyKey(Model):
        scope = CharField(max_length=64)
        key = CharField(max_length=255)
        request_hash = CharField(max_length=64)
        status = SmallIntegerField()
        headers = JSONField(default=dict)
        body = BlobField()
        created_at = DateTimeField()
        expires_at = DateTimeField(index=True)
        class Meta:
            database = db
            table_name = 'idempotency_key'
            indexes = ((('scope', 'key'), True),)
    db.create_tables([IdempotencyKey])


def down(migrator, db):
    migrator.migrate(migrator.drop_table('idempotency_key'))
