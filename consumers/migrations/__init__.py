"""Alembic environment of the read-side tables (driven by
:func:`agent_blackbox.consumers.migrate_views`)."""
