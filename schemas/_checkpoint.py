"""Signed checkpoints: a signer's Ed25519 signature over a run's chain head.

The hash chain shows that a log was changed, but anyone who can write the log can also
recompute the chain. A checkpoint closes that gap: at the end of a run a signer that
agents do not control signs ``(run_id, tenant_id, last_sequence, chain_head)``, and a
verifier holding only public keys can later prove the log is the one that was signed.

Signatures are over :meth:`Checkpoint.message`, canonical JSON with a ``purpose``
field, so a checkpoint signature can never be replayed as a signature over anything
else. Verifiers hold keys by ``signer_key_id`` so signing keys can rotate: old
checkpoints keep verifying as long as the verifier keeps the old public key.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeAlias

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
    load_pem_private_key,
    load_pem_public_key,
)

from agent_blackbox.schemas._canonical import canonical_json
from agent_blackbox.schemas._errors import BlackboxError
from agent_blackbox.schemas._keyfile import OWNER_ONLY_FORBIDDEN, read_checked_file

CHECKPOINT_PURPOSE = "agent-blackbox checkpoint v1"
"""Bound into every signed message, so the signature means "this is a checkpoint".
Checkpoints of this first form were signed only when a run had finished."""

CHECKPOINT_PURPOSE_V2 = "agent-blackbox checkpoint v2"
"""The purpose of checkpoints that say whether the run had finished (mid-run checkpoints
cover a running or crashed run's head so far)."""

SIGNING_KEY_FILE_ENV = "BLACKBOX_SIGNING_KEY_FILE"
"""Environment variable naming the signer's PEM private key file."""

SIGNING_KEY_ID_ENV = "BLACKBOX_SIGNING_KEY_ID"
"""Optional environment variable naming the signer's key id (else its fingerprint)."""

PUBLIC_KEYS_ENV = "BLACKBOX_SIGNING_PUBLIC_KEYS"
"""Optional environment variable: the signers' public key PEM files, comma-separated."""

_SIGNATURE_BYTES = 64
_KEY_HINT = (
    "give a PEM file holding an unencrypted Ed25519 key "
    "(e.g. `openssl genpkey -algorithm ed25519 -out signing-key.pem`)"
)

StrPath: TypeAlias = str | os.PathLike[str]


class ForgedCheckpoint(BlackboxError):
    """A checkpoint that does not prove anything: its key id is unknown, its signature
    does not verify, or it is malformed. The run's log must be treated as unverified."""

    def __init__(self, run_id: str, signer_key_id: str, reason: str) -> None:
        self.run_id = run_id
        self.signer_key_id = signer_key_id
        self.reason = reason
        super().__init__(
            f"checkpoint of run {run_id!r} (signer key {signer_key_id!r}) is not genuine: "
            f"{reason}; do not trust the run's log on its strength (if the signing key was "
            "rotated, give the verifier the old public key too)"
        )


class SigningKeyError(BlackboxError):
    """A signing or verifying key cannot be had: the file is missing, unreadable, not
    PEM, encrypted, or holds a key other than Ed25519."""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A signer's statement that run ``run_id`` had ``last_sequence`` events ending in
    ``chain_head`` (the chain hash of event ``last_sequence``)."""

    run_id: str
    tenant_id: str
    last_sequence: int
    chain_head: str
    signer_key_id: str
    signature: bytes = b""
    finished: bool | None = None
    """Whether the run had ended when its head was signed: False for a mid-run
    checkpoint (a running, crashed or abandoned run, covered up to ``last_sequence``).
    None on checkpoints of the first form, which were signed only at a run's end."""

    @property
    def final(self) -> bool:
        """Whether the run had ended when it was signed (first-form checkpoints had)."""
        return self.finished is not False

    def message(self) -> bytes:
        """The bytes the signature is over: canonical JSON of every field but the
        signature, plus ``purpose`` so the signature cannot stand for another message."""
        fields: dict[str, Any] = {
            "purpose": CHECKPOINT_PURPOSE,
            "run_id": self.run_id,
            "tenant_id": self.tenant_id,
            "last_sequence": self.last_sequence,
            "chain_head": self.chain_head,
            "signer_key_id": self.signer_key_id,
        }
        if self.finished is not None:
            fields["purpose"] = CHECKPOINT_PURPOSE_V2
            fields["finished"] = self.finished
        return canonical_json(fields)

    def to_record(self) -> dict[str, Any]:
        """The checkpoint as JSON-ready values (the signature in standard base64), for a
        table row or a topic message."""
        return {
            "run_id": self.run_id,
            "tenant_id": self.tenant_id,
            "last_sequence": self.last_sequence,
            "chain_head": self.chain_head,
            "signer_key_id": self.signer_key_id,
            "signature": base64.b64encode(self.signature).decode("ascii"),
            "finished": self.finished,
        }

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Checkpoint:
        """Read back what :meth:`to_record` wrote.

        Raises:
            ForgedCheckpoint: a field is missing or of the wrong type, or the signature
                is not base64. A checkpoint that cannot be read vouches for nothing.
        """
        run_id = record.get("run_id")
        key_id = record.get("signer_key_id")
        run_name = run_id if isinstance(run_id, str) else "<unknown>"
        key_name = key_id if isinstance(key_id, str) else "<unknown>"
        for name in ("run_id", "tenant_id", "chain_head", "signer_key_id", "signature"):
            if not isinstance(record.get(name), str):
                raise ForgedCheckpoint(run_name, key_name, f"record field {name!r} is not a str")
        sequence = record.get("last_sequence")
        if type(sequence) is not int:
            raise ForgedCheckpoint(run_name, key_name, "record field 'last_sequence' is not an int")
        finished = record.get("finished")
        if finished is not None and type(finished) is not bool:
            raise ForgedCheckpoint(run_name, key_name, "record field 'finished' is not a bool")
        try:
            signature = base64.b64decode(record["signature"], validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ForgedCheckpoint(run_name, key_name, "signature is not base64") from exc
        return cls(
            run_id=record["run_id"],
            tenant_id=record["tenant_id"],
            last_sequence=sequence,
            chain_head=record["chain_head"],
            signer_key_id=record["signer_key_id"],
            signature=signature,
            finished=finished,
        )


class CheckpointSigner:
    """Signs checkpoints with an Ed25519 private key that agents never get.

    Args:
        private_key: the signing key.
        key_id: the name verifiers know its public key by.
    """

    __slots__ = ("_key", "_key_id")

    def __init__(self, private_key: Ed25519PrivateKey, *, key_id: str) -> None:
        if not isinstance(private_key, Ed25519PrivateKey):
            raise TypeError(
                f"a checkpoint signer needs an Ed25519 private key, not {private_key!r}"
            )
        if not key_id:
            raise ValueError("a checkpoint signer needs a non-empty key_id")
        self._key = private_key
        self._key_id = key_id

    @classmethod
    def from_pem_file(cls, path: StrPath, *, key_id: str | None = None) -> CheckpointSigner:
        """The signer whose unencrypted PEM (PKCS#8) private key is in ``path``;
        ``key_id`` defaults to :func:`key_fingerprint` of its public key.

        Raises:
            SigningKeyError: naming the file: missing, unreadable, not a PEM private
                key, encrypted, or not Ed25519.
        """
        data = _read_private_key_file(path)
        try:
            key = load_pem_private_key(data, password=None)
        except TypeError as exc:  # cryptography's word for "encrypted, no password given"
            raise SigningKeyError(
                f"signing key file {os.fspath(path)} is encrypted; {_KEY_HINT}"
            ) from exc
        except (ValueError, UnsupportedAlgorithm) as exc:
            raise SigningKeyError(
                f"signing key file {os.fspath(path)} does not hold a PEM private key; {_KEY_HINT}"
            ) from exc
        if not isinstance(key, Ed25519PrivateKey):
            raise SigningKeyError(
                f"signing key file {os.fspath(path)} holds a {type(key).__name__}, not an "
                f"Ed25519 key; {_KEY_HINT}"
            )
        return cls(key, key_id=key_id or key_fingerprint(key.public_key()))

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, key_id: str | None = None
    ) -> CheckpointSigner:
        """The signer whose key file ``BLACKBOX_SIGNING_KEY_FILE`` names; the key id is
        ``key_id``, else ``BLACKBOX_SIGNING_KEY_ID``, else the key's fingerprint.

        Raises:
            SigningKeyError: the variable is unset, or the file is not a usable key.
        """
        env = os.environ if environ is None else environ
        path = env.get(SIGNING_KEY_FILE_ENV)
        if not path:
            raise SigningKeyError(
                f"{SIGNING_KEY_FILE_ENV} is not set; point it at the checkpoint signer's "
                f"private key file ({_KEY_HINT})"
            )
        return cls.from_pem_file(path, key_id=key_id or env.get(SIGNING_KEY_ID_ENV) or None)

    @classmethod
    def generate(cls, *, key_id: str | None = None) -> CheckpointSigner:
        """A signer with a fresh key (tests, demos, first-time setup)."""
        key = Ed25519PrivateKey.generate()
        return cls(key, key_id=key_id or key_fingerprint(key.public_key()))

    @property
    def key_id(self) -> str:
        """The name verifiers know this signer's public key by."""
        return self._key_id

    @property
    def public_key(self) -> Ed25519PublicKey:
        """The public half, for a :class:`CheckpointVerifier`."""
        return self._key.public_key()

    def private_key_pem(self) -> bytes:
        """The private key as unencrypted PKCS#8 PEM, to store where only the signer reads."""
        return self._key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())

    def public_key_pem(self) -> bytes:
        """The public key as PEM (SubjectPublicKeyInfo), to hand to verifiers."""
        return self._key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)

    def sign(
        self,
        *,
        run_id: str,
        tenant_id: str,
        last_sequence: int,
        chain_head: str,
        finished: bool | None = None,
    ) -> Checkpoint:
        """A signed checkpoint of run ``run_id`` at event ``last_sequence``, whose chain
        hash is ``chain_head``; ``finished`` says whether the run had ended (None signs
        the first form, which means it had).

        Raises:
            ValueError: ``last_sequence`` is below 1 or ``chain_head`` is not 64 hex
                digits (the signer must sign only a head it has verified).
        """
        if type(last_sequence) is not int or last_sequence < 1:
            raise ValueError(f"last_sequence must be an int of at least 1, not {last_sequence!r}")
        if len(chain_head) != 64 or not _is_hex(chain_head):
            raise ValueError(f"chain_head must be 64 hex digits, not {chain_head!r}")
        unsigned = Checkpoint(
            run_id=run_id,
            tenant_id=tenant_id,
            last_sequence=last_sequence,
            chain_head=chain_head,
            signer_key_id=self._key_id,
            finished=finished,
        )
        return replace(unsigned, signature=self._key.sign(unsigned.message()))

    def sign_statement(self, statement: Mapping[str, Any]) -> bytes:
        """Sign a statement other than a checkpoint (a deletion note): the canonical JSON
        of ``statement``, which names its own ``purpose``.

        Raises:
            ValueError: ``statement`` has no string ``purpose``, or claims the
                checkpoint's (a checkpoint is only ever signed by :meth:`sign`).
        """
        _check_purpose(statement)
        return self._key.sign(canonical_json(dict(statement)))

    def __repr__(self) -> str:
        return f"CheckpointSigner(key_id={self._key_id!r}, <private key>)"


class CheckpointVerifier:
    """Verifies checkpoints against the public keys of the signers, by key id.

    Args:
        public_keys: every key id a checkpoint may name and its public key; keep
            retired keys here so older checkpoints still verify.
    """

    __slots__ = ("_keys",)

    def __init__(self, public_keys: Mapping[str, Ed25519PublicKey]) -> None:
        for key_id, key in public_keys.items():
            if not isinstance(key, Ed25519PublicKey):
                raise TypeError(f"key {key_id!r} is not an Ed25519 public key")
        self._keys = dict(public_keys)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> CheckpointVerifier | None:
        """The signers' public keys: the PEM files in ``BLACKBOX_SIGNING_PUBLIC_KEYS``
        (comma-separated), else the public half of ``BLACKBOX_SIGNING_KEY_FILE``'s key;
        None when neither is set.

        Raises:
            SigningKeyError: a named file is not a usable key.
        """
        env = os.environ if environ is None else environ
        if files := env.get(PUBLIC_KEYS_ENV):
            return cls.from_pem_files([f.strip() for f in files.split(",") if f.strip()])
        if env.get(SIGNING_KEY_FILE_ENV):
            signer = CheckpointSigner.from_env(env)
            return cls({signer.key_id: signer.public_key})
        return None

    @classmethod
    def from_pem_files(cls, files: Mapping[str, StrPath] | Iterable[StrPath]) -> CheckpointVerifier:
        """A verifier from PEM public key files: a mapping of key id to file, or just
        files, each then known by :func:`key_fingerprint` of its key.

        Raises:
            SigningKeyError: naming the file that is missing, unreadable, not a PEM
                public key, or not Ed25519.
        """
        named = (
            list(files.items()) if isinstance(files, Mapping) else [(None, path) for path in files]
        )
        keys: dict[str, Ed25519PublicKey] = {}
        for key_id, path in named:
            key = _load_public_key(path)
            keys[key_id or key_fingerprint(key)] = key
        return cls(keys)

    @property
    def key_ids(self) -> frozenset[str]:
        """The key ids this verifier knows."""
        return frozenset(self._keys)

    def verify(self, checkpoint: Checkpoint) -> None:
        """Return if ``checkpoint`` carries a genuine signature of a known signer.

        This checks the signature only; that the signed head is the log's head is
        :func:`agent_blackbox.replayer.verify_run`'s job.

        Raises:
            ForgedCheckpoint: naming run and key id: the key id is unknown, the
                signature is malformed, or it does not verify.
        """
        key = self._keys.get(checkpoint.signer_key_id)
        if key is None:
            known = ", ".join(sorted(self._keys)) or "none"
            raise ForgedCheckpoint(
                checkpoint.run_id,
                checkpoint.signer_key_id,
                f"no public key is known for this key id (known: {known})",
            )
        if len(checkpoint.signature) != _SIGNATURE_BYTES:
            raise ForgedCheckpoint(
                checkpoint.run_id,
                checkpoint.signer_key_id,
                f"the signature is {len(checkpoint.signature)} bytes, an Ed25519 signature "
                f"is {_SIGNATURE_BYTES}",
            )
        try:
            message = checkpoint.message()
        except BlackboxError as exc:  # a field off its type (NotSerialisable)
            raise ForgedCheckpoint(
                checkpoint.run_id, checkpoint.signer_key_id, f"the checkpoint is malformed: {exc}"
            ) from exc
        try:
            key.verify(checkpoint.signature, message)
        except InvalidSignature as exc:
            raise ForgedCheckpoint(
                checkpoint.run_id,
                checkpoint.signer_key_id,
                "the signature does not verify (the run, tenant, sequence or head differ "
                "from what was signed, or another key signed it)",
            ) from exc

    def statement_problem(
        self, statement: Mapping[str, Any], *, signer_key_id: str, signature: bytes
    ) -> str | None:
        """Why ``signature`` is not a known signer's signature over ``statement`` (see
        :meth:`CheckpointSigner.sign_statement`); None when it is."""
        key = self._keys.get(signer_key_id)
        if key is None:
            known = ", ".join(sorted(self._keys)) or "none"
            return f"no public key is known for signer key id {signer_key_id!r} (known: {known})"
        try:
            _check_purpose(statement)
            key.verify(signature, canonical_json(dict(statement)))
        except (ValueError, BlackboxError) as exc:
            return f"the statement is malformed: {exc}"
        except InvalidSignature:
            return f"the signature of key {signer_key_id!r} does not verify"
        return None

    def __repr__(self) -> str:
        return f"CheckpointVerifier(key_ids={sorted(self._keys)!r})"


def key_fingerprint(public_key: Ed25519PublicKey) -> str:
    """A short, stable name for a public key: ``ed25519:`` and the first 16 hex digits
    of the SHA-256 of its raw 32 bytes."""
    raw = public_key.public_bytes(Encoding.Raw, PublicFormat.Raw)
    return "ed25519:" + hashlib.sha256(raw).hexdigest()[:16]


def _read_private_key_file(path: StrPath) -> bytes:
    """The signer's key file, read like a key-encryption key file: never through a link,
    and refused when its group or others may read it (whoever reads it can sign)."""

    def hinted(message: str) -> SigningKeyError:
        return SigningKeyError(f"{message}; {_KEY_HINT}")

    return read_checked_file(
        Path(path),
        what="signing key file",
        forbidden=OWNER_ONLY_FORBIDDEN,
        refusal="is readable or writable by others (mode {mode}), and whoever reads it can "
        "sign checkpoints and deletion notes; restrict it to its owner with `chmod 600 {path}`",
        unsafe=SigningKeyError,
        unreadable=hinted,
    )


def _read_key_file(path: StrPath) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise SigningKeyError(
            f"cannot read key file {os.fspath(path)}: {reason}; {_KEY_HINT}"
        ) from exc


def _load_public_key(path: StrPath) -> Ed25519PublicKey:
    data = _read_key_file(path)
    try:
        key = load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise SigningKeyError(
            f"key file {os.fspath(path)} does not hold a PEM public key; give the verifier "
            "the signer's public key (CheckpointSigner.public_key_pem), never its private key"
        ) from exc
    if not isinstance(key, Ed25519PublicKey):
        raise SigningKeyError(
            f"key file {os.fspath(path)} holds a {type(key).__name__}, not an Ed25519 public key"
        )
    return key


def _check_purpose(statement: Mapping[str, Any]) -> None:
    purpose = statement.get("purpose")
    if not isinstance(purpose, str) or not purpose or purpose == CHECKPOINT_PURPOSE:
        raise ValueError(
            f"a signed statement needs its own string 'purpose' (not {CHECKPOINT_PURPOSE!r}), "
            f"got {purpose!r}"
        )


_HEX = frozenset("0123456789abcdef")


def _is_hex(text: str) -> bool:
    return _HEX.issuperset(text)
