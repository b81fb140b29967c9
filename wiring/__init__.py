"""How the processes are put together: one pool policy, and every database engine built
with it.

Each kind of process gets a named :class:`Pool`; nothing else in the project calls
SQLAlchemy's ``create_engine``. The ``blackbox`` command's composition root
(``agent_blackbox.cli``) reads the settings once per invocation and hands them, and the
engines made here, down to the parts; the parts take both as arguments.

A leaf beside :mod:`agent_blackbox.schemas`: it imports no other part, and loads no Kafka
client, migration tool or metrics library, so the write side can build its recorder's
engine here too.
"""

from agent_blackbox.wiring._pools import (
    AGENT_POOL,
    COMMAND_POOL,
    MIGRATION_POOL,
    POOLS,
    SERVICE_POOL,
    Pool,
)

__all__ = [
    "AGENT_POOL",
    "COMMAND_POOL",
    "MIGRATION_POOL",
    "POOLS",
    "SERVICE_POOL",
    "Pool",
]
