"""The read side: a consumer runtime with offsets in the database, and the first views.

Typical use, with the settings the process read once::

    migrate_views(settings.database_url)
    with ViewConsumer(settings) as consumer:
        consumer.run(stop=stop_event)

Other consumers (analytics, retention) reuse :class:`ConsumerRuntime` with their own
:data:`Projection`: a function ``(connection, records) -> BatchOutcome`` that writes
through the caller's connection and never commits.

The public names are listed in ``__init__.pyi``; each is loaded from its module on first
use, so a command that reads the run index does not load the analytics, retention or
signing consumers.
"""

import lazy_loader

# The names are listed in __init__.pyi (lazy_loader reads it); each loads on first use.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
