"""The registry of every Avro schema agent-blackbox has ever written.

Schemas live as ``.avsc`` files next to this module, one file per event type and
version: ``<event_type>.v<version>.avsc`` (``envelope.v<version>.avsc`` for the
envelope). Nothing is ever deleted from that folder: every version ever written keeps a
reader path.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastavro.schema import fingerprint, parse_schema, to_parsing_canonical_form

from agent_blackbox.schemas._errors import UnknownSchemaVersion

AVSC_DIR = Path(__file__).parent / "avsc"
ENVELOPE = "envelope"
_FILE_NAME = re.compile(r"^(?P<name>[a-z_.]+)\.v(?P<version>[1-9][0-9]*)\.avsc$")


@dataclass(frozen=True)
class SchemaEntry:
    """One schema file, parsed."""

    name: str
    """The event type, or ``envelope``."""
    version: int
    parsed: Any
    """The schema as fastavro parsed it."""
    canonical_form: str
    """The Avro parsing canonical form; the fingerprint is taken over it."""
    fingerprint: bytes
    """CRC-64-AVRO of the canonical form, the 8 bytes single-object encoding carries."""


class SchemaRegistry:
    """Every schema in a folder of ``.avsc`` files, by name and version and by fingerprint."""

    def __init__(self, entries: list[SchemaEntry]) -> None:
        self._by_key = {(e.name, e.version): e for e in entries}
        self._by_fingerprint = {e.fingerprint: e for e in entries}
        versions: dict[str, list[int]] = {}
        for name, version in sorted(self._by_key):
            versions.setdefault(name, []).append(version)
        self._versions = {name: tuple(found) for name, found in versions.items()}
        """Each name's versions, oldest first (a registry never changes once made)."""

    @classmethod
    def from_directory(cls, directory: Path = AVSC_DIR) -> SchemaRegistry:
        """Load every ``.avsc`` file of ``directory``."""
        return cls([_load(path) for path in sorted(directory.glob("*.avsc"))])

    def get(self, name: str, version: int) -> SchemaEntry:
        """The schema of ``name`` at ``version``.

        Raises:
            UnknownSchemaVersion: no such file was ever shipped.
        """
        try:
            return self._by_key[(name, version)]
        except KeyError:
            raise UnknownSchemaVersion(name, version, self.versions(name)) from None

    def by_fingerprint(self, value: bytes) -> SchemaEntry | None:
        """The schema whose CRC-64-AVRO fingerprint is ``value``, if any."""
        return self._by_fingerprint.get(value)

    def versions(self, name: str) -> tuple[int, ...]:
        """Every version of ``name``, oldest first."""
        return self._versions.get(name, ())

    def latest(self, name: str) -> SchemaEntry:
        """The newest version of ``name``."""
        versions = self.versions(name)
        if not versions:
            raise UnknownSchemaVersion(name, 0, ())
        return self._by_key[(name, versions[-1])]

    def event_types(self) -> tuple[str, ...]:
        """Every event type with at least one body schema."""
        return tuple(sorted({n for n, _ in self._by_key if n != ENVELOPE}))

    def __iter__(self) -> Iterator[SchemaEntry]:
        return iter(sorted(self._by_key.values(), key=lambda e: (e.name, e.version)))


def _load(path: Path) -> SchemaEntry:
    match = _FILE_NAME.match(path.name)
    if match is None:
        raise ValueError(f"{path}: schema files are named <event_type>.v<N>.avsc")
    parsed = parse_schema(json.loads(path.read_text(encoding="utf-8")), named_schemas={})
    canonical = to_parsing_canonical_form(parsed)
    return SchemaEntry(
        name=match["name"],
        version=int(match["version"]),
        parsed=parsed,
        canonical_form=canonical,
        fingerprint=bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO")),
    )


_DEFAULT: SchemaRegistry | None = None


def default_registry() -> SchemaRegistry:
    """The registry of the schemas shipped with this package, loaded once."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = SchemaRegistry.from_directory()
    return _DEFAULT
