"""On PostgreSQL, the columns a search reads as prefix ranges compare byte by byte (COLLATE "C"),
whatever collation the database was created with.

A search is `column >= p AND column < p || U+10FFFF` (leadsvc.search): exactly the values that
start with p under byte-wise ordering, which SQLite's BINARY and the C collation use. Under a
language's collation (a database created with en_US.UTF-8, as many clusters and images are)
the range is not the prefix. The columns: lead.email, lead.phone_reversed, lead_name_part.part.
Equality (the duplicate lookup's e-mail) is the same under both. Only their indexes are rebuilt;
the new type drops the columns' statistics, and without them the planner walks the whole sort
index for a search, so they are gathered again here.
"""
from peewee import *

COLUMNS = (('lead', 'email', 'VARCHAR(254)'), ('lead', 'phone_reversed', 'VARCHAR(16)'),
           ('lead_name_part', 'part', 'VARCHAR(100)'))


def up(migrator, db):
    if isinstance(db, PostgresqlDatabase):
        for table, column, kind in COLUMNS:
            db.execute_sql(f'ALTER TABLE "{table}" ALTER COLUMN "{column}" TYPE {kind} COLLATE "C"')
            db.execute_sql(f'ANALYZE "{table}" ("{column}")')


def down(migrator, db):
    if isinstance(db, PostgresqlDatabase):
        for table, column, kind in COLUMNS:
            db.execute_sql(f'ALTER TABLE "{table}" ALTER COLUMN "{column}" TYPE {kind} COLLATE "default"')
            db.execute_sql(f'ANALYZE "{table}" ("{column}")')
