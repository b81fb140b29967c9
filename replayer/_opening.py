"""Opening and checking what a replay reads: the log's envelopes, their bodies, and the
values and errors inside them.

:func:`guarded` reads the log as the replay's own I/O and stops at a plaintext body in a
run that has a data key. :class:`Bodies` opens each body (from out of line storage when
it was stored there, unsealed with the run's key) and checks it against its own output
digest. :class:`Restorer` rebuilds recorded values with their types and recorded errors
with their classes, with the modules that stand in for recorded ones (a script recorded
as ``__main__``).
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, NoReturn, Protocol

from agent_blackbox.outbox import (
    RecordedError,
    ValueNotRestorable,
    describe_error,
    rebuild_error,
    recorded_value,
)
from agent_blackbox.outbox.contract import (
    FIRED_ATTRIBUTE,
    Ask,
    crossing,
    enter_crossing,
    leave_crossing,
    recorded,
    recorded_input,
)
from agent_blackbox.replayer._divergence import DivergenceKind, Findings, ReplaySetupError
from agent_blackbox.schemas import (
    HMAC_PREFIX,
    NEW_RUNS,
    BlackboxError,
    Digester,
    Envelope,
    EventType,
    KeyUnavailable,
    NotSerialisable,
    PayloadPipeline,
    PlainDigest,
    SealedRunGuard,
    SplitRequest,
    UnknownSchemaVersion,
    digest_bytes,
    is_plaintext,
)

_LLM = EventType.LLM_CALL


class DigestKeys(Protocol):
    """Finds the keyed digest of a tenant whose sensitive runs are digested under a key."""

    def tenant_digest(self, tenant_id: str) -> Digester:
        """The tenant's keyed digest (unwrapping its key, audited)."""
        ...


class BlobReader(Protocol):
    """Reads a body stored out of line by its content address."""

    def read(self, ref: str) -> bytes:
        """The bytes stored under ``ref``."""
        ...


class Handed(Protocol):
    """How far a replay handed events back: the last sequence, and its chain hash."""

    released: int
    chain: str


def run_digest(first: Envelope | None, digests: DigestKeys | None) -> Digester:
    """The digest a run was recorded with, judged by its first envelope: SHA-256, or the
    tenant's keyed digest, over the canonicalisation the envelope names.

    Raises:
        KeyUnavailable: the run is keyed and no ``digests`` were given.
        UnknownCanonicalisation: the envelope names a canonicalisation this release
            does not know.
    """
    if first is None:
        return NEW_RUNS.digest
    canonical = first.canonicalisation
    if not first.output_digest.startswith(HMAC_PREFIX):
        return canonical.digest
    if digests is None:
        raise KeyUnavailable(
            f"run {first.run_id} of tenant {first.tenant_id} was digested under the "
            "tenant's key; replay it with a key store (BLACKBOX_KEK_FILE) and a purpose"
        )
    return digests.tenant_digest(first.tenant_id).under(canonical)


def guarded(events: Iterable[Envelope], findings: Findings) -> Iterator[Envelope]:
    """The log's events as read, in sequence order. A plaintext body in a run that has a
    data key (an event someone else appended) stops the replay for good, with an error
    naming the event: the run cannot be checked, and that is not the code's fault."""
    guard = SealedRunGuard()
    for envelope in _read_as_own(events):
        if guard.key_id is None or is_plaintext(envelope):
            refusal = guard.refusal(envelope)
            if refusal is not None:
                raise findings.stop(ReplaySetupError(str(refusal))) from refusal
        yield envelope


def _read_as_own(events: Iterable[Envelope]) -> Iterator[Envelope]:
    """``events``, each read as the replay's own I/O (an archive in object storage is
    read over the network while the agent's code runs), not as the agent's."""
    iterator = iter(events)
    while True:
        inside = enter_crossing()
        try:
            envelope = next(iterator, None)
        finally:
            leave_crossing(inside)
        if envelope is None:
            return
        yield envelope


class Bodies:
    """Opens recorded bodies and checks each against its envelope's output digest.

    Args:
        pipeline: opens payloads (the sealing adapter for encrypted runs).
        blobs: reads bodies stored out of line.
        findings: where divergences and setup errors go.
        handed: how far the replay handed events back (an unreadable body of the next
            event is checked against the chain: tampering, not a newer release).
    """

    def __init__(
        self,
        pipeline: PayloadPipeline | None,
        blobs: BlobReader | None,
        findings: Findings,
        handed: Handed,
    ) -> None:
        self._pipeline = pipeline or PayloadPipeline()
        self._blobs = blobs
        self._findings = findings
        self._handed = handed
        self.digest: Digester = NEW_RUNS.digest
        """The run's digest (known once its first envelope was read)."""
        self.requests: Callable[[Ask], SplitRequest | None] | None = None
        """The parts of an LLM call's request as the code made it (the run's
        ``Contract.request_split``, once there is one)."""

    def open(self, envelope: Envelope, ask: Ask | None = None) -> tuple[dict[str, Any], Any]:
        """The body of ``envelope`` and the output it recorded, checked against its
        output digest (a mismatch is noted as ``tampered_output``).

        ``ask``: what the code asked, when it asked for this event. An llm.call whose
        input digest it matches gives the reader its request's parts (``requests``):
        a recorded request made of the same texts is taken as it is, not rebuilt, and
        its body is handed back as stored (replay hands the code the response; the code
        holds the request).

        Raises:
            ReplaySetupError: the body cannot be read through no fault of the log.
            UnknownSchemaVersion: the body is of a version this release cannot read.
            ReplayDivergence: the body does not open (``tampered_output``), or the
                envelope naming an unknown version breaks the chain.
        """
        data = None if envelope.payload_ref is None else self._blob(envelope)
        request = None
        if (
            ask is not None
            and self.requests is not None
            and envelope.event_type == _LLM
            and ask.input_digest == envelope.input_digest
        ):
            request = self.requests(ask)
        try:
            body = self._pipeline.unpack(envelope, data, request=request)
        except BlackboxError as exc:
            self._unopened(envelope, exc)
        output, material = recorded(envelope.event_type, body)
        fired = envelope.attributes.get(FIRED_ATTRIBUTE)
        if fired and output is not None:
            self._findings.redacted[envelope.sequence] = fired
        if envelope.event_type == _LLM and _reduced(body):
            note = _reduced_note(envelope, body["body_truncated"])
            self._findings.limitations.append((envelope.sequence, note))
            return body, output  # the whole response is gone: its digest cannot be checked
        actual = None
        if material is not None and type(self.digest) is PlainDigest:
            actual = digest_bytes(material)
        if actual != envelope.output_digest:
            # No fast path, or the body's texts are not canonical: a result or hits
            # stored in their own key order (bodies since ordered JSON). The value is
            # what the digest was taken of.
            actual = self._value_digest(output)
        if actual != envelope.output_digest:
            self._findings.diverge(
                DivergenceKind.TAMPERED_OUTPUT,
                envelope.sequence,
                expected=(envelope.event_type, envelope.output_digest, None),
                actual=(envelope.event_type, actual, None),
            )
        return body, output

    def _blob(self, envelope: Envelope) -> bytes:
        """The body of ``envelope`` stored out of line.

        Raises:
            ReplaySetupError: no blob reader was given.
        """
        assert envelope.payload_ref is not None
        if self._blobs is None:
            raise self._findings.setup(
                ReplaySetupError(
                    f"run {envelope.run_id} sequence {envelope.sequence}: the body is "
                    f"stored out of line ({envelope.payload_ref}) and no blob reader was "
                    "given; pass blobs= (PostgresBlobs on the write side's engine, or the "
                    "memory recorder that recorded the run); a memory recorder's run "
                    "replays with agent_blackbox.testing.replay(recorder, agent)"
                )
            )
        try:
            with crossing():  # the replay's own reading, not the agent's I/O
                return self._blobs.read(envelope.payload_ref)
        except BlackboxError as exc:
            # Not the code's doing: the login, the database or the store. Raised into
            # the code it would otherwise read as the code's own failure.
            raise self._findings.setup(
                ReplaySetupError(
                    f"run {envelope.run_id} sequence {envelope.sequence}: the body stored "
                    f"out of line cannot be read: {exc}"
                )
            ) from exc

    def _unopened(self, envelope: Envelope, exc: BlackboxError) -> NoReturn:
        """Why the body of ``envelope`` does not open, raised: not the log's fault (a
        newer release's version, a missing key, no key store), or tampering."""
        findings = self._findings
        if isinstance(exc, UnknownSchemaVersion):
            self._check_link(envelope)
            # An intact envelope of a version this release cannot read is not tampering:
            # it was written by a newer release (or needs a migrator). Stop.
            raise findings.stop(exc) from None
        if isinstance(exc, KeyUnavailable):
            # Not the log's fault: without the key nothing can be said of the bytes.
            raise findings.setup(exc) from None
        if envelope.key_id is not None and not self._pipeline.seals:
            raise findings.setup(
                ReplaySetupError(
                    f"run {envelope.run_id} is encrypted (sequence {envelope.sequence} "
                    f"is sealed under data key {envelope.key_id}) and the replay has no "
                    "key store; set BLACKBOX_KEK_FILE (or BLACKBOX_KEK) and a purpose"
                )
            ) from None
        findings.diverge(
            DivergenceKind.TAMPERED_OUTPUT,
            envelope.sequence,
            expected=(envelope.event_type, envelope.output_digest, None),
            actual=(envelope.event_type, None, None),
            detail=f"the body does not open: {type(exc).__name__}",
            fatal=True,  # there is no recorded output to go on with
        )
        raise AssertionError("unreachable") from exc  # pragma: no cover

    def _check_link(self, envelope: Envelope) -> None:
        """An envelope naming a version this release cannot read, next to be handed
        back: a broken chain says it was altered (its version among what changed)."""
        handed = self._handed
        if envelope.sequence != handed.released + 1:
            return
        expected_chain = envelope.expected_chain_hash(handed.chain)
        if envelope.chain_hash != expected_chain:
            self._findings.diverge(
                DivergenceKind.BROKEN_CHAIN,
                envelope.sequence,
                expected=(envelope.event_type, expected_chain, None),
                actual=(envelope.event_type, envelope.chain_hash, None),
                detail=f"the altered envelope names body version {envelope.body_version}",
                fatal=True,
            )

    def _value_digest(self, output: Any) -> str | None:
        """The digest of an output read from a body; None when canonical JSON refuses
        it (NaN, an infinity, nested too deep): the recorder digested every output it
        wrote, so such a body is not the one recorded."""
        try:
            return self.digest(output)
        except NotSerialisable:
            return None

    def recorded_input(self, envelope: Envelope) -> Any:
        """The input ``envelope`` recorded (for what changed in a call); None when its
        body cannot be read or says nothing more than its type."""
        body = self.recorded_body(envelope)
        return None if body is None else recorded_input(envelope.event_type, body)

    def recorded_body(self, envelope: Envelope) -> dict[str, Any] | None:
        """The body of ``envelope`` for a divergence's detail, unchecked and noting
        nothing; None when it cannot be read."""
        try:
            data = None
            if envelope.payload_ref is not None:
                if self._blobs is None:
                    return None
                data = self._blobs.read(envelope.payload_ref)
            return self._pipeline.unpack(envelope, data)
        except BlackboxError:
            return None


def _reduced(body: Mapping[str, Any]) -> bool:
    """Whether an ``llm.call`` body was recorded truncated without its response."""
    truncated = body.get("body_truncated")
    return (
        truncated is not None
        and body["raw_response_json"] is None
        and truncated["response_sha256"] is not None
    )


def _reduced_note(envelope: Envelope, truncated: Mapping[str, Any]) -> str:
    return (
        f"sequence {envelope.sequence} ({envelope.event_type}) was recorded truncated "
        f"(body {truncated['body_bytes']} bytes, over the ceiling of "
        f"{truncated['ceiling_bytes']}): its response was handed back reduced (long texts "
        "cut short) and not checked against its output digest"
    )


class Restorer:
    """Rebuilds what bodies recorded: values with their types, errors with their classes,
    in the modules that stand in for recorded ones (judged by the agent's ``entry``).

    Args:
        findings: where a value this process cannot rebuild is kept as a setup error.
        entry: the agent's entry point.
    """

    def __init__(self, findings: Findings, entry: Callable[..., Any] | None) -> None:
        self._findings = findings
        self.aliases = _stand_ins(entry)
        """Which imported module stands in for a module the recording names."""

    def value(self, value: Any, codec: str | None) -> Any:
        """A recorded value with its type again (plain JSON, recorded without a codec,
        is its own value).

        Raises:
            ReplaySetupError: this process lacks a class the value needs.
        """
        if codec is None:
            return value
        try:
            return recorded_value(value, codec, aliases=self.aliases)
        except ValueNotRestorable as exc:  # this process lacks a class: not the code's fault
            error = ReplaySetupError(f"run {self._findings.run_id}: {exc}")
            raise self._findings.setup(error) from exc

    def error(self, info: Mapping[str, str]) -> BaseException:
        """The exception a recorded error stands for."""
        return rebuild_error(info, aliases=self.aliases)

    def as_recorded(
        self, error: BaseException | None, recorded: Mapping[str, str] | None
    ) -> BaseException | None:
        """``error`` as the recording named its class, when the module it named stands in
        for the class's own (a script's ``__main__`` replayed by module): the same class,
        under its recorded name. Otherwise ``error`` itself."""
        if error is None or recorded is None or hasattr(error, "recorded_error"):
            return error
        info = describe_error(error)
        module = recorded.get("module")
        if (
            module is None
            or self.aliases.get(module) != info["module"]
            or recorded["type"] != info["type"]
        ):
            return error
        named = RecordedError(info["type"], info["message"], module=module)
        named.recorded_error = {**info, "module": module}
        return named


def _stand_ins(entry: Callable[..., Any] | None) -> dict[str, str]:
    """Which imported module stands in for a module a recording names, judged by the
    module of the agent's ``entry``: a script recorded as ``python agent.py`` named its
    classes ``__main__.X``, and replayed by module they are the entry module's; an entry
    replayed in a script (``__main__``) has the classes recorded under the script's
    module name (``agent`` for ``agent.py`` or ``python -m agent``). Nothing is imported.
    """
    target = inspect.unwrap(entry) if entry is not None else None
    while isinstance(target, functools.partial):
        target = inspect.unwrap(target.func)
    module = getattr(target, "__module__", None)
    if not isinstance(module, str):
        return {}
    if module != "__main__":
        return {"__main__": module}
    script = sys.modules.get("__main__")
    spec = getattr(script, "__spec__", None)
    name = spec.name if spec is not None else Path(getattr(script, "__file__", "") or "").stem
    return {name: "__main__"} if name and name != "__main__" else {}
