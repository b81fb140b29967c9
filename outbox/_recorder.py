"""The Recorder in record mode, for synchronous agents."""

from __future__ import annotations

import contextlib
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Protocol, TypeVar

from sqlalchemy import Connection, Engine, create_engine
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session

from agent_blackbox.keystore import DataKeyStore, LocalKeyProvider
from agent_blackbox.outbox._boundaries import Crossing
from agent_blackbox.outbox._core import (
    APPEND_ATTEMPTS,
    Outcome,
    ReceiptBuilder,
    RecorderBase,
    RunCore,
    RunSnapshot,
    fresh_event_id,
    plan_start,
)
from agent_blackbox.outbox._effects import EffectOutcome, EffectPolicy, EffectReceipt, ToolPolicy
from agent_blackbox.outbox._errors import DatabaseUnavailable, EffectRejected, RunNotActive
from agent_blackbox.outbox._recovery import PendingEffect, load_run_txn, unresolved_effects_txn
from agent_blackbox.outbox._writer import (
    append_txn,
    load_cursor_txn,
)
from agent_blackbox.schemas import Digester, Envelope, Settings

T = TypeVar("T")
Joinable = Connection | Session
TRANSIENT_RETRIES = 3


class Recorder(RecorderBase[Engine]):
    """Records agent runs into the Postgres outbox.

    Args:
        engine: the write side's database.
        settings: shards, payload limits; read from the environment when omitted.
        pipeline: how bodies become payload bytes (plain Avro by default).
        clock: the source of ``recorded_at``.
    """

    @classmethod
    def from_settings(cls, settings: Settings | None = None) -> Recorder:
        """A recorder with its own engine for ``settings.database_url``; runs are
        encrypted when key-encryption keys are configured (``BLACKBOX_KEK_FILE`` or
        ``BLACKBOX_KEK``)."""
        settings = settings or Settings.from_env()
        engine = create_engine(settings.database_url, pool_size=10, max_overflow=20)
        provider = LocalKeyProvider.from_env()
        keys = None if provider is None else DataKeyStore(provider)
        return cls(engine, settings=settings, keys=keys)

    def start_run(
        self,
        snapshot: RunSnapshot,
        *,
        agent_id: str,
        tenant_id: str = "default",
        subject_ids: tuple[str, ...] = (),
        run_id: str | None = None,
        classification: str = "internal",
        retention_class: str = "standard",
        connection: Joinable | None = None,
    ) -> Run:
        """Create the run and record ``run.started``, in one transaction.

        With ``connection``, the run is created in the caller's transaction and exists
        only if the caller commits.

        Raises:
            NotSerialisable: the snapshot's input is not JSON.
            RunNotActive: a run with ``run_id`` exists already.
            DatabaseUnavailable: Postgres could not be reached.
        """
        plan = plan_start(
            self._factory,
            self.settings,
            snapshot,
            agent_id=agent_id,
            tenant_id=tenant_id,
            subject_ids=subject_ids,
            run_id=run_id,
            classification=classification,
            retention_class=retention_class,
            keys=self.keys,
            digest=self._digest_for(tenant_id, classification),
            scrub=self.scrub,
        )
        run = Run(self, plan.core)

        def create(conn: Connection) -> None:
            statement, params = plan.insert
            try:
                conn.execute(statement, params)
            except IntegrityError as exc:
                raise plan.exists() from exc
            if plan.store_key is not None:
                conn.execute(*plan.store_key)
            run.append_in(conn, plan.crossing, plan.event_id, first=plan.first)

        self.transact(create, connection)
        return run

    def _digest_for(self, tenant_id: str, classification: str) -> Digester:
        known = self.cached_digest(tenant_id, classification)
        if known is not None:
            return known
        assert self.keys is not None  # cached_digest raised otherwise
        store = self.keys
        keyed = self.transact(lambda conn: store.tenant_digest_txn(conn, tenant_id), None)
        return self.remember_digest(tenant_id, keyed)

    def record(
        self,
        entry: Callable[[Run, Any], T],
        snapshot: RunSnapshot,
        *,
        agent_id: str,
        tenant_id: str = "default",
        subject_ids: tuple[str, ...] = (),
        run_id: str | None = None,
        classification: str = "internal",
        retention_class: str = "standard",
    ) -> tuple[Run, T]:
        """Run ``entry(run, snapshot.input)`` as a recorded run; its return value is the
        run's recorded output, so a replay can check it.

        An exception from ``entry`` is recorded as the run's failure and re-raised.
        Returns the finished run and the output.
        """
        run = self.start_run(
            snapshot,
            agent_id=agent_id,
            tenant_id=tenant_id,
            subject_ids=subject_ids,
            run_id=run_id,
            classification=classification,
            retention_class=retention_class,
        )
        return run, run.drive(entry, snapshot.input)

    def append(
        self, run: Run, crossing: Crossing, event_id: str, connection: Joinable | None
    ) -> Envelope:
        """Append one event of ``run`` in its own transaction or the caller's."""
        return self.transact(lambda conn: run.append_in(conn, crossing, event_id), connection)

    def unresolved_effects(
        self, *, run_id: str | None = None, limit: int = 1_000
    ) -> list[PendingEffect]:
        """Side effects whose intent committed but whose receipt is missing or unknown.

        After a crash, resolve each with :meth:`Run.resolve_effect` on the run from
        :meth:`resume`, asking the external system; never by calling it again blindly.
        """
        return self.transact(
            lambda conn: unresolved_effects_txn(conn, run_id=run_id, limit=limit), None
        )

    def resume(self, run_id: str) -> Run:
        """A writer for a run that is still ``running`` (its first writer died).

        Raises:
            RunNotActive: the run does not exist or has finished.
        """
        stored = self.transact(
            lambda conn: load_run_txn(conn, run_id, shards=self.settings.outbox_shards), None
        )
        if stored.status != "running":
            raise RunNotActive(f"run {run_id} is {stored.status}; only running runs resume")
        identity = stored.identity
        if self.keys is not None:
            # A new data key for this writer: the first one stays with the writer that
            # died, and is never read back from the store by an agent.
            data_key, store_key = self.keys.new_key(run_id, identity.tenant_id)
            self.transact(lambda conn: conn.execute(*store_key), None)
            identity = replace(identity, data_key=data_key)
        core = RunCore(identity, self._factory, self.scrub)
        core.cursor = stored.cursor
        core.state = stored.state
        return Run(self, core)

    def transact(self, work: Callable[[Connection], T], connection: Joinable | None) -> T:
        """Run ``work`` in the caller's transaction, or in a new one with retries.

        Only a transaction this recorder owns is retried: a connection that broke or a
        serialisation failure gets a fresh attempt; a joined transaction belongs to the
        caller, who decides.
        """
        if connection is not None:
            conn = connection.connection() if isinstance(connection, Session) else connection
            return _translated(lambda: work(conn))
        for attempt in range(TRANSIENT_RETRIES):
            try:
                with self.engine.begin() as conn:
                    return work(conn)
            except DBAPIError as exc:
                if not _transient(exc) or attempt == TRANSIENT_RETRIES - 1:
                    raise _unavailable(exc) from exc
                time.sleep(0.05 * 2**attempt)  # back off before a fresh attempt
            except SQLAlchemyError as exc:
                raise _unavailable(exc) from exc
        raise AssertionError("unreachable")


class EventLog(Protocol):
    """Where a run's events go (the Postgres outbox, or memory), and the policies that
    decide how its tools and effects are reached."""

    tools: ToolPolicy
    effects: EffectPolicy

    def append(
        self, run: Run, crossing: Crossing, event_id: str, connection: Joinable | None
    ) -> Envelope:
        """Append the next event of ``run``."""
        ...


class Run:
    """One agent run in record mode: the only door between agent code and the world.

    Use it as a context manager: leaving the block records ``run.finished``, as
    ``failed`` when an exception escapes. A run has one writer at a time; its methods
    are safe to call from several threads of that writer.
    """

    def __init__(self, recorder: EventLog, core: RunCore) -> None:
        self._recorder = recorder
        self.core = core
        self._lock = threading.RLock()
        self._joined: Joinable | None = None
        self._random = random.Random()

    @property
    def run_id(self) -> str:
        """The id of this run."""
        return self.core.run_id

    @property
    def last_sequence(self) -> int:
        """The sequence of the last event this writer appended."""
        return self.core.cursor.sequence

    def __enter__(self) -> Run:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.core.finished:
            return
        if exc is None:
            self.finish()
        else:
            self.finish(status="failed", error=exc)

    def drive(self, entry: Callable[[Run, Any], T], input: Any) -> T:
        """Run ``entry(self, input)`` and finish the run with its output or its error."""
        try:
            output = entry(self, input)
        except Exception as exc:
            self.finish(status="failed", error=exc)
            raise
        self.finish(output=output)
        return output

    @contextmanager
    def joined(self, connection: Joinable) -> Iterator[Run]:
        """Append every event inside the block in the caller's transaction."""
        with self._lock:
            previous, self._joined = self._joined, connection
            try:
                yield self
            finally:
                self._joined = previous

    # Boundaries -----------------------------------------------------------------

    def call(self, tool: str, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Call tool ``fn(*args, **kwargs)`` and record ``tool.call``.

        The arguments are checked before ``fn`` runs; an exception from ``fn`` is
        recorded and re-raised.

        Raises:
            NotSerialisable: an argument or the result is not JSON.
        """
        outcome = self.core.tool_outcome(tool, args, kwargs)
        tools = self._recorder.tools
        result: T = self._observed(lambda: tools.call(tool, args, kwargs, fn), outcome)
        return result

    def llm(
        self,
        send: Callable[[Mapping[str, Any]], Mapping[str, Any]],
        request: Mapping[str, Any],
        *,
        provider: str,
        model: str | None = None,
    ) -> Mapping[str, Any]:
        """Send ``request`` to a model through ``send`` and record ``llm.call``.

        ``send`` takes the raw request JSON and returns the raw response JSON of an
        OpenAI-compatible chat completion. Errors are recorded and re-raised.
        """
        outcome = self.core.llm_outcome(provider, model, request)
        return self._observed(lambda: send(request), outcome)

    def now(self) -> datetime:
        """The wall clock, UTC, recorded as ``clock.read``."""
        crossing = self.core.wall_clock()
        self._append(crossing)
        return datetime.fromtimestamp(crossing.body["value_us"] / 1e6, UTC)

    def monotonic(self) -> float:
        """A monotonic clock in seconds, recorded as ``clock.read``."""
        crossing = self.core.monotonic_clock()
        self._append(crossing)
        return float(crossing.body["value_us"]) / 1e6

    def random(self) -> float:
        """A float in [0, 1), recorded as ``random.draw``."""
        value = self._random.random()
        self._append(self.core.random_float(value))
        return value

    def randint(self, low: int, high: int) -> int:
        """An integer in [low, high], recorded as ``random.draw``."""
        value = self._random.randint(low, high)
        self._append(self.core.random_int(low, high, value))
        return value

    def uuid(self) -> uuid.UUID:
        """A random UUID, recorded as ``random.draw``."""
        value, crossing = self.core.random_uuid()
        self._append(crossing)
        return value

    def effect(
        self,
        effect: str,
        perform: Callable[[str], EffectOutcome | Mapping[str, Any] | None],
        *,
        arguments: Mapping[str, Any],
        key: str | None = None,
    ) -> EffectReceipt:
        """Cause a side effect: ``effect.intent`` commits, then ``perform(key)``, then
        ``effect.receipt``.

        ``perform`` receives the idempotency key and should hand it to the external
        system. It raises :class:`EffectRejected` when the system refused for sure;
        any other exception leaves the receipt ``unknown`` and is re-raised.
        """
        intent = self.core.effect_intent(effect, arguments, key)
        self._append(intent)  # committed before the external call, by design
        receipt = ReceiptBuilder.of(intent, self.core.scrub)
        key = intent.body["idempotency_key"]
        policy = self._recorder.effects
        self._observed(lambda: policy.perform(effect, key, arguments, perform), receipt.crossing)
        return receipt.receipt

    def resolve_effect(
        self,
        pending: PendingEffect,
        lookup: Callable[[str], EffectOutcome | Mapping[str, Any] | None],
    ) -> EffectReceipt:
        """Record the receipt of an effect left open by a crash, by asking the external
        system what became of it.

        ``lookup`` gets the idempotency key and returns what the external system knows
        (``confirmed``), ``None`` when it has no record (``failed``: the call never took
        effect, and the agent may now decide to try again), or raises when it cannot
        tell (the receipt says ``unknown`` and the exception propagates).
        """
        if pending.run_id != self.run_id:
            raise RunNotActive(f"effect {pending.idempotency_key} belongs to run {pending.run_id}")
        receipt = ReceiptBuilder(pending.effect, pending.idempotency_key, self.core.scrub)

        def ask() -> EffectOutcome | Mapping[str, Any]:
            found = lookup(pending.idempotency_key)
            if found is None:
                raise EffectRejected("the external system has no record of this effect")
            return found

        # A missing record is recorded as ``failed``; the caller reads it off the receipt.
        with contextlib.suppress(EffectRejected):
            self._observed(ask, receipt.crossing)
        return receipt.receipt

    def transition(
        self,
        to_state: str,
        *,
        state: Any,
        reason: str | None = None,
        connection: Joinable | None = None,
    ) -> Envelope:
        """Record ``state.transition``; with ``connection``, in the caller's transaction
        so the business state change and the event commit together."""
        crossing = self.core.transition(to_state, state, reason)
        envelope = self._append(crossing, connection)
        self.core.transitioned(crossing)
        return envelope

    def finish(
        self,
        *,
        status: str = "succeeded",
        output: Any = None,
        error: BaseException | None = None,
        connection: Joinable | None = None,
    ) -> Envelope:
        """Record ``run.finished``; afterwards the run takes no more events."""
        envelope = self._append(self.core.finish(status, output, error), connection)
        self.core.finished = True
        return envelope

    # Appending --------------------------------------------------------------------

    def _observed(self, perform: Callable[[], T], outcome: Outcome) -> T:
        """Run ``perform`` and record what came of it, also when it raised."""
        started = time.perf_counter()
        try:
            result = perform()
        except Exception as exc:
            self._append(outcome(None, exc, _since(started)))
            raise
        self._append(outcome(result, None, _since(started)))
        return result

    def _append(self, crossing: Crossing, connection: Joinable | None = None) -> Envelope:
        with self._lock:
            self.core.check_active()
            event_id = fresh_event_id()
            target = connection if connection is not None else self._joined
            return self._recorder.append(self, crossing, event_id, target)

    def append_in(
        self, conn: Connection, crossing: Crossing, event_id: str, *, first: Any = None
    ) -> Envelope:
        """Append ``crossing`` on ``conn``, re-reading the run when its guard fails."""
        event = first or self.core.prepare(crossing, event_id)
        for _ in range(APPEND_ATTEMPTS):
            if append_txn(conn, self.core.identity, event):
                return self.core.advanced(event)
            if self.core.stale(event, load_cursor_txn(conn, self.run_id)):
                return event.envelope
            event = self.core.prepare(crossing, event_id)
        raise self.core.conflict()


def _since(started: float) -> float:
    return (time.perf_counter() - started) * 1000.0


def _transient(exc: DBAPIError) -> bool:
    if exc.connection_invalidated:
        return True
    code = getattr(exc.orig, "sqlstate", None)
    # serialization_failure, deadlock_detected, admin/crash shutdown, cannot_connect_now
    return code in {"40001", "40P01", "57P01", "57P02", "57P03"}


def _unavailable(exc: SQLAlchemyError) -> DatabaseUnavailable:
    return DatabaseUnavailable(
        f"the outbox write failed: {exc.__class__.__name__}: {str(exc).splitlines()[0]}; "
        "nothing was recorded for this event. Check that Postgres is reachable "
        "(BLACKBOX_DATABASE_URL) and migrated (blackbox migrate)"
    )


def _translated(work: Callable[[], T]) -> T:
    try:
        return work()
    except SQLAlchemyError as exc:
        raise _unavailable(exc) from exc
