"""Schema evolution on read: Avro resolution where it suffices, migrators where not.

Stored bodies are never rewritten. Reading one takes the writer version the envelope
names up to the newest (or a requested) version, one step at a time:

- a step from version N that a migrator covers runs the migrator, a pure function
  from a version-N body to a version-N+1 body;
- any other step is Avro reader/writer resolution from N to the next version that has
  a schema, and must be a pure additive change (the new fields have defaults, removed
  fields are skipped, types only promote); consecutive resolution steps collapse into
  one decode when the newer schema reads the older one directly.

When neither covers a step, the read stops with :class:`UnknownSchemaVersion` naming
the type, the version and the step, before any body is handed out.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NoReturn

from fastavro import schemaless_reader

from agent_blackbox.schemas._codec import BodyCodec
from agent_blackbox.schemas._compat import incompatibilities
from agent_blackbox.schemas._errors import MigrationFailed, UndecodableMessage, UnknownSchemaVersion
from agent_blackbox.schemas._llm_call import llm_call_v1_to_v2
from agent_blackbox.schemas._registry import SchemaRegistry
from agent_blackbox.schemas._typed_bodies import (
    effect_receipt_v1_to_v2,
    run_finished_v1_to_v2,
    run_started_v1_to_v2,
    tool_call_v1_to_v2,
)
from agent_blackbox.schemas.event_types import EventType

Migrator = Callable[[Mapping[str, Any]], dict[str, Any]]
"""A pure function from a body of version N to the body of version N + 1.

It must not change its argument and must not read the clock, randomness or the
environment: the same stored body migrates to the same result on every read.
"""


class MigratorRegistry:
    """Migrators by (event type, version they migrate from)."""

    def __init__(self) -> None:
        self._steps: dict[tuple[str, int], Migrator] = {}

    def add(self, event_type: str, from_version: int, migrator: Migrator) -> None:
        """Register ``migrator`` for ``event_type`` bodies of ``from_version``.

        Raises:
            ValueError: that step already has a migrator (a step has exactly one).
        """
        key = (str(event_type), from_version)
        if key in self._steps:
            raise ValueError(f"{event_type} v{from_version} already has a migrator")
        self._steps[key] = migrator

    def register(self, event_type: str, from_version: int) -> Callable[[Migrator], Migrator]:
        """Decorator form of :meth:`add`."""

        def decorate(migrator: Migrator) -> Migrator:
            self.add(event_type, from_version, migrator)
            return migrator

        return decorate

    def get(self, event_type: str, from_version: int) -> Migrator | None:
        """The migrator from ``from_version`` of ``event_type``, if there is one."""
        return self._steps.get((event_type, from_version))

    def covers(self, event_type: str, from_version: int) -> bool:
        """Whether a migrator takes ``event_type`` bodies from ``from_version`` onwards."""
        return (event_type, from_version) in self._steps

    def steps(self) -> tuple[tuple[str, int], ...]:
        """Every (event type, from version) with a migrator, sorted."""
        return tuple(sorted(self._steps))


def default_migrators() -> MigratorRegistry:
    """A new registry holding the migrators shipped with agent-blackbox."""
    migrators = MigratorRegistry()
    migrators.add(EventType.LLM_CALL, 1, llm_call_v1_to_v2)
    migrators.add(EventType.RUN_STARTED, 1, run_started_v1_to_v2)
    migrators.add(EventType.TOOL_CALL, 1, tool_call_v1_to_v2)
    migrators.add(EventType.EFFECT_RECEIPT, 1, effect_receipt_v1_to_v2)
    migrators.add(EventType.RUN_FINISHED, 1, run_finished_v1_to_v2)
    return migrators


@dataclass(frozen=True, slots=True)
class Step:
    """One step of a read path."""

    kind: Literal["resolve", "migrate"]
    source: int
    target: int


class BodyReader:
    """Decodes stored bodies and brings them to the newest (or a requested) version.

    Args:
        codec: the body codec; its schema registry is the one read against.
        migrators: the migrator registry (default: :func:`default_migrators`).
    """

    def __init__(
        self, codec: BodyCodec | None = None, migrators: MigratorRegistry | None = None
    ) -> None:
        self._codec = codec or BodyCodec()
        self._registry: SchemaRegistry = self._codec.registry
        self._migrators = migrators or default_migrators()
        self._latest: dict[str, int] = {}
        self._paths: dict[tuple[str, int, int], tuple[Step, ...]] = {}

    def latest_version(self, event_type: str) -> int | None:
        """The newest schema version of ``event_type``; None when it has none."""
        latest = self._latest.get(event_type)
        if latest is None:
            versions = self._registry.versions(event_type)
            if not versions:
                return None
            latest = self._latest[event_type] = versions[-1]
        return latest

    def read(
        self, event_type: str, version: int, data: bytes, *, to: int | None = None
    ) -> dict[str, Any]:
        """Decode a body written with ``version`` and return it at version ``to``.

        Args:
            event_type: the envelope's event type.
            version: the envelope's ``body_version``, the writer schema.
            data: the plain Avro body.
            to: the version wanted; the newest when None.

        Raises:
            UnknownSchemaVersion: no schema for ``version``, or no reader path to ``to``.
            UndecodableMessage: the bytes are not a body of the writer schema.
            MigrationFailed: a migrator raised on the body.
        """
        target = self._target(event_type, version, to)
        if version == target:
            return self._codec.decode(event_type, version, data)
        steps = self.path(event_type, version, target)
        first = steps[0]
        if first.kind == "resolve":
            body = self._resolve_bytes(event_type, first, data)
            steps = steps[1:]
        else:
            body = self._codec.decode(event_type, version, data)
        return self._apply(event_type, steps, body)

    def upgrade(
        self, event_type: str, version: int, body: Mapping[str, Any], *, to: int | None = None
    ) -> dict[str, Any]:
        """Bring an already decoded body of ``version`` to version ``to`` (newest if None)."""
        target = self._target(event_type, version, to)
        if version == target:
            self._registry.get(event_type, version)
            return dict(body)
        return self._apply(event_type, self.path(event_type, version, target), dict(body))

    def _target(self, event_type: str, version: int, to: int | None) -> int:
        if to is not None:
            return to
        latest = self.latest_version(event_type)
        if latest is None:
            raise UnknownSchemaVersion(event_type, version, ())
        return latest

    def path(self, event_type: str, version: int, to: int) -> tuple[Step, ...]:
        """The steps that read a ``version`` body as ``to``.

        Raises:
            UnknownSchemaVersion: ``version`` has no schema, or a step has no reader path.
        """
        key = (event_type, version, to)
        steps = self._paths.get(key)
        if steps is None:
            steps = self._paths[key] = self._plan(event_type, version, to)
        return steps

    def _plan(self, event_type: str, version: int, to: int) -> tuple[Step, ...]:
        self._registry.get(event_type, version)  # an unknown writer version stops here
        known = self._registry.versions(event_type)
        if to < version:
            self._stop(event_type, version, f"a v{version} body cannot be read as v{to}")
        if to not in known:
            self._stop(event_type, version, f"v{to} was requested but has no schema")
        steps: list[Step] = []
        current = version
        while current < to:
            if self._migrators.covers(event_type, current):
                steps.append(Step("migrate", current, current + 1))
                current += 1
                continue
            following = min(v for v in known if current < v <= to)
            step = self._resolution(event_type, current, following, version)
            previous = steps[-1] if steps else None
            if (
                previous is not None
                and previous.kind == "resolve"
                and not self._reason(event_type, previous.source, following)
            ):
                steps[-1] = Step("resolve", previous.source, following)
            else:
                steps.append(step)
            current = following
        return tuple(steps)

    def _resolution(self, event_type: str, source: int, target: int, version: int) -> Step:
        reason = self._reason(event_type, source, target)
        if reason:
            self._stop(
                event_type,
                version,
                f"v{target} cannot read v{source} data ({reason}) and no migrator covers "
                f"the step; register a migrator for ({event_type!r}, {source}) or give the "
                "new fields defaults",
            )
        return Step("resolve", source, target)

    def _reason(self, event_type: str, source: int, target: int) -> str:
        known = self._registry.versions(event_type)
        if source not in known:
            return f"there is no {event_type}.v{source}.avsc"
        if target not in known:
            return f"there is no {event_type}.v{target}.avsc"
        issues = incompatibilities(
            self._registry.get(event_type, target).parsed,
            self._registry.get(event_type, source).parsed,
        )
        return "; ".join(map(str, issues))

    def _stop(self, event_type: str, version: int, reason: str) -> NoReturn:
        raise UnknownSchemaVersion(
            event_type, version, self._registry.versions(event_type), reason=reason
        )

    def _apply(
        self, event_type: str, steps: tuple[Step, ...], body: dict[str, Any]
    ) -> dict[str, Any]:
        for step in steps:
            if step.kind == "migrate":
                body = self._migrate(event_type, step, body)
            else:
                encoded = self._codec.encode(event_type, step.source, body)
                body = self._resolve_bytes(event_type, step, encoded)
        return body

    def _migrate(self, event_type: str, step: Step, body: dict[str, Any]) -> dict[str, Any]:
        migrator = self._migrators.get(event_type, step.source)
        assert migrator is not None  # the plan only holds covered steps
        try:
            return migrator(body)
        except Exception as exc:  # a migrator is user code; name the step that failed
            raise MigrationFailed(event_type, step.source, repr(exc)) from exc

    def _resolve_bytes(self, event_type: str, step: Step, data: bytes) -> dict[str, Any]:
        writer = self._registry.get(event_type, step.source).parsed
        reader = self._registry.get(event_type, step.target).parsed
        try:
            record = schemaless_reader(io.BytesIO(data), writer, reader)
        except Exception as exc:  # fastavro raises many types on corrupt input
            raise UndecodableMessage(
                f"{event_type} v{step.source} body is not valid Avro: {exc!r}"
            ) from exc
        if not isinstance(record, dict):
            raise UndecodableMessage(f"{event_type} v{step.source} body is not a record")
        return record
