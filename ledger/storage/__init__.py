"""Storage: SQLAlchemy models, the database factory, and the ledger's repository.

The only place in the core that touches a database. SQLAlchemy and psycopg errors are
translated to :class:`ledger.errors.StorageError` here.
"""
