"""Full-text search over LLM messages, for the tenants that opt in.

The text indexer is a consumer of its own: for each ``llm.call`` of an opted-in tenant
it opens the body (as recorded, so already redacted by the run's rules; a sealed run's
data key unwrapped through the audited key functions, for the purpose
:data:`INDEX_PURPOSE`), takes the words of the messages the call added and of the
answer, and stores them as a ``tsvector`` in ``message_text``: the words, never the
text. Other tenants' bodies are never opened.

A request stored as a reference to an earlier one of its run holds only what it added,
and only that is indexed: each turn of a conversation once, however many requests
repeat it.

A confirmed ``run.redacted`` (as the views consumer confirms it) deletes its run's
rows; so does :meth:`RetentionJob.forget` at once, and opting out deletes the tenant's.
A run whose keys are gone cannot be opened, so a lagging indexer cannot bring its words
back.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry
from sqlalchemy import Connection, Engine, text

from agent_blackbox.consumers._batch import BatchOutcome, Delivered
from agent_blackbox.consumers._redacted_views import RedactionCheck, forget_words_txn
from agent_blackbox.consumers._runtime import ConsumerRuntime
from agent_blackbox.consumers._search import TEXT_SEARCH_CONFIG
from agent_blackbox.consumers._tables import message_text, run_rollups, text_search_tenants
from agent_blackbox.consumers._views import views_screen
from agent_blackbox.keystore import AesGcmSealer, AuditedKeys, LocalKeyProvider
from agent_blackbox.schemas import (
    BlackboxError,
    CheckpointVerifier,
    Envelope,
    EventType,
    PayloadPipeline,
    Settings,
    llm_reply,
)

log = logging.getLogger(__name__)

TEXT_INDEX_GROUP = "blackbox-text-index"
"""The text indexer's consumer group unless another is given."""
INDEX_PURPOSE = "full-text index of LLM messages for tenants that opted in"
"""What the access audit records for every run whose key the indexer unwraps."""
MAX_INDEXED_CHARS = 100_000
"""The text of one call that is indexed at most (a tsvector holds under 1 MB)."""
_TEXT_KEYS = frozenset({"content", "text", "system", "instructions", "input", "prompt"})
_TEXT_KEYS |= {"arguments", "output"}
_SKIPPED = frozenset({"tools", "functions", "response_format", "tool_choice", "metadata"})


# --- opting in and out ----------------------------------------------------------------


def enable_text_search_txn(conn: Connection, tenant_id: str) -> bool:
    """Opt ``tenant_id`` in: the indexer indexes its LLM calls from now on (those it
    reads from here on; earlier ones by rebuilding the group). False when it was in."""
    _check_tenant(tenant_id)
    inserted = conn.execute(
        text(
            "INSERT INTO blackbox_views.text_search_tenants (tenant_id) VALUES (:t) "
            "ON CONFLICT DO NOTHING"
        ),
        {"t": tenant_id},
    )
    return inserted.rowcount == 1


def disable_text_search_txn(conn: Connection, tenant_id: str) -> tuple[bool, int]:
    """Opt ``tenant_id`` out and delete its words from the index: whether it was in,
    and how many calls' words were deleted."""
    _check_tenant(tenant_id)
    was_in = conn.execute(
        text_search_tenants.delete().where(text_search_tenants.c.tenant_id == tenant_id)
    ).rowcount
    dropped = conn.execute(message_text.delete().where(message_text.c.tenant_id == tenant_id))
    conn.execute(
        run_rollups.update()
        .where(run_rollups.c.tenant_id == tenant_id, run_rollups.c.words.is_not(None))
        .values(words=None)
    )
    return was_in == 1, int(dropped.rowcount)


@dataclass(frozen=True, slots=True)
class TextSearchTenant:
    tenant_id: str
    enabled_at: datetime
    enabled_by: str
    indexed_calls: int


def text_search_tenants_txn(conn: Connection) -> list[TextSearchTenant]:
    """The tenants that opted in (those the caller's role may see), with how many of
    their calls are indexed."""
    rows = conn.execute(
        text(
            "SELECT s.tenant_id, s.enabled_at, s.enabled_by, "
            "(SELECT count(*) FROM blackbox_views.message_text m WHERE m.tenant_id = s.tenant_id) "
            "FROM blackbox_views.text_search_tenants s ORDER BY s.tenant_id"
        )
    )
    return [TextSearchTenant(str(t), at, str(by), int(n)) for t, at, by, n in rows]


def searchable_tenants_txn(conn: Connection) -> list[str]:
    """The ids of the tenants that opted in (those the caller's role may see)."""
    rows = conn.execute(text_search_tenants.select().order_by(text_search_tenants.c.tenant_id))
    return [str(row.tenant_id) for row in rows]


def _check_tenant(tenant_id: str) -> None:
    if not tenant_id or len(tenant_id) > 200 or not tenant_id.isprintable() or tenant_id == "*":
        raise ValueError(f"{tenant_id!r} is not a tenant id (1 to 200 printable characters)")


# --- what is indexed ------------------------------------------------------------------


def message_text_of(body: Mapping[str, Any]) -> str:
    """The text an ``llm.call`` body (as stored) adds to its conversation: the texts of
    the request's messages (system, instructions, contents, tool call arguments and
    results; not tool definitions) and of the answer, one per line, at most
    :data:`MAX_INDEXED_CHARS` characters."""
    parts: list[str] = []
    raw = body.get("raw_request_json")
    if isinstance(raw, str):
        with contextlib.suppress(ValueError):  # not JSON: nothing of it is indexed
            parts.extend(_texts(json.loads(raw), under_text=False))
    try:
        reply = llm_reply(dict(body))
    except (ValueError, TypeError, KeyError):
        reply = None
    if reply is not None:
        parts.extend(str(c["content"]) for c in reply.choices if c.get("content"))
        parts.extend(str(t["arguments_raw"]) for t in reply.tool_calls if t.get("arguments_raw"))
    joined = "\n".join(p for p in parts if p).replace("\x00", " ")
    return joined[:MAX_INDEXED_CHARS]


def _texts(value: Any, *, under_text: bool) -> Iterator[str]:
    """The strings of ``value`` held under a text key (a part's ``text``, a message's
    ``content``...), not its roles, types and ids: each object asks anew."""
    if isinstance(value, str):
        if under_text:
            yield value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if key not in _SKIPPED:
                yield from _texts(item, under_text=key in _TEXT_KEYS)
    elif isinstance(value, list):
        for item in value:
            yield from _texts(item, under_text=under_text)


# --- the indexer ----------------------------------------------------------------------


_INDEX = text(
    f"""
    WITH incoming AS (
        SELECT * FROM unnest(CAST(:run_ids AS text[]), CAST(:sequences AS bigint[]),
                             CAST(:tenants AS text[]), CAST(:agents AS text[]),
                             CAST(:ats AS timestamptz[]), CAST(:texts AS text[]))
               AS u(run_id, sequence, tenant_id, agent_id, recorded_at, text)
    ), inserted AS (
        INSERT INTO blackbox_views.message_text (run_id, sequence, tenant_id, recorded_at, words)
        SELECT run_id, sequence, tenant_id, recorded_at, to_tsvector('{TEXT_SEARCH_CONFIG}', text)
          FROM incoming ORDER BY run_id, sequence
        ON CONFLICT DO NOTHING
        RETURNING run_id, sequence
    ), per_run AS (
        SELECT i.run_id, min(i.tenant_id) AS tenant_id, min(i.agent_id) AS agent_id,
               strip(to_tsvector('{TEXT_SEARCH_CONFIG}',
                                 left(string_agg(i.text, E'\n' ORDER BY i.sequence),
                                      :per_run))) AS words
          FROM incoming i JOIN inserted n USING (run_id, sequence)
         GROUP BY i.run_id
    )
    INSERT INTO blackbox_views.run_rollups (run_id, tenant_id, agent_id, words)
    SELECT run_id, tenant_id, agent_id, words FROM per_run ORDER BY run_id
    ON CONFLICT (run_id) DO UPDATE SET words = CASE
        WHEN run_rollups.words IS NULL THEN excluded.words
        WHEN length(run_rollups.words) < :most_words
             AND pg_column_size(run_rollups.words) < :most_bytes
        THEN strip(run_rollups.words || excluded.words)
        ELSE run_rollups.words END
    RETURNING (SELECT count(*) FROM inserted)
    """
)
"""Each new call's words into ``message_text`` (a redelivered call is skipped), and the
words of a batch's new calls of each run added, without positions, to its rollup."""
MOST_RUN_WORDS = 20_000
"""A run's rollup takes no more words once it holds this many distinct ones (or
:data:`MOST_RUN_BYTES`): a tsvector holds at most 1 MB, and a batch adds at most
:data:`MOST_BATCH_CHARS` characters' worth."""
MOST_RUN_BYTES = 300_000
MOST_BATCH_CHARS = 50_000


class TextIndexer:
    """The projection of the text index: ``(connection, records) -> BatchOutcome``.

    Args:
        pipeline: opens bodies (with the key store's audited keys for sealed runs).
        redactions: confirms ``run.redacted`` notes, as for the views consumer.
    """

    def __init__(self, pipeline: PayloadPipeline, redactions: RedactionCheck) -> None:
        self._pipeline = pipeline
        self._redactions = redactions
        self.unreadable = 0
        """Calls of opted-in tenants whose body could not be opened (a destroyed key,
        a body stored out of line, a sealed body and no key-encryption key)."""

    def __call__(self, conn: Connection, records: Sequence[Delivered]) -> BatchOutcome:
        opted = {str(t) for t in conn.execute(text_search_tenants.select()).scalars()}
        rows: list[dict[str, Any]] = []
        redacted: list[Envelope] = []
        for record in records:
            envelope = record.envelope
            if envelope.event_type == EventType.RUN_REDACTED:
                redacted.append(envelope)
            elif envelope.event_type == EventType.LLM_CALL and envelope.tenant_id in opted:
                row = self._row(envelope)
                if row is not None:
                    rows.append(row)
        inserted = _index(conn, rows)
        if redacted:
            refused = self._redactions.unconfirmed(conn, redacted)
            gone = sorted({e.run_id for e in redacted if e.event_id not in refused})
            forget_words_txn(conn, gone)
        return BatchOutcome(
            inserted=inserted,
            duplicates=len(rows) - inserted,
            passed_over=len(records) - len(rows),
        )

    def _row(self, envelope: Envelope) -> dict[str, Any] | None:
        try:
            body = self._pipeline.unpack_as_stored(envelope)
        except BlackboxError as exc:
            self.unreadable += 1
            log.info(
                "text index: run %s sequence %d not indexed: %s",
                envelope.run_id,
                envelope.sequence,
                type(exc).__name__,
            )
            return None
        words = message_text_of(body)
        if not words:
            return None
        return {
            "run_id": envelope.run_id,
            "sequence": envelope.sequence,
            "tenant_id": envelope.tenant_id,
            "agent_id": envelope.agent_id,
            "recorded_at": envelope.recorded_at,
            "text": words,
        }


def _index(conn: Connection, rows: list[dict[str, Any]]) -> int:
    """Index ``rows`` (see :data:`_INDEX`); how many were new."""
    if not rows:
        return 0
    params = {
        "run_ids": [r["run_id"] for r in rows],
        "sequences": [r["sequence"] for r in rows],
        "tenants": [r["tenant_id"] for r in rows],
        "agents": [r["agent_id"] for r in rows],
        "ats": [r["recorded_at"] for r in rows],
        "texts": [r["text"] for r in rows],
        "per_run": MOST_BATCH_CHARS,
        "most_words": MOST_RUN_WORDS,
        "most_bytes": MOST_RUN_BYTES,
    }
    counted = conn.execute(_INDEX, params).scalars().first()
    if counted is None:  # no new call: nothing reached the rollups
        return 0
    return int(counted)


def index_pipeline(engine: Engine) -> PayloadPipeline:
    """How the indexer opens bodies: with the key-encryption keys of ``BLACKBOX_KEK_FILE``
    / ``BLACKBOX_KEK`` when set (every unwrap audited, for :data:`INDEX_PURPOSE`);
    plaintext bodies only otherwise."""
    provider = LocalKeyProvider.from_env()
    if provider is None:
        return PayloadPipeline()
    keys = AuditedKeys(engine, provider, purpose=INDEX_PURPOSE)
    return PayloadPipeline(sealer=AesGcmSealer(keys))


class TextIndexConsumer(ConsumerRuntime):
    """The consumer that keeps the full-text index (offsets in the same transaction as
    its rows). Call :func:`agent_blackbox.consumers.migrate_views` once before starting
    it; opt tenants in with :func:`enable_text_search_txn` (``blackbox tenants search``).
    """

    def __init__(
        self,
        settings: Settings,
        *,
        group_id: str | None = None,
        engine: Engine | None = None,
        batch_size: int = 500,
        registry: CollectorRegistry | None = None,
        instance_id: str | None = None,
        verifier: CheckpointVerifier | None = None,
        pipeline: PayloadPipeline | None = None,
    ) -> None:
        super().__init__(
            settings,
            lambda conn, records: self.indexer(conn, records),
            name="text-index",
            group_id=group_id or TEXT_INDEX_GROUP,
            screen=views_screen,
            engine=engine,
            batch_size=batch_size,
            registry=registry,
            instance_id=instance_id,
        )
        self.indexer = TextIndexer(
            pipeline or index_pipeline(self.engine), RedactionCheck(verifier)
        )
