"""Alembic environment of the write side's tables (driven by
:func:`agent_blackbox.outbox.storage.migrate_write_side`)."""
