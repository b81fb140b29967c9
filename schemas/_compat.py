"""Avro schema compatibility: can a reader schema read what a writer schema wrote?

fastavro resolves data between two schemas but never checks the schemas against each
other, so this module implements the rules of the "Schema Resolution" section of the
Avro specification that decide it:

- records match by unqualified name (or a reader alias); every reader field must be in
  the writer (by name or alias) or carry a default; writer fields the reader lacks are
  skipped;
- enums match by name; every writer symbol must be a reader symbol unless the reader
  enum has a default;
- fixed types match by name and size; arrays by items, maps by values;
- a writer union is readable when every branch is; a reader union reads a writer type
  when one of its branches does;
- primitives match themselves or promote: int → long → float → double, string ↔ bytes.

:func:`check_registry` is what ``blackbox schemas check`` runs: backward transitive,
each version against every earlier one, except across a step a migrator covers.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from agent_blackbox.schemas._registry import SchemaRegistry

_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_PROMOTIONS = {
    "int": frozenset({"long", "float", "double"}),
    "long": frozenset({"float", "double"}),
    "float": frozenset({"double"}),
    "string": frozenset({"bytes"}),
    "bytes": frozenset({"string"}),
}


@dataclass(frozen=True, slots=True)
class Incompatibility:
    """One reason a reader schema cannot read data of a writer schema."""

    path: str
    """Where, as ``Record.field.field``; ``[]`` marks array items, ``{}`` map values."""
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


def incompatibilities(reader: Any, writer: Any) -> tuple[Incompatibility, ...]:
    """Every reason ``reader`` cannot read data written with ``writer``; empty if it can.

    Both are Avro schemas, as JSON or as fastavro parsed them.
    """
    resolver = _Resolver(_named_types(reader), _named_types(writer))
    return tuple(resolver.check(reader, writer, _label(reader)))


def can_read(reader: Any, writer: Any) -> bool:
    """Whether ``reader`` can read every datum written with ``writer``."""
    return not incompatibilities(reader, writer)


class _Resolver:
    def __init__(self, reader_names: dict[str, Any], writer_names: dict[str, Any]) -> None:
        self._reader_names = reader_names
        self._writer_names = writer_names
        # Recursive records: a pair already under comparison is assumed to match.
        self._open: set[tuple[str, str]] = set()

    def check(self, reader: Any, writer: Any, path: str) -> list[Incompatibility]:
        reader = _deref(reader, self._reader_names)
        writer = _deref(writer, self._writer_names)
        reader_kind, writer_kind = _kind(reader), _kind(writer)
        if writer_kind == "union":
            return [issue for branch in writer for issue in self.check(reader, branch, path)]
        if reader_kind == "union":
            return self._union(reader, writer, writer_kind, path)
        if reader_kind != writer_kind:
            if reader_kind in _PROMOTIONS.get(writer_kind, ()):
                return []
            reason = f"type changed from {writer_kind} to {reader_kind}, which Avro cannot promote"
            return [Incompatibility(path, reason)]
        if reader_kind == "record":
            return self._record(reader, writer, path)
        if reader_kind == "enum":
            return _enum(reader, writer, path)
        if reader_kind == "fixed":
            return _fixed(reader, writer, path)
        if reader_kind == "array":
            return self.check(reader["items"], writer["items"], f"{path}[]")
        if reader_kind == "map":
            return self.check(reader["values"], writer["values"], f"{path}{{}}")
        return []

    def _union(
        self, reader: list[Any], writer: Any, writer_kind: str, path: str
    ) -> list[Incompatibility]:
        attempts = [(branch, self.check(branch, writer, path)) for branch in reader]
        if any(not issues for _, issues in attempts):
            return []
        # The branch of the writer's own kind explains best why it does not fit.
        for branch, issues in attempts:
            if _kind(_deref(branch, self._reader_names)) == writer_kind:
                return issues
        kinds = ", ".join(_kind(_deref(b, self._reader_names)) for b in reader)
        reason = f"no branch of the reader's union [{kinds}] reads the writer's {writer_kind}"
        return [Incompatibility(path, reason)]

    def _record(self, reader: Any, writer: Any, path: str) -> list[Incompatibility]:
        if not _same_name(reader, writer):
            return [_renamed("record", reader, writer, path)]
        pair = (reader["name"], writer["name"])
        if pair in self._open:
            return []
        self._open.add(pair)
        written = {field["name"]: field for field in writer["fields"]}
        issues = []
        for field in reader["fields"]:
            where = f"{path}.{field['name']}"
            names = (field["name"], *field.get("aliases", ()))
            source = next((written[n] for n in names if n in written), None)
            if source is not None:
                issues.extend(self.check(field["type"], source["type"], where))
            elif "default" not in field:
                issues.append(Incompatibility(where, _NO_DEFAULT))
        self._open.discard(pair)
        return issues


_NO_DEFAULT = (
    "field added without a default, so data written before it cannot be read; "
    "give it a default or register a migrator for this step"
)


def _enum(reader: Any, writer: Any, path: str) -> list[Incompatibility]:
    if not _same_name(reader, writer):
        return [_renamed("enum", reader, writer, path)]
    missing = [s for s in writer["symbols"] if s not in reader["symbols"]]
    if not missing or "default" in reader:
        return []
    reason = (
        f"enum symbols {', '.join(missing)} were written but the reader lacks them "
        "and has no default symbol"
    )
    return [Incompatibility(path, reason)]


def _fixed(reader: Any, writer: Any, path: str) -> list[Incompatibility]:
    if not _same_name(reader, writer):
        return [_renamed("fixed", reader, writer, path)]
    if reader["size"] != writer["size"]:
        reason = f"fixed size changed from {writer['size']} to {reader['size']}"
        return [Incompatibility(path, reason)]
    return []


def _renamed(kind: str, reader: Any, writer: Any, path: str) -> Incompatibility:
    return Incompatibility(
        path,
        f"{kind} {_short(writer['name'])} is read as {_short(reader['name'])}; names "
        "must match or the reader must list the old name in its aliases",
    )


def _same_name(reader: Any, writer: Any) -> bool:
    written = _short(writer["name"])
    aliases = {_short(a) for a in reader.get("aliases", ())}
    return written == _short(reader["name"]) or written in aliases


def _kind(schema: Any) -> str:
    if isinstance(schema, list):
        return "union"
    if isinstance(schema, dict):
        return _kind(schema["type"])
    return str(schema)


def _deref(schema: Any, names: dict[str, Any]) -> Any:
    """A named reference replaced by its definition; ``{"type": X}`` wrappers removed."""
    while True:
        if isinstance(schema, str) and schema not in _PRIMITIVES:
            if schema not in names:
                raise ValueError(f"schema refers to unknown named type {schema!r}")
            schema = names[schema]
        elif isinstance(schema, dict) and not isinstance(schema["type"], str):
            schema = schema["type"]
        elif isinstance(schema, dict) and schema["type"] in _PRIMITIVES:
            return schema["type"]  # a primitive with a logical type reads as the primitive
        else:
            return schema


def _named_types(schema: Any, namespace: str = "") -> dict[str, Any]:
    """Every named type a schema defines, under its full and its short name."""
    found: dict[str, Any] = {}

    def walk(node: Any, space: str) -> None:
        if isinstance(node, list):
            for branch in node:
                walk(branch, space)
            return
        if not isinstance(node, dict):
            return
        kind = node.get("type")
        if kind in ("record", "error", "enum", "fixed"):
            full = _full_name(node["name"], node.get("namespace", space))
            found.setdefault(full, node)
            found.setdefault(_short(full), node)
            space = full.rpartition(".")[0]
            for field in node.get("fields", ()):
                walk(field["type"], space)
        elif kind == "array":
            walk(node["items"], space)
        elif kind == "map":
            walk(node["values"], space)
        elif not isinstance(kind, str):
            walk(kind, space)

    walk(schema, namespace)
    return found


def _full_name(name: str, namespace: str | None) -> str:
    return name if "." in name or not namespace else f"{namespace}.{name}"


def _short(name: str) -> str:
    return name.rpartition(".")[2]


def _label(schema: Any) -> str:
    if isinstance(schema, dict) and "name" in schema:
        return _short(schema["name"])
    return _kind(schema)


# The registry check -------------------------------------------------------------------


class StepCoverage(Protocol):
    """Knows which version steps a migrator covers (a :class:`MigratorRegistry`)."""

    def covers(self, event_type: str, from_version: int) -> bool:
        """Whether a migrator turns ``event_type`` bodies of ``from_version`` into the next."""
        ...


@dataclass(frozen=True, slots=True)
class CompatibilityProblem:
    """A schema version that cannot read the data of an earlier one."""

    event_type: str
    reader_version: int
    writer_version: int
    incompatibility: Incompatibility

    def describe(self) -> str:
        """One line naming type, versions and the offending field."""
        return (
            f"{self.event_type} v{self.reader_version} cannot read data written with "
            f"v{self.writer_version}: {self.incompatibility}"
        )


@dataclass(frozen=True, slots=True)
class CompatibilityReport:
    """What ``blackbox schemas check`` found."""

    resolved: tuple[tuple[str, int, int], ...]
    """(type, reader version, writer version) pairs checked by Avro resolution."""
    migrated: tuple[tuple[str, int, int], ...]
    """Pairs not checked because a migrator covers a step between them."""
    problems: tuple[CompatibilityProblem, ...]

    @property
    def ok(self) -> bool:
        """Whether every version has a reader path from every earlier one."""
        return not self.problems


def check_registry(registry: SchemaRegistry, migrators: StepCoverage) -> CompatibilityReport:
    """Check every schema version against all earlier versions of its type.

    A pair is checked by Avro resolution unless a migrator covers one of the steps from
    the older version to the newer one: then the migrated body, not the old data, meets
    the newer schema, and the pairs after the migrator are checked instead. A migrator
    whose target version has no schema (and no further migrator) is a problem too.
    """
    resolved: list[tuple[str, int, int]] = []
    migrated: list[tuple[str, int, int]] = []
    problems: list[CompatibilityProblem] = []
    for name in sorted({entry.name for entry in registry}):
        versions = registry.versions(name)
        for position, newer in enumerate(versions):
            for older in versions[:position]:
                if any(migrators.covers(name, step) for step in range(older, newer)):
                    migrated.append((name, newer, older))
                    continue
                resolved.append((name, newer, older))
                issues = incompatibilities(
                    registry.get(name, newer).parsed, registry.get(name, older).parsed
                )
                problems.extend(CompatibilityProblem(name, newer, older, i) for i in issues)
        problems.extend(_dangling_migrators(name, versions, migrators))
    return CompatibilityReport(tuple(resolved), tuple(migrated), tuple(problems))


def _dangling_migrators(
    name: str, versions: tuple[int, ...], migrators: StepCoverage
) -> Iterator[CompatibilityProblem]:
    for version in range(versions[0], versions[-1]):
        target = version + 1
        if (
            migrators.covers(name, version)
            and target not in versions
            and not migrators.covers(name, target)
        ):
            reason = f"a migrator produces v{target} but there is no {name}.v{target}.avsc"
            yield CompatibilityProblem(name, target, version, Incompatibility(name, reason))
