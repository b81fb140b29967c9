"""Redaction at the boundaries: what a crossing records, scrubbed before the first write.

The same scrubbing runs in record mode (on what is about to be recorded) and in replay
(on what the code hands over now), so digests compare like with like. The rules in force
are recorded in ``run.started``; a replay rebuilds them from there, so a run replays
with the rules it was recorded under whatever the configuration is today.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

from agent_blackbox.outbox._boundaries import Crossing, error_info
from agent_blackbox.outbox._redaction import RedactionConfigError, Redactor
from agent_blackbox.outbox._stream_redaction import redacted_stream
from agent_blackbox.outbox._values import encode_value, restore_tags
from agent_blackbox.schemas import HMAC_PREFIX, Digester, canonical_text

RULES_ATTRIBUTE = "redaction"
"""On ``run.started``: the redaction rules the run was recorded under (canonical JSON)."""
FIRED_ATTRIBUTE = "redacted"
"""On any event: the rules that replaced something in it, comma-separated."""
PSEUDONYM_KEY_LABEL = ["agent-blackbox pseudonym key", 1]
"""What the tenant's keyed digest is taken of to derive its pseudonym key: the key is
that HMAC, so it is the tenant's own, stable, and tells nothing of the digest key."""


class _ScrubbedError(Exception):
    """An error whose message was redacted; recorded as the original type and the
    scrubbed message."""

    def __init__(self, recorded_error: dict[str, str]) -> None:
        super().__init__(recorded_error["message"])
        self.recorded_error = recorded_error


@functools.lru_cache(maxsize=32)
def _recorded_redactor(raw: str) -> Redactor:
    """The redactor of rules recorded as ``raw``. Built once per set of rules: a batch
    replay meets the same rules in every run, and building them (compiling their
    patterns) cost a tenth of replaying a short run. A redactor is never changed once
    built (a keyed one is a new one), so runs can share it."""
    return Redactor.from_config(json.loads(raw), default_version=1)


class Scrub:
    """Applies one :class:`Redactor` to every value a boundary records.

    Args:
        redactor: the rules; None scrubs nothing (runs recorded before redaction existed).
    """

    def __init__(self, redactor: Redactor | None) -> None:
        self._redactor = redactor

    @classmethod
    def recorded_in(cls, attributes: Mapping[str, str]) -> Scrub:
        """The scrubbing a run was recorded with, from its ``run.started`` attributes.
        Rules recorded without a ``version`` are version 1 (the detectors of their time),
        so a change of the default detectors never makes an old run diverge."""
        raw = attributes.get(RULES_ATTRIBUTE)
        if raw is None:
            return cls(None)
        return cls(_recorded_redactor(raw))

    @property
    def version(self) -> int:
        """The detector set's version (0: no rules). From version 2 on, a transition's
        reason and a snapshot's flags and changes are scrubbed too."""
        return 0 if self._redactor is None else self._redactor.version

    @property
    def pseudonymous(self) -> bool:
        """Whether the rules give pseudonyms, which need the tenant's key."""
        return self._redactor is not None and self._redactor.pseudonymous

    def check_key_store(self, *, present: bool) -> None:
        """Refuse rules that give pseudonyms to a recorder without a key store.

        Raises:
            RedactionConfigError: saying why pseudonyms need one.
        """
        if self.pseudonymous and not present:
            raise RedactionConfigError(
                "the redaction rules ask for pseudonyms, which are keyed by each tenant's "
                "key: give the recorder a key store (set BLACKBOX_KEK_FILE) or drop "
                "'pseudonyms' from the rules. An unkeyed hash would not do: the hash of an "
                "e-mail address is a dictionary attack away from the address."
            )

    def keyed(self, digest: Digester) -> Scrub:
        """These rules for one run whose digest is ``digest``: with pseudonyms, keyed by
        the key derived from the tenant's keyed digest; otherwise unchanged.

        Raises:
            RedactionConfigError: the rules give pseudonyms and the run's digest is not
                keyed by its tenant.
        """
        if self._redactor is None or not self._redactor.pseudonymous:
            return self
        derived = digest(PSEUDONYM_KEY_LABEL)
        if not derived.startswith(HMAC_PREFIX):
            raise RedactionConfigError(
                "the redaction rules ask for pseudonyms, and this run has no tenant key "
                "(its digests are plain SHA-256); pseudonyms need the key store"
            )
        return Scrub(self._redactor.keyed(bytes.fromhex(derived.removeprefix(HMAC_PREFIX))))

    def rules_text(self) -> str | None:
        """The rules as ``run.started`` records them."""
        return None if self._redactor is None else canonical_text(self._redactor.config)

    def response(self, response: Mapping[str, Any], fired: set[str]) -> Any:
        """An LLM response with every rule applied; a stream's text is also redacted as a
        whole, channel by channel, since a value split over chunks is in none of them
        (:func:`~agent_blackbox.outbox._stream_redaction.redacted_stream`)."""
        if self._redactor is not None and isinstance(response.get("stream"), list):
            response = redacted_stream(
                response,
                lambda text: self.value(text, fired, path="llm.response.stream"),
                completions=self.version > 2,
            )
        return self.value(dict(response), fired, path="llm.response")

    def value(self, value: Any, fired: set[str], *, path: str = "$") -> Any:
        """``value`` with every rule applied; the rules that fired are added to ``fired``.

        Raises:
            NotSerialisable: ``value`` nests too deeply to walk (naming where, from
                ``path``).
        """
        if self._redactor is None or self._redactor.inert(value):
            return value
        redacted = self._redactor.redact(value, path=path)
        fired.update(redacted.fired)
        return redacted.value

    def apart(self, value: dict[Any, Any], turns: str | None) -> bool:
        """Whether :meth:`value` of the mapping ``value`` scrubs each of its values, and
        each item of its list under ``turns``, alone (:meth:`part`); never without
        rules (the value is then recorded as the caller's own objects)."""
        return self._redactor is not None and self._redactor.apart(value, turns)

    def part(self, value: Any, *, level: int) -> tuple[Any, tuple[str, ...]]:
        """A value of a mapping :meth:`apart` holds for (``level`` 1) or an item of its
        list of turns (2), scrubbed as :meth:`value` of the mapping scrubs it, and the
        rules that fired.

        Raises:
            NotSerialisable: it nests too deeply.
        """
        assert self._redactor is not None, "apart() holds only with rules"
        redacted = self._redactor.redact_part(value, level=level)
        return redacted.value, redacted.fired

    def snapshot(self, snapshot: Any, fired: set[str]) -> dict[str, Any]:
        """The fields of a run's input snapshot (a ``RunSnapshot``) that ``run.started``
        records besides its input, as recorded: from version 2 on each is scrubbed on its
        own (code version, prompt template ids and digests, tool schemas, model ids,
        flags, permissions, changes), since a caller may fill any with free text. The
        input is scrubbed in its tagged encoding (:meth:`encoded`); the parent run id is
        a run id, kept as the run's own id is. Replay never compares these fields: it
        reads them back from ``run.started``."""
        fields: dict[str, Any] = {
            "code_version": snapshot.code_version,
            "prompt_templates": dict(snapshot.prompt_templates),
            "tool_schemas": dict(snapshot.tool_schemas),
            "model_ids": list(snapshot.model_ids),
            "flags": dict(snapshot.flags),
            "permissions": list(snapshot.permissions),
            "changes": dict(snapshot.changes),
        }
        if self.version < 2:
            return fields
        scrubbed = {name: self.value(value, fired) for name, value in fields.items()}
        scrubbed["model_ids"] = tuple(scrubbed["model_ids"])
        scrubbed["permissions"] = tuple(scrubbed["permissions"])
        return scrubbed

    def encoded(self, value: Any, fired: set[str], *, path: str) -> Any:
        """``value`` in the tagged encoding that keeps its type, then scrubbed (the tags
        and typed scalars kept: redaction applies to strings).

        Raises:
            NotSerialisable: ``value`` would not come back with its type (names ``path``).
        """
        encoded = encode_value(value, path=path)
        scrubbed = self.value(encoded, fired, path=path)
        return encoded if scrubbed is encoded else restore_tags(encoded, scrubbed)

    def inert(self, value: Any) -> bool:
        """Whether :meth:`value` would hand ``value`` back unchanged without walking it
        (no rules, or nothing in it any rule could fire on: see ``Redactor.inert``)."""
        return self._redactor is None or self._redactor.inert(value)

    def arguments(
        self,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        fired: set[str],
        *,
        path: str = "$",
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Positional and keyword arguments, scrubbed as one value (so ``api_key=`` and a
        path rule like ``kwargs.customer.email`` apply); ``path`` names them in errors.

        Raises:
            NotSerialisable: an argument nests too deeply to walk.
        """
        if not kwargs and self.inert(args):
            return args, {}
        wrapped = {"args": list(args), "kwargs": dict(kwargs)}
        scrubbed = self.value(wrapped, fired, path=path)
        return tuple(scrubbed["args"]), scrubbed["kwargs"]

    def error(self, error: BaseException | None, fired: set[str]) -> BaseException | None:
        """``error`` as it is recorded: its message and arguments scrubbed."""
        info = error_info(error)
        if error is None or info is None or self._redactor is None:
            return error
        scrubbed = {**info, "message": self.value(info["message"], fired)}
        if "args_json" in info:
            args = json.loads(info["args_json"])
            scrubbed["args_json"] = canonical_text(restore_tags(args, self.value(args, fired)))
        if scrubbed == info:
            return error
        return _ScrubbedError(scrubbed)

    @staticmethod
    def mark(crossing: Crossing, fired: set[str]) -> Crossing:
        """``crossing`` noting which rules fired (names only, never values)."""
        if not fired:
            return crossing
        attributes = {**crossing.attributes, FIRED_ATTRIBUTE: ",".join(sorted(fired))}
        return crossing.with_attributes(attributes)
