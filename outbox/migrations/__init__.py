"""Alembic environment of the write side's tables (driven by
:func:`agent_blackbox.outbox.migrate_write_side`)."""
