"""Redaction rules: the detectors, paths and pseudonyms a redactor applies, checked.

The rules are what a run records in ``run.started`` (as :attr:`RedactionRules.config`)
and what its replay rebuilds its redactor from, so reading them back must give the same
rules: every check is made here, once, with a message that says what to change.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

from agent_blackbox.outbox._detectors import ALWAYS_ON, DEFAULT_DETECTORS, DETECTORS
from agent_blackbox.outbox._errors import RedactionConfigError
from agent_blackbox.outbox._placeholders import CREDENTIAL, PSEUDONYMOUS
from agent_blackbox.outbox._shapes import ALWAYS_ON_V2, SHAPES
from agent_blackbox.outbox._shapes_v3 import SHAPES_V3

REDACTION_VERSION = 3
"""The detector set new runs are recorded with (``version`` in the recorded rules). Rules
recorded without a version are version 1: the detectors of that time, kept as they were
so that old runs replay; version 2 runs replay with version 2's detectors likewise."""
VERSIONS = (1, 2, 3)

PathRules: TypeAlias = tuple[tuple[str, tuple[str, ...]], ...]
"""Path rules, each as its rule name (``path:<dotted path>``) and the segments left to
match: all of them at the root, fewer below it."""

_CONFIG_KEYS = ("detectors", "paths", "pseudonyms")


@dataclass(frozen=True, slots=True)
class RedactionRules:
    """A checked set of redaction rules; build one with :meth:`build` or :meth:`from_config`.

    Attributes:
        version: the detector set (one of :data:`VERSIONS`).
        detectors: the detectors in force, the always-on ones included, in the order
            their version declares them (never the configured order: it decides which
            detector wins).
        paths: the path rules, sorted by name.
        pseudonyms: the rules whose values become keyed pseudonyms.
    """

    version: int
    detectors: tuple[str, ...]
    paths: PathRules
    pseudonyms: frozenset[str]

    @classmethod
    def build(
        cls,
        *,
        detectors: Iterable[str],
        paths: Iterable[str],
        pseudonyms: Iterable[str],
        version: int | None,
    ) -> RedactionRules:
        """The rules naming ``detectors``, ``paths`` and ``pseudonyms`` of ``version``
        (:data:`REDACTION_VERSION` when None).

        Raises:
            RedactionConfigError: naming an unknown version or detector, a malformed
                path, or a pseudonym rule that is not in force or may not have pseudonyms.
        """
        version = REDACTION_VERSION if version is None else version
        if version not in VERSIONS:
            raise RedactionConfigError(
                f"unknown redaction version {version!r}; known: {', '.join(map(str, VERSIONS))}"
            )
        known_detectors = _detectors_of(version)
        if any(isinstance(names, str) for names in (detectors, paths, pseudonyms)):
            raise RedactionConfigError(
                "detectors, paths and pseudonyms are lists of strings, not a string"
            )
        chosen = set(ALWAYS_ON if version == 1 else ALWAYS_ON_V2)
        for name in detectors:
            if not isinstance(name, str) or name not in known_detectors:
                known = ", ".join(known_detectors)
                raise RedactionConfigError(f"unknown redaction detector {name!r}; known: {known}")
            chosen.add(name)
        parsed = {path: _parse_path(path) for path in paths}
        return cls(
            version=version,
            detectors=tuple(name for name in known_detectors if name in chosen),
            paths=tuple(sorted((f"path:{p}", rest) for p, rest in parsed.items())),
            pseudonyms=_pseudonym_rules(pseudonyms, chosen, bool(parsed)),
        )

    @classmethod
    def from_config(cls, config: Mapping[str, Any], *, default_version: int) -> RedactionRules:
        """The rules of ``{"detectors": [...], "paths": [...]}``; both keys are optional,
        and so are ``pseudonyms`` and ``version`` (``default_version`` when absent).

        Raises:
            RedactionConfigError: naming the unknown key, detector or malformed path.
        """
        if not isinstance(config, Mapping):
            raise RedactionConfigError("redaction config must be an object with detectors, paths")
        unknown = sorted(set(config) - {*_CONFIG_KEYS, "version"})
        if unknown:
            raise RedactionConfigError(
                f"unknown redaction config key {unknown[0]!r}; expected 'detectors', 'paths', "
                "'pseudonyms' and 'version'"
            )
        version = config.get("version", default_version)
        if type(version) is not int:
            raise RedactionConfigError(
                f"redaction config 'version' must be an integer (one of "
                f"{', '.join(map(str, VERSIONS))}), not {version!r}"
            )
        lists = {key: config.get(key, []) for key in _CONFIG_KEYS}
        for key, items in lists.items():
            if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
                raise RedactionConfigError(f"redaction config {key!r} must be a list of strings")
        if "detectors" in config:
            detectors: Iterable[str] = lists["detectors"]
        else:
            detectors = DEFAULT_DETECTORS if version == 1 else tuple(_detectors_of(version))
        return cls.build(
            detectors=detectors,
            paths=lists["paths"],
            pseudonyms=lists["pseudonyms"],
            version=version,
        )

    @classmethod
    def from_file(cls, path: Path) -> RedactionRules:
        """The rules of a JSON file holding what :meth:`from_config` takes (version
        :data:`REDACTION_VERSION` when it names none).

        Raises:
            RedactionConfigError: saying which file, and what is wrong with it.
        """
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise RedactionConfigError(
                f"cannot read redaction config {path}: {exc.strerror or exc}; create it or "
                "point the recorder at an existing file"
            ) from exc
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise RedactionConfigError(
                f"redaction config {path} is not valid JSON ({exc}); it must hold "
                '{"detectors": [...], "paths": [...]}'
            ) from exc
        try:
            return cls.from_config(config, default_version=REDACTION_VERSION)
        except RedactionConfigError as exc:
            raise RedactionConfigError(f"redaction config {path}: {exc}") from exc

    @property
    def names(self) -> tuple[str, ...]:
        """Every rule name in force, sorted: what to record as the configuration used."""
        return tuple(sorted((CREDENTIAL, *self.detectors, *(n for n, _ in self.paths))))

    @property
    def config(self) -> dict[str, Any]:
        """What :meth:`from_config` takes to build these same rules again (``pseudonyms``
        only when there are any, so rules without them read as they always did;
        ``version`` past 1 only, so version 1 rules read as before)."""
        paths = sorted(name.removeprefix("path:") for name, _ in self.paths)
        config: dict[str, Any] = {"detectors": list(self.detectors), "paths": paths}
        if self.pseudonyms:
            config["pseudonyms"] = sorted(self.pseudonyms)
        if self.version > 1:
            config["version"] = self.version
        return config


def _detectors_of(version: int) -> Mapping[str, object]:
    """The detectors of a redaction version, by name, in the order they run."""
    return DETECTORS if version == 1 else SHAPES if version == 2 else SHAPES_V3


def _parse_path(path: object) -> tuple[str, ...]:
    if not isinstance(path, str) or not path:
        raise RedactionConfigError(f"redaction path {path!r} is not a non-empty string")
    segments = tuple(path.split("."))
    for segment in segments:
        if not segment or segment != segment.strip() or ("*" in segment and segment != "*"):
            raise RedactionConfigError(
                f"malformed redaction path {path!r}: segment {segment!r}; write dotted keys "
                "or list indexes, with '*' alone as a segment for any key or index"
            )
    return segments


def _pseudonym_rules(names: Iterable[str], detectors: set[str], paths: bool) -> frozenset[str]:
    chosen = frozenset(names)
    for name in sorted(chosen):
        if name not in PSEUDONYMOUS:
            raise RedactionConfigError(
                f"pseudonyms for {name!r} are not offered; choose among "
                f"{', '.join(PSEUDONYMOUS)} (credentials are always removed outright)"
            )
        if (name == "path" and not paths) or (name != "path" and name not in detectors):
            what = "no path rule is configured" if name == "path" else "its detector is off"
            raise RedactionConfigError(
                f"pseudonyms for {name!r} are asked for, but {what}; turn it on or drop it"
            )
    return chosen
