"""The payload pipeline: body → Avro → compress → seal, and open → inflate → Avro →
body (with an LLM request stored by reference made whole again).

One place does each step. Compression, and how ``payload_encoding`` names it, is
:mod:`~agent_blackbox.schemas._compression`'s; requests stored by reference are
:mod:`~agent_blackbox.schemas._request_prefix`'s. Sealing is a port (:class:`Sealer`):
the plaintext adapter is for development, the envelope-encryption adapter plugs in
behind the same two methods. The additional authenticated data binds a payload to its
run, sequence, event id, event type, body version, tenant and data key, so a sealed
body cannot be moved to another event, relabelled, or passed off under another tenant
or key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from agent_blackbox.schemas._canonical import canonical_json
from agent_blackbox.schemas._codec import BodyCodec
from agent_blackbox.schemas._compression import (
    Compressor,
    Inflater,
    split_encoding,
    with_compression,
)
from agent_blackbox.schemas._envelope import Envelope
from agent_blackbox.schemas._errors import BlackboxError, UndecodableMessage
from agent_blackbox.schemas._migrations import BodyReader
from agent_blackbox.schemas._padding import PADDING, pad
from agent_blackbox.schemas._request_prefix import (
    RequestMemory,
    RequestPrefixMissing,
    SplitRequest,
)
from agent_blackbox.schemas.event_types import EventType

DEFAULT_MAX_BODY_BYTES = 256 * 1024 * 1024
"""The largest body a pipeline inflates (``Settings.max_blob_bytes``' default)."""

PLAIN_ENCODING = "avro"

# Names what the additional authenticated data is, so it can never be read as another
# list of the same values (the first sealing AAD had no label and three items).
_AAD_LABEL = "blackbox.payload-aad.2"


@dataclass(frozen=True, slots=True)
class DataKey:
    """A run's data key in the clear, as the recorder holds it while the run records.

    Never printed: its repr shows the key id only.
    """

    key_id: str
    secret: bytes = field(repr=False)


@dataclass(frozen=True, slots=True)
class PayloadContext:
    """Where a payload belongs; sealing binds it there.

    ``data_key`` is the run's data key when the run is encrypted: the recorder creates
    it with the run and hands it to the sealer with every payload it seals.
    ``event_type`` and ``body_version`` are those of the body: :class:`PayloadPipeline`
    fills them in from what it packs or from the envelope it opens.
    """

    run_id: str
    sequence: int
    event_id: str
    tenant_id: str
    data_key: DataKey | None = field(default=None, repr=False, compare=False)
    event_type: str = ""
    body_version: int = 0

    def aad(self, key_id: str) -> bytes:
        """The additional authenticated data of a payload sealed under the data key
        ``key_id``: it binds run, sequence, event id, event type, body version, tenant
        and key id."""
        return canonical_json(
            [
                _AAD_LABEL,
                self.run_id,
                self.sequence,
                self.event_id,
                self.event_type,
                self.body_version,
                self.tenant_id,
                key_id,
            ]
        )

    def legacy_aad(self) -> bytes:
        """The additional authenticated data of payloads sealed by earlier releases (run,
        sequence and event id only): for opening those, never for sealing."""
        return canonical_json([self.run_id, self.sequence, self.event_id])


@dataclass(frozen=True, slots=True)
class Sealed:
    """Payload bytes as stored, with what is needed to open them again."""

    data: bytes
    key_id: str | None
    encoding: str


class Sealer(Protocol):
    """Seals and opens payload bytes."""

    def seal(self, plaintext: bytes, context: PayloadContext) -> Sealed:
        """Seal ``plaintext`` for the event ``context`` names."""
        ...

    def open(self, sealed: Sealed, context: PayloadContext) -> bytes:
        """Return the plaintext of ``sealed``, or raise naming run and key id."""
        ...


class PlaintextSealer:
    """Development mode: payloads are stored as plain Avro."""

    def seal(self, plaintext: bytes, context: PayloadContext) -> Sealed:
        return Sealed(data=plaintext, key_id=None, encoding=PLAIN_ENCODING)

    def open(self, sealed: Sealed, context: PayloadContext) -> bytes:
        if sealed.encoding != PLAIN_ENCODING or sealed.key_id is not None:
            raise UndecodableMessage(
                f"run {context.run_id} sequence {context.sequence}: payload is sealed "
                f"({sealed.encoding}, key {sealed.key_id}) and no key provider is configured"
            )
        return sealed.data


class PayloadPipeline:
    """Turns bodies into stored payload bytes and back.

    Args:
        bodies: the body codec.
        sealer: seals and opens payloads (plaintext when None).
        reader: decodes and migrates bodies.
        compression: what :meth:`pack` compresses with (``zstd``, ``zstd-nodict``,
            ``deflate``; ``none``, this class's default, stores Avro as it is; the
            recorders build their pipeline from ``Settings.payload_compression``, zstd
            unless told). Opening reads every compression whatever this says. A compressed
            body that is sealed is padded to a size bucket (``schemas._padding``).
        tenant_compression: the compression of the tenants it names, in place of
            ``compression`` (``Settings.tenant_compressions``: ``none`` for a tenant
            whose bodies mix secrets with text others control).
        max_body_bytes: the largest body :meth:`unpack` inflates a payload to.

    A pipeline remembers the latest LLM requests of the runs it opens, to rebuild those
    stored by reference: one pipeline per reader thread.
    """

    def __init__(
        self,
        bodies: BodyCodec | None = None,
        sealer: Sealer | None = None,
        *,
        reader: BodyReader | None = None,
        compression: str = "none",
        tenant_compression: Mapping[str, str] | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ) -> None:
        self._bodies = bodies or BodyCodec()
        self._sealer = sealer or PlaintextSealer()
        # Opening a plain payload with the plaintext sealer is the identity: skip building
        # the context and the sealed value for each event (replay opens every one).
        self._plaintext = type(self._sealer) is PlaintextSealer
        # Reading migrates: old body versions come out at the newest (or asked) version.
        self._reader = reader or BodyReader(self._bodies)
        self._compressor = Compressor(compression)
        self._tenant_compressors = {
            tenant: Compressor(chosen) for tenant, chosen in (tenant_compression or {}).items()
        }
        self._inflater = Inflater(max_body_bytes)
        self._requests = RequestMemory()

    @property
    def seals(self) -> bool:
        """Whether this pipeline can seal and open sealed payloads (has a key provider)."""
        return not self._plaintext

    def pack(
        self, event_type: str, version: int, body: Mapping[str, Any], context: PayloadContext
    ) -> Sealed:
        """Encode ``body`` as Avro and seal it for ``context`` (whose event type and body
        version become ``event_type`` and ``version``)."""
        if context.event_type != event_type or context.body_version != version:
            context = replace(context, event_type=event_type, body_version=version)
        plain = self._bodies.encode(event_type, version, body)
        compressor = self._tenant_compressors.get(context.tenant_id, self._compressor)
        packed = compressor.compress(plain)
        if packed is None or compressor.scheme is None:
            return self._sealer.seal(plain, context)
        scheme = compressor.scheme
        if not self._plaintext:
            # Sealed: its size is all a reader without the key learns, so it is padded
            # to a bucket (see schemas._padding); kept unpadded only if that is no gain.
            packed, scheme = pad(packed), f"{scheme}+{PADDING}"
            if len(packed) >= len(plain):
                return self._sealer.seal(plain, context)
        sealed = self._sealer.seal(packed, context)
        return replace(sealed, encoding=with_compression(sealed.encoding, scheme))

    def unpack(
        self,
        envelope: Envelope,
        data: bytes | None = None,
        *,
        version: int | None = None,
        request: SplitRequest | None = None,
    ) -> dict[str, Any]:
        """Open the payload of ``envelope``, decode its body and bring it to ``version``.

        ``data`` supplies the bytes of a body stored out of line (``payload_ref``).
        ``version`` is the body version wanted, the newest when None; older bodies go
        through Avro resolution and the migrators (see :class:`BodyReader`).
        ``request``: an llm.call's request the caller holds that may be the recorded one
        (see :meth:`RequestMemory.read`); when it is, a body stored by reference is
        handed back as stored, not with the whole request written out again.

        Raises:
            UnknownSchemaVersion: the envelope's body version has no reader path.
            UndecodableMessage: the payload does not open or decode.
        """
        stored = envelope.payload if data is None else data
        if stored is None:
            raise UndecodableMessage(
                f"run {envelope.run_id} sequence {envelope.sequence}: the body is stored "
                f"out of line as {envelope.payload_ref}; fetch it from the blob store"
            )
        kind = envelope.event_type
        try:
            body = self._reader.read(
                kind, envelope.body_version, self._opened(envelope, stored), to=version
            )
            if kind != EventType.LLM_CALL:
                return body
            return self._requests.read(
                envelope.run_id, envelope.sequence, body, envelope.canonicalisation, known=request
            )
        except RequestPrefixMissing:
            raise  # the reader may open what it lacks and try again
        except BlackboxError as exc:
            if kind == EventType.LLM_CALL:  # a request naming this call cannot be rebuilt
                self._requests.lost(envelope.run_id, envelope.sequence, type(exc).__name__)
            raise

    def unpack_as_stored(self, envelope: Envelope) -> dict[str, Any]:
        """:meth:`unpack` without rebuilding a request stored by reference: an
        ``llm.call``'s ``raw_request_json`` then holds what its request added to the
        earlier one it names (``request_prefix``), which is what a reader that takes each
        call once (a full-text indexer) wants, whatever it read before.

        Raises:
            UnknownSchemaVersion, UndecodableMessage: as :meth:`unpack` (a body stored out
                of line among them).
        """
        if envelope.payload is None:
            raise UndecodableMessage(
                f"run {envelope.run_id} sequence {envelope.sequence}: the body is stored "
                f"out of line as {envelope.payload_ref}; fetch it from the blob store"
            )
        opened = self._opened(envelope, envelope.payload)
        return self._reader.read(envelope.event_type, envelope.body_version, opened, to=None)

    def unpack_in_run(
        self, envelope: Envelope, earlier: Mapping[int, Envelope], data: bytes | None = None
    ) -> dict[str, Any]:
        """:meth:`unpack` for a reader that starts in the middle of a run: the earlier
        llm.calls a request stored by reference needs are opened first, from ``earlier``
        (the run's events before ``envelope``, by sequence).

        Raises:
            RequestPrefixMissing: a needed event is not in ``earlier``.
            UndecodableMessage, UnknownSchemaVersion: as :meth:`unpack`.
        """
        pending = [envelope]
        while True:
            top = pending[-1]
            try:
                body = self.unpack(top, data if top is envelope else None)
            except RequestPrefixMissing as missing:
                needed = earlier.get(missing.needed)
                if needed is None or needed in pending:
                    raise
                pending.append(needed)
                continue
            pending.pop()
            if not pending:
                return body

    def _opened(self, envelope: Envelope, stored: bytes) -> bytes:
        """The Avro bytes of ``stored``: opened by the sealer, then inflated."""
        compression, sealed_as = split_encoding(envelope.payload_encoding)
        if self._plaintext and envelope.key_id is None and sealed_as == PLAIN_ENCODING:
            plaintext = stored
        else:
            context = PayloadContext(
                run_id=envelope.run_id,
                sequence=envelope.sequence,
                event_id=envelope.event_id,
                tenant_id=envelope.tenant_id,
                event_type=envelope.event_type,
                body_version=envelope.body_version,
            )
            sealed = Sealed(data=stored, key_id=envelope.key_id, encoding=sealed_as)
            plaintext = self._sealer.open(sealed, context)
        if compression is None:
            return plaintext
        where = f"run {envelope.run_id} sequence {envelope.sequence}"
        return self._inflater.inflate(compression, plaintext, where)
