"""The analytics views: LLM calls, tool calls and effects, for plain SQL.

Built from each envelope's unsealed attributes (provider, model, tokens, latency, finish
reason, error class, tool, effect, receipt status), so the consumer needs no data key
and the rows hold no body. Every write is idempotent (a call row is inserted once, an
effect's intent and receipt fill their own columns once), so a redelivered batch
changes nothing and a rebuild from offset zero gives the same rows.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from decimal import Decimal
from functools import partial
from typing import Any

from prometheus_client import CollectorRegistry
from sqlalchemy import Connection, Engine, func, literal_column, select
from sqlalchemy.dialects import postgresql as pg

from agent_blackbox.consumers._batch import AnalyticsOutcome, BatchOutcome, CallCost, Delivered
from agent_blackbox.consumers._metrics import CostCounter
from agent_blackbox.consumers._prices import Price, PriceTable, TokenCounts
from agent_blackbox.consumers._redacted_views import RedactionCheck
from agent_blackbox.consumers._runtime import ConsumerRuntime
from agent_blackbox.consumers._tables import effect_calls, llm_calls, run_rollups, tool_calls
from agent_blackbox.consumers._views import split_repeats, views_screen
from agent_blackbox.consumers._vouching import Unverified, Vouching
from agent_blackbox.schemas import (
    PROMPT_VERSION_TAG,
    CheckpointVerifier,
    Envelope,
    EventType,
    Settings,
    run_tags,
)

ANALYTICS_GROUP = "blackbox-analytics"
"""The analytics consumer's group unless another is given."""


def apply_analytics(
    conn: Connection,
    records: Sequence[Delivered],
    *,
    redactions: RedactionCheck | None = None,
    prices: PriceTable | None = None,
    vouching: Vouching | None = None,
) -> AnalyticsOutcome:
    """Project ``records`` into the analytics views through ``conn``; the caller commits.

    Each LLM call is priced with ``prices`` (default: the shipped table) as it is
    inserted, and its cost added to its run's rollup then, once.

    A ``run.redacted`` the write side confirms (``redactions``, as the views consumer
    checks it) makes the views forget what of its run could name the subject: the
    run's tags and its effects' idempotency-key digests (a digest of a short key
    confirms a guess).

    An event the write side does not vouch for (``vouching``, as the views consumer
    judges it) changes no rollup: its call row is kept with the reason in
    ``unverified`` (left out of every total), any other kind is passed over."""
    table = prices or PriceTable.shipped()
    firsts, _ = split_repeats(records)
    marks = (vouching or Vouching()).unverified(conn, [r.envelope for r in firsts])
    started: list[dict[str, Any]] = []
    redacted: list[Envelope] = []
    failed: list[Envelope] = []
    llm: list[dict[str, Any]] = []
    tools: list[dict[str, Any]] = []
    intents: list[dict[str, Any]] = []
    receipts: list[dict[str, Any]] = []
    for record in records:
        envelope = record.envelope
        kind = envelope.event_type
        mark = marks.get(record.key) if marks else None
        if kind == EventType.LLM_CALL:
            llm.append(_llm_row(envelope, table, mark))
        elif kind == EventType.TOOL_CALL:
            tool = envelope.attributes.get("tool")
            tools.append({**_call(envelope, mark), "tool": tool})
        elif mark is not None:
            continue  # counted as passed over: it changes no view
        elif kind == EventType.RUN_STARTED:
            started.append(_started_row(envelope))
        elif kind == EventType.EFFECT_INTENT:
            intents.append(_intent_row(envelope))
        elif kind == EventType.EFFECT_RECEIPT:
            receipts.append(_receipt_row(envelope))
        elif kind == EventType.RUN_REDACTED:
            redacted.append(envelope)
        elif kind == EventType.RUN_FINISHED and envelope.attributes.get("error"):
            failed.append(envelope)
    # Run facts first: the calls of a run that starts in this batch carry its versions.
    inserted = _start_rollups(conn, started)
    _carry_versions(conn, llm)
    new_llm = _insert_new(conn, llm_calls, llm)
    new_tools = _insert_new(conn, tool_calls, tools)
    _add_to_rollups(conn, _vouched(new_llm), _vouched(new_tools))
    inserted += len(new_llm) + len(new_tools)
    inserted += _note_run_errors(conn, failed)
    inserted += _fill(conn, _unique(intents), "intent_sequence", _INTENT)
    inserted += _fill(conn, _unique(receipts), "receipt_sequence", _RECEIPT)
    if redacted:
        refused = (redactions or RedactionCheck()).unconfirmed(conn, redacted)
        _forget_runs(conn, sorted({e.run_id for e in redacted if e.event_id not in refused}))
    # Every message is accounted for: what changed a row, what of a kind kept here
    # changed none (applied already), and the kinds this consumer passes over.
    handled = len(started) + len(llm) + len(tools) + len(intents) + len(receipts)
    handled += len(redacted) + len(failed)
    passed_over = len(records) - handled
    return AnalyticsOutcome(
        inserted=inserted,
        duplicates=max(handled - inserted, 0),
        passed_over=passed_over,
        costs=tuple(_call_cost(row) for row in _vouched(new_llm)),
    )


def _vouched(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The call rows the write side vouches for (usually all of them)."""
    if all(row["unverified"] is None for row in rows):
        return rows
    return [row for row in rows if row["unverified"] is None]


SHREDDED_KEY = "shredded-"
"""How an effect of a shredded run is keyed: this, then its intent (or receipt) sequence."""


def _forget_runs(conn: Connection, run_ids: Sequence[str]) -> None:
    if not run_ids:
        return
    conn.execute(
        run_rollups.update().where(run_rollups.c.run_id.in_(run_ids)).values(tags={}, words=None)
    )
    c = effect_calls.c
    sequence = func.coalesce(c.intent_sequence, c.receipt_sequence)
    conn.execute(
        effect_calls.update()
        .where(c.run_id.in_(run_ids), c.key_digest.not_like(f"{SHREDDED_KEY}%"))
        .values(key_digest=func.concat(SHREDDED_KEY, sequence))
    )


def _started_row(envelope: Envelope) -> dict[str, Any]:
    tags = run_tags(envelope.attributes)
    return {
        "run_id": envelope.run_id,
        "tenant_id": envelope.tenant_id,
        "agent_id": envelope.agent_id,
        "code_version": envelope.attributes.get("code_version"),
        "prompt_version": tags.get(PROMPT_VERSION_TAG),
        "prompt_templates": envelope.attributes.get("prompt_templates"),
        "tags": tags,
        "started_at": envelope.recorded_at,
    }


def _start_rollups(conn: Connection, rows: list[dict[str, Any]]) -> int:
    """A rollup row per started run, or its run facts set on one its calls made first
    (only a run whose ``run.started`` was lost or came late has such a row)."""
    if not rows:
        return 0
    rows = list({row["run_id"]: row for row in reversed(rows)}.values())
    statement = pg.insert(run_rollups)
    facts = ("code_version", "prompt_version", "prompt_templates", "tags", "started_at")
    upsert = statement.on_conflict_do_update(
        index_elements=["run_id"],
        set_={c: statement.excluded[c] for c in facts},
        where=run_rollups.c.started_at.is_(None),
    ).returning(run_rollups.c.run_id)
    return len(conn.execute(upsert, rows).all())


def _carry_versions(conn: Connection, rows: list[dict[str, Any]]) -> None:
    """Set each call row's prompt and code version from its run's rollup."""
    if not rows:
        return
    runs = sorted({row["run_id"] for row in rows})
    found = conn.execute(
        select(
            run_rollups.c.run_id, run_rollups.c.prompt_version, run_rollups.c.code_version
        ).where(run_rollups.c.run_id.in_(runs))
    ).all()
    versions = {run_id: (prompt, code) for run_id, prompt, code in found}
    for row in rows:
        row["prompt_version"], row["code_version"] = versions.get(row["run_id"], (None, None))


def _add_to_rollups(
    conn: Connection, llm: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> None:
    """Add the newly inserted calls to their runs' rollups (a call is inserted once, so
    it is added once: a redelivery or a rebuild gives the same sums)."""
    sums: dict[str, dict[str, Any]] = {}
    for row, is_llm in [*((r, True) for r in llm), *((r, False) for r in tools)]:
        total = sums.get(row["run_id"])
        if total is None:
            total = sums[row["run_id"]] = {
                "run_id": row["run_id"],
                "tenant_id": row["tenant_id"],
                "agent_id": row["agent_id"],
                **dict.fromkeys(_SUMMED, 0),
                "llm_latency_ms": 0.0,
                "max_latency_ms": None,
                "models": set(),
                "tools": set(),
                "error_classes": set(),
                "cost_usd": None,
            }
        latency = row["latency_ms"]
        total["errors"] += row["error_class"] is not None
        if row["error_class"] is not None:
            total["error_classes"].add(row["error_class"])
        if latency is not None:
            total["max_latency_ms"] = max(latency, total["max_latency_ms"] or latency)
        if not is_llm:
            total["tool_calls"] += 1
            if row["tool"] is not None:
                total["tools"].add(row["tool"])
            continue
        total["llm_calls"] += 1
        total["streamed_calls"] += bool(row["streamed"])
        for name in ("prompt_tokens", "completion_tokens", "total_tokens", "cached_tokens"):
            total[name] += row[name] or 0
        _add_cost(total, row)
        total["llm_latency_ms"] += latency or 0.0
        if row["model"] is not None:
            total["models"].add(row["model"])
    if not sums:
        return
    rows = [{**total, **{name: sorted(total[name]) for name in _SETS}} for total in sums.values()]
    statement = pg.insert(run_rollups)
    new, old = statement.excluded, run_rollups.c
    added: dict[str, Any] = {name: old[name] + new[name] for name in (*_SUMMED, "llm_latency_ms")}
    added["max_latency_ms"] = func.greatest(old.max_latency_ms, new.max_latency_ms)
    # NULL (nothing priced yet) plus a cost is that cost; NULL plus NULL stays NULL.
    added["cost_usd"] = func.coalesce(old.cost_usd + new.cost_usd, old.cost_usd, new.cost_usd)
    added.update({name: _union(name) for name in _SETS})
    conn.execute(statement.on_conflict_do_update(index_elements=["run_id"], set_=added), rows)


_SETS = ("models", "tools", "error_classes")
"""The rollup arrays that hold each of their values once: a union, however often and in
whatever order the calls come."""


def _union(name: str) -> Any:
    """The union of the run's ``name`` and the incoming ones, each once, in order."""
    return literal_column(
        f"ARRAY(SELECT DISTINCT m FROM unnest(run_rollups.{name} || excluded.{name}) AS m "
        "ORDER BY m)"
    )


def _note_run_errors(conn: Connection, finished: list[Envelope]) -> int:
    """Add the error class each failed run ended with to its rollup's error classes (a
    union: a redelivery changes nothing)."""
    if not finished:
        return 0
    rows = {
        e.run_id: {
            "run_id": e.run_id,
            "tenant_id": e.tenant_id,
            "agent_id": e.agent_id,
            "error_classes": [e.attributes["error"]],
        }
        for e in finished
    }
    statement = pg.insert(run_rollups)
    upsert = statement.on_conflict_do_update(
        index_elements=["run_id"], set_={"error_classes": _union("error_classes")}
    )
    conn.execute(upsert, [rows[run_id] for run_id in sorted(rows)])
    return len(rows)


_SUMMED = (
    "llm_calls",
    "tool_calls",
    "errors",
    "streamed_calls",
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
    "cached_tokens",
    "unpriced_calls",
)


_INTENT = ("effect", "intent_sequence", "intent_at")
_RECEIPT = ("receipt_sequence", "receipt_at", "status")


def _call(envelope: Envelope, mark: Unverified | None = None) -> dict[str, Any]:
    attributes = envelope.attributes
    return {
        "run_id": envelope.run_id,
        "sequence": envelope.sequence,
        "event_id": envelope.event_id,
        "tenant_id": envelope.tenant_id,
        "agent_id": envelope.agent_id,
        "recorded_at": envelope.recorded_at,
        "latency_ms": _number(attributes.get("latency_ms"), float),
        "error_class": attributes.get("error"),
        "unverified": None if mark is None else mark.reason,
    }


def _llm_row(envelope: Envelope, prices: PriceTable, mark: Unverified | None) -> dict[str, Any]:
    attributes = envelope.attributes
    row = {
        **_call(envelope, mark),
        "provider": attributes.get("provider"),
        "model": attributes.get("model"),
        "prompt_tokens": _number(attributes.get("prompt_tokens"), int),
        "completion_tokens": _number(attributes.get("completion_tokens"), int),
        "cached_tokens": _number(attributes.get("cached_tokens"), int),
        "total_tokens": _number(attributes.get("total_tokens"), int),
        "finish_reason": attributes.get("finish_reason"),
        "truncated": attributes.get("body_truncated") == "true",
        "streamed": attributes.get("streamed") == "true",
        "tool_calls_requested": _number(attributes.get("tool_calls_requested"), int),
        "tool_calls_invalid": _number(attributes.get("tool_calls_invalid"), int),
        "cache_write_tokens": _number(attributes.get("cache_write_tokens"), int),
    }
    price = prices.price(row["provider"], row["model"])
    cost = None if price is None else _cost(price, row)
    row["cost_usd"] = cost
    row["price_as_of"] = None if cost is None or price is None else price.as_of
    return row


def _cost(price: Price, row: dict[str, Any]) -> Decimal | None:
    """The call's cost at ``price``; None when it reported no usage."""
    if row["prompt_tokens"] is None and row["completion_tokens"] is None:
        return None
    return price.cost(
        TokenCounts(
            input_tokens=row["prompt_tokens"] or 0,
            output_tokens=row["completion_tokens"] or 0,
            cached_tokens=row["cached_tokens"] or 0,
            cache_write_tokens=row["cache_write_tokens"] or 0,
        )
    )


def _unpriced(row: dict[str, Any]) -> bool:
    """Whether the call's cost is unknown although it did not fail (a failed call is not
    billed: its missing cost is no gap)."""
    return row["cost_usd"] is None and row["error_class"] is None


def _call_cost(row: dict[str, Any]) -> CallCost:
    return CallCost(row["provider"], row["model"], row["cost_usd"], _unpriced(row))


def _add_cost(total: dict[str, Any], row: dict[str, Any]) -> None:
    if row["cost_usd"] is not None:
        total["cost_usd"] = (total["cost_usd"] or Decimal(0)) + row["cost_usd"]
    total["unpriced_calls"] += _unpriced(row)


def _effect(envelope: Envelope) -> dict[str, Any]:
    key = envelope.attributes.get("idempotency_key", "")
    return {
        "run_id": envelope.run_id,
        # The agent's key may name a customer; the view pairs by a digest of it.
        "key_digest": hashlib.sha256(key.encode("utf-8")).hexdigest()[:32],
        "tenant_id": envelope.tenant_id,
        "agent_id": envelope.agent_id,
        "effect": envelope.attributes.get("effect"),
    }


def _intent_row(envelope: Envelope) -> dict[str, Any]:
    return {
        **_effect(envelope),
        "intent_sequence": envelope.sequence,
        "intent_at": envelope.recorded_at,
        "receipt_sequence": None,
        "receipt_at": None,
        "status": None,
    }


def _receipt_row(envelope: Envelope) -> dict[str, Any]:
    return {
        **_effect(envelope),
        "intent_sequence": None,
        "intent_at": None,
        "receipt_sequence": envelope.sequence,
        "receipt_at": envelope.recorded_at,
        "status": envelope.attributes.get("status"),
    }


def _number(raw: str | None, kind: Callable[[str], float | int]) -> Any:
    """The attribute as a number, or None when it is absent or not a finite number."""
    if raw is None:
        return None
    try:
        value = kind(raw)
    except ValueError:
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, int) and not -(2**63) <= value < 2**63:
        return None
    return value


def _insert_new(conn: Connection, table: Any, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Insert ``rows``; the ones that were not there yet."""
    if not rows:
        return []
    statement = (
        pg.insert(table).on_conflict_do_nothing().returning(table.c.run_id, table.c.sequence)
    )
    new = {(run_id, sequence) for run_id, sequence in conn.execute(statement, rows)}
    return [row for row in rows if (row["run_id"], row["sequence"]) in new]


def _unique(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # One row per key in a statement (ON CONFLICT touches a row once): the first wins.
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        seen.setdefault((row["run_id"], row["key_digest"]), row)
    return list(seen.values())


def _fill(conn: Connection, rows: list[dict[str, Any]], marker: str, columns: Sequence[str]) -> int:
    """Insert each effect row, or fill its ``columns`` where ``marker`` is still NULL."""
    if not rows:
        return 0
    statement = pg.insert(effect_calls)
    excluded = statement.excluded
    upsert = statement.on_conflict_do_update(
        index_elements=["run_id", "key_digest"],
        set_={c: func.coalesce(effect_calls.c[c], excluded[c]) for c in columns},
        where=effect_calls.c[marker].is_(None),
    ).returning(effect_calls.c.run_id)
    return len(conn.execute(upsert, rows).all())


class AnalyticsConsumer(ConsumerRuntime):
    """The consumer that builds the analytics views (offsets in the same transaction).

    Call :func:`agent_blackbox.consumers.migrate_views` once before starting it.
    ``verifier`` checks ``run.redacted`` notes where the views live without the write
    side's deletion ledger, as for :class:`ViewConsumer`. ``prices`` puts a cost on each
    LLM call (default: the shipped table with ``settings.price_file`` over it), counted
    in ``registry`` once its batch committed (:class:`CostCounter`).

    Raises:
        PriceFileError: ``settings.price_file`` cannot be read or is malformed.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        group_id: str | None = None,
        engine: Engine | None = None,
        batch_size: int = 2000,
        registry: CollectorRegistry | None = None,
        instance_id: str | None = None,
        verifier: CheckpointVerifier | None = None,
        prices: PriceTable | None = None,
    ) -> None:
        self.prices = prices or PriceTable.load(settings.price_file)
        self._costs = CostCounter(registry)
        super().__init__(
            settings,
            partial(
                apply_analytics,
                redactions=RedactionCheck(verifier),
                prices=self.prices,
                vouching=Vouching(),
            ),
            name="analytics",
            group_id=group_id or ANALYTICS_GROUP,
            screen=views_screen,
            engine=engine,
            batch_size=batch_size,
            registry=registry,
            instance_id=instance_id,
        )

    def _committed(self, batch: Any, outcome: BatchOutcome, seconds: float) -> None:
        super()._committed(batch, outcome, seconds)
        if isinstance(outcome, AnalyticsOutcome):
            self._costs.count(outcome.costs)
