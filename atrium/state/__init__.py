"""The shell's state behind one interface on two databases: SQLite (the embedded default) and
PostgreSQL (several shells), through SQLAlchemy Core and Alembic migrations.

Imported only by what needs a database: SQLAlchemy costs a CLI command that does not.
"""
