"""The write side an agent imports: the Recorder SDK, the record/replay boundary contract,
redaction, and the write side's tables and migrations.

The public names are listed in ``__init__.pyi``; each is loaded from its module on first
use, so ``import agent_blackbox.outbox`` costs next to nothing and an agent carries only
what it touches. Nothing here loads a Kafka client, alembic (until a migration runs),
prometheus-client or rich: the relay (:mod:`agent_blackbox.outbox.relay`) and the LLM SDK
captures (:mod:`agent_blackbox.outbox.integrations`) are subpackages of their own.
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
