"""The outbox relay: publishes committed events to Kafka in order, then deletes them.

Only the relay process imports this package; an agent's import of
:mod:`agent_blackbox.outbox` never loads it (nor Kafka's client or the metrics library).

Typical use, with the settings the process read once::

    engine = SERVICE_POOL.engine(settings.database_url)  # from agent_blackbox.wiring
    relay = Relay(engine, settings=settings)
    relay.run(stop_event)  # until stop_event is set
"""

from agent_blackbox.outbox.relay._metrics import RelayMetrics
from agent_blackbox.outbox.relay._publisher import EVENT_ID_HEADER
from agent_blackbox.outbox.relay._relay import Relay, RelayOptions

__all__ = ["EVENT_ID_HEADER", "Relay", "RelayMetrics", "RelayOptions"]
