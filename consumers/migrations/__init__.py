"""Alembic environment of the read-side tables (driven by :func:`consumers.migrate_views`)."""
