"""The initial schema: every table of the domain, as frozen copies of the models."""
from peewee import *


def up(migrator, db):
    class Workspace(Model):
        public_id = CharField(unique=True, max_length=48)
        name = CharField(unique=True, max_length=100)
        timezone = CharField(max_length=64, default='Asia/Kolkata')
        currency = CharField(max_length=3, default='INR')
        rotation_last_member_id = IntegerField(null=True)
        created_at = DateTimeField()
        class Meta:
            database = db
            table_name = 'workspace'
    db.create_tables([Workspace])

    class Source(Model):
        workspace = ForeignKeyField(Workspace, on_delete='CASCADE', index=False)
        public_id = CharField(unique=True, max_length=48)
        name = CharField(max_length=100)
        score = IntegerField(default=0)
        class Meta:
            database = db
            table_name = 'source'
            indexes = ((('workspace', 'name'), True),)
    db.create_tables([Source])

    class Status(Model):
        workspace = ForeignKeyField(Workspace, on_delete='CASCADE', index=False)
        public_id = CharField(unique=True, max_length=48)
        name = CharField(max_length=100)
        position = IntegerField()
        kind = CharField(max_length=8)
        allowed_next = JSONField(null=True)
        class Meta:
            database = db
            table_name = 'status'
            indexes = ((('workspace', 'name'), True), (('workspace', 'position'), False))
    db.create_tables([Status])

    class Team(Model):
        workspace = ForeignKeyField(Workspace, on_delete='CASCADE', index=False)
        public_id = CharField(unique=True, max_length=48)
        name = CharField(max_length=100)
        class Meta:
            database = db
            table_name = 'team'
            indexes = ((('workspace', 'name'), True),)
    db.create_tables([Team])

    class Member(Model):
        workspace = ForeignKeyField(Workspace, on_delete='CASCADE', index=False)
        public_id = CharField(unique=True, max_length=48)
        team = ForeignKeyField(Team, null=True)
        name = CharField(max_length=100)
        email = CharField(max_length=254)
        role = CharField(max_length=16)
        active = BooleanField(default=True)
        class Meta:
            database = db
            table_name = 'member'
            indexes = ((('workspace', 'email'), True),)
    db.create_tables([Member])

    class Lead(Model):
        workspace = ForeignKeyField(Workspace, on_delete='CASCADE', index=False)
        public_id = CharField(unique=True, max_length=48)
        first_name = CharField(max_length=100, default='')
        last_name = CharField(max_length=100, default='')
        phone = CharField(null=True, max_length=16)
        email = CharField(null=True, max_length=254)
        source = ForeignKeyField(Source, null=True)
        status = ForeignKeyField(Status)
        owner = ForeignKeyField(Member, null=True, index=False)
        team = ForeignKeyField(Team, null=True, index=False)
        estimated_value = DecimalField(null=True, max_digits=15, decimal_places=2)
        custom_fields = JSONField(default=dict)
        score = SmallIntegerField(default=0)
        score_reasons = JSONField(default=list)
        engagement = IntegerField(default=0)
        version = IntegerField(default=1)
        created_at = DateTimeField()
        updated_at = DateTimeField()
        status_changed_at = DateTimeField()
        last_activity_at = DateTimeField(null=True)
        activity_sort_at = DateTimeField()
        class Meta:
            database = db
            table_name = 'lead'
            indexes = ((('workspace', 'phone'), True), (('workspace', 'email'), True), (('workspace', 'created_at', 'public_id'), False), (('workspace', 'score', 'public_id'), False), (('workspace', 'activity_sort_at', 'public_id'), False), (('team', 'created_at', 'public_id'), False), (('team', 'score', 'public_id'), False), (('team', 'activity_sort_at', 'public_id'), False), (('owner', 'created_at', 'public_id'), False), (('owner', 'score', 'public_id'), False), (('owner', 'activity_sort_at', 'public_id'), False))
    db.create_tables([Lead])

    class Token(Model):
        workspace = ForeignKeyField(Workspace, on_delete='CASCADE')
        member = ForeignKeyField(Member, on_delete='CASCADE')
        public_id = CharField(unique=True, max_length=48)
        name = CharField(max_length=100)
        abilities = JSONField(default=list)
        secret_hash = CharField(unique=True, max_length=64)
        created_at = DateTimeField()
        last_used_at = DateTimeField(null=True)
        expires_at = DateTimeField(null=True)
        revoked_at = DateTimeField(null=True)
        class Meta:
            database = db
            table_name = 'token'
    db.create_tables([Token])

    class Form(Model):
        workspace = ForeignKeyField(Workspace, on_delete='CASCADE', index=False)
        public_id = CharField(unique=True, max_length=48)
        name = CharField(max_length=100)
        source = ForeignKeyField(Source, null=True)
        allowed_origins = JSONField(default=list)
        class Meta:
            database = db
            table_name = 'form'
            indexes = ((('workspace', 'name'), True),)
    db.create_tables([Form])

    class Activity(Model):
        actor_token = ForeignKeyField(Token, field=Token.id, null=True)
        actor_member = ForeignKeyField(Member, field=Member.id, null=True)
        actor_form = ForeignKeyField(Form, field=Form.id, null=True)
        workspace = ForeignKeyField(Workspace, on_delete='CASCADE', index=False)
        public_id = CharField(unique=True, max_length=48)
        lead = ForeignKeyField(Lead, on_delete='CASCADE', index=False)
        kind = CharField(max_length=24)
        summary = TextField(default='')
        data = JSONField(default=dict)
        occurred_at = DateTimeField()
        created_at = DateTimeField()
        class Meta:
            database = db
            table_name = 'activity'
            indexes = ((('lead', 'created_at', 'public_id'), False),)
    db.create_tables([Activity])

    class AuditEntry(Model):
        actor_token = ForeignKeyField(Token, field=Token.id, null=True)
        actor_member = ForeignKeyField(Member, field=Member.id, null=True)
        actor_form = ForeignKeyField(Form, field=Form.id, null=True)
        workspace = ForeignKeyField(Workspace, on_delete='CASCADE', index=False)
        public_id = CharField(unique=True, max_length=48)
        lead = ForeignKeyField(Lead, null=True, on_delete='CASCADE', index=False)
        action = CharField(max_length=32)
        changes = JSONField(default=dict)
        request_id = CharField(null=True, max_length=128)
        at = DateTimeField()
        class Meta:
            database = db
            table_name = 'audit_entry'
            indexes = ((('lead', 'at', 'public_id'), False),)
    db.create_tables([AuditEntry])

    class CustomField(Model):
        workspace = ForeignKeyField(Workspace, on_delete='CASCADE', index=False)
        public_id = CharField(unique=True, max_length=48)
        name = CharField(max_length=64)
        label = CharField(max_length=100)
        type = CharField(max_length=8)
        options = JSONField(null=True)
        score = JSONField(null=True)
        position = IntegerField(default=0)
        class Meta:
            database = db
            table_name = 'custom_field'
            indexes = ((('workspace', 'name'), True),)
    db.create_tables([CustomField])

    class Note(Model):
        actor_token = ForeignKeyField(Token, field=Token.id, null=True)
        actor_member = ForeignKeyField(Member, field=Member.id, null=True)
        actor_form = ForeignKeyField(Form, field=Form.id, null=True)
        workspace = ForeignKeyField(Workspace, on_delete='CASCADE', index=False)
        public_id = CharField(unique=True, max_length=48)
        lead = ForeignKeyField(Lead, on_delete='CASCADE', index=False)
        body = TextField()
        created_at = DateTimeField()
        class Meta:
            database = db
            table_name = 'note'
            indexes = ((('lead', 'created_at', 'public_id'), False),)
    db.create_tables([Note])

    class Rule(Model):
        workspace = ForeignKeyField(Workspace, on_delete='CASCADE', index=False)
        public_id = CharField(unique=True, max_length=48)
        name = CharField(max_length=100)
        position = IntegerField()
        conditions = JSONField(default=dict)
        strategy = CharField(max_length=16)
        team = ForeignKeyField(Team, null=True)
        member = ForeignKeyField(Member, null=True)
        rotation_last_member_id = IntegerField(null=True)
        class Meta:
            database = db
            table_name = 'rule'
            indexes = ((('workspace', 'name'), True), (('workspace', 'position'), False))
    db.create_tables([Rule])

    class Transition(Model):
        actor_token = ForeignKeyField(Token, field=Token.id, null=True)
        actor_member = ForeignKeyField(Member, field=Member.id, null=True)
        actor_form = ForeignKeyField(Form, field=Form.id, null=True)
        workspace = ForeignKeyField(Workspace, on_delete='CASCADE', index=False)
        public_id = CharField(unique=True, max_length=48)
        lead = ForeignKeyField(Lead, on_delete='CASCADE', index=False)
        from_status = ForeignKeyField(Status, null=True)
        to_status = ForeignKeyField(Status)
        note = TextField(null=True)
        at = DateTimeField()
        seconds_in_from = IntegerField(null=True)
        class Meta:
            database = db
            table_name = 'transition'
            indexes = ((('lead', 'at', 'public_id'), False),)
    db.create_tables([Transition])


def down(migrator, db):
    migrator.migrate(migrator.drop_table('transition'))
    migrator.migrate(migrator.drop_table('rule'))
    migrator.migrate(migrator.drop_table('note'))
    migrator.migrate(migrator.drop_table('custom_field'))
    migrator.migrate(migrator.drop_table('audit_entry'))
    migrator.migrate(migrator.drop_table('activity'))
    migrator.migrate(migrator.drop_table('form'))
    migrator.migrate(migrator.drop_table('token'))
    migrator.migrate(migrator.drop_table('lead'))
    migrator.migrate(migrator.drop_table('member'))
    migrator.migrate(migrator.drop_table('team'))
    migrator.migrate(migrator.drop_table('status'))
    migrator.migrate(migrator.drop_table('source'))
    migrator.migrate(migrator.drop_table('workspace'))
