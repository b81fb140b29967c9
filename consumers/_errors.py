"""The exceptions of the read side, each naming what went wrong and what to do."""

from __future__ import annotations

from agent_blackbox.broker import KafkaUnavailable as KafkaUnavailable
from agent_blackbox.schemas import BlackboxError


class ConsumerError(BlackboxError):
    """Root of the errors the consumers raise."""


class ViewsNotMigrated(ConsumerError):
    """The ``blackbox_views`` tables are missing or older than this code."""

    def __init__(self, detail: str) -> None:
        super().__init__(
            f"the view tables are not usable ({detail}); run `blackbox consume` once or "
            "call agent_blackbox.consumers.migrate_views(database_url) before starting a consumer"
        )


class MigrationFailed(ConsumerError):
    """Creating or upgrading the view tables failed."""


class ViewStoreUnavailable(ConsumerError):
    """The view database could not be reached or dropped the connection mid-batch.

    Nothing was committed and the consumer rewinds to its stored offsets; it is safe
    to call again once the database is back.
    """


class ProjectionFailed(ConsumerError):
    """A projection raised something other than a lost connection while applying a batch."""


class DeadLetterFailed(ConsumerError):
    """A poison message could not be written to the dead-letter topic.

    Its offset was not committed; the consumer rewinds and tries again.
    """


class MemberFenced(KafkaUnavailable):
    """Kafka fenced this consumer's static membership (``group.instance.id``): its client
    is unusable. After a coordinator failover the group's new coordinator can fence a
    member that is alone with its id; the runtime then joins again with a new client.
    Fenced again and again, another consumer runs with the same id."""
