"""Signed checkpoints: round trip, forgeries, key files."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ec import SECP256R1, generate_private_key
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    BestAvailableEncryption,
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from agent_blackbox.schemas import BlackboxError, canonical_json
from agent_blackbox.schemas._checkpoint import (
    CHECKPOINT_PURPOSE,
    Checkpoint,
    CheckpointSigner,
    CheckpointVerifier,
    ForgedCheckpoint,
    SigningKeyError,
    key_fingerprint,
)

HEAD = "ab" * 32


def _signed(
    signer: CheckpointSigner, *, last_sequence: int = 12, chain_head: str = HEAD
) -> Checkpoint:
    return signer.sign(
        run_id="run-7", tenant_id="acme", last_sequence=last_sequence, chain_head=chain_head
    )


def _verifier(*signers: CheckpointSigner) -> CheckpointVerifier:
    return CheckpointVerifier({s.key_id: s.public_key for s in signers})


def _write_key(path: Path, content: bytes) -> None:
    """A key file as `blackbox keys signing` leaves it: readable by its owner only."""
    path.touch(mode=0o600)
    path.write_bytes(content)


def _pem(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())


def test_sign_and_verify_round_trip() -> None:
    signer = CheckpointSigner.generate()
    checkpoint = _signed(signer)
    assert checkpoint.signer_key_id == signer.key_id
    assert len(checkpoint.signature) == 64
    _verifier(signer).verify(checkpoint)


def test_message_is_canonical_json_with_a_purpose_and_without_the_signature() -> None:
    checkpoint = _signed(CheckpointSigner.generate(key_id="k1"))
    message = checkpoint.message()
    assert message == canonical_json(json.loads(message))
    assert json.loads(message) == {
        "purpose": CHECKPOINT_PURPOSE,
        "run_id": "run-7",
        "tenant_id": "acme",
        "last_sequence": 12,
        "chain_head": HEAD,
        "signer_key_id": "k1",
    }
    assert replace(checkpoint, signature=b"").message() == message


def test_record_round_trip_is_json() -> None:
    signer = CheckpointSigner.generate()
    checkpoint = _signed(signer)
    record = json.loads(json.dumps(checkpoint.to_record()))
    assert Checkpoint.from_record(record) == checkpoint
    _verifier(signer).verify(Checkpoint.from_record(record))


@pytest.mark.parametrize(
    "record_change",
    [
        {"signature": "not base64!"},
        {"last_sequence": "12"},
        {"last_sequence": True},
        {"chain_head": None},
    ],
)
def test_a_malformed_record_is_refused_naming_the_run(record_change: dict[str, object]) -> None:
    record = _signed(CheckpointSigner.generate()).to_record() | record_change
    with pytest.raises(ForgedCheckpoint, match="run-7"):
        Checkpoint.from_record(record)


def test_a_record_without_fields_is_refused() -> None:
    with pytest.raises(ForgedCheckpoint, match="<unknown>"):
        Checkpoint.from_record({})


@pytest.mark.parametrize(
    "change",
    [
        {"chain_head": "cd" * 32},
        {"last_sequence": 11},
        {"last_sequence": 13},
        {"run_id": "run-8"},
        {"tenant_id": "globex"},
    ],
    ids=["head", "sequence-down", "sequence-up", "run", "tenant"],
)
def test_a_changed_field_is_a_forgery(change: dict[str, object]) -> None:
    signer = CheckpointSigner.generate()
    forged = replace(_signed(signer), **change)  # type: ignore[arg-type]
    with pytest.raises(ForgedCheckpoint, match=forged.run_id) as caught:
        _verifier(signer).verify(forged)
    assert caught.value.run_id == forged.run_id
    assert caught.value.signer_key_id == signer.key_id
    assert signer.key_id in str(caught.value)
    assert "does not verify" in str(caught.value)


def test_a_signature_of_another_key_under_a_known_id_is_a_forgery() -> None:
    genuine = CheckpointSigner.generate(key_id="signer-2026")
    impostor = CheckpointSigner.generate(key_id="signer-2026")
    with pytest.raises(ForgedCheckpoint, match="run-7"):
        _verifier(genuine).verify(_signed(impostor))


def test_a_key_id_changed_to_another_known_signer_is_a_forgery() -> None:
    first = CheckpointSigner.generate(key_id="a")
    second = CheckpointSigner.generate(key_id="b")
    swapped = replace(_signed(first), signer_key_id="b")
    with pytest.raises(ForgedCheckpoint, match="'b'"):
        _verifier(first, second).verify(swapped)


@pytest.mark.parametrize("signature", [b"", b"\x00" * 63, b"\x00" * 65])
def test_a_malformed_signature_is_a_forgery(signature: bytes) -> None:
    signer = CheckpointSigner.generate()
    checkpoint = _signed(signer)
    for bad in (signature, checkpoint.signature[:-1]):
        with pytest.raises(ForgedCheckpoint, match=r"run-7.*bytes"):
            _verifier(signer).verify(replace(checkpoint, signature=bad))


def test_a_flipped_signature_bit_is_a_forgery() -> None:
    signer = CheckpointSigner.generate()
    checkpoint = _signed(signer)
    for index in range(0, 64, 7):
        flipped = bytearray(checkpoint.signature)
        flipped[index] ^= 0x01
        with pytest.raises(ForgedCheckpoint, match="run-7"):
            _verifier(signer).verify(replace(checkpoint, signature=bytes(flipped)))


def test_an_unknown_key_id_is_a_forgery_naming_the_known_ones() -> None:
    signer = CheckpointSigner.generate(key_id="old")
    with pytest.raises(ForgedCheckpoint, match=r"run-7.*'old'.*known: new") as caught:
        _verifier(CheckpointSigner.generate(key_id="new")).verify(_signed(signer))
    assert isinstance(caught.value, BlackboxError)


def test_rotated_keys_keep_verifying_old_checkpoints() -> None:
    old = CheckpointSigner.generate(key_id="2025")
    new = CheckpointSigner.generate(key_id="2026")
    verifier = _verifier(old, new)
    verifier.verify(_signed(old))
    verifier.verify(_signed(new))
    assert verifier.key_ids == {"2025", "2026"}


def test_the_signer_refuses_a_head_that_cannot_be_one() -> None:
    signer = CheckpointSigner.generate()
    with pytest.raises(ValueError, match="last_sequence"):
        _signed(signer, last_sequence=0)
    for head in ("xyz", "AB" * 32, "ab" * 31):
        with pytest.raises(ValueError, match="chain_head"):
            _signed(signer, chain_head=head)


def test_key_id_defaults_to_a_fingerprint_of_the_public_key(tmp_path: Path) -> None:
    key = Ed25519PrivateKey.generate()
    path = tmp_path / "signing.pem"
    _write_key(path, _pem(key))
    signer = CheckpointSigner.from_pem_file(path)
    assert signer.key_id == key_fingerprint(key.public_key())
    assert signer.key_id.startswith("ed25519:")
    assert len(signer.key_id) == len("ed25519:") + 16
    assert CheckpointSigner.from_pem_file(path, key_id="prod-1").key_id == "prod-1"


def test_pem_files_on_both_sides(tmp_path: Path) -> None:
    key_file = tmp_path / "signing.pem"
    _write_key(key_file, _pem(Ed25519PrivateKey.generate()))
    signer = CheckpointSigner.from_pem_file(key_file)
    public_file = tmp_path / "signing.pub.pem"
    public_file.write_bytes(signer.public_key_pem())
    assert signer.public_key_pem().startswith(b"-----BEGIN PUBLIC KEY-----")

    CheckpointVerifier.from_pem_files([public_file]).verify(_signed(signer))
    named = CheckpointSigner.from_pem_file(key_file, key_id="prod")
    CheckpointVerifier.from_pem_files({"prod": public_file}).verify(_signed(named))


def test_from_env_reads_the_key_file_and_key_id(tmp_path: Path) -> None:
    path = tmp_path / "k.pem"
    _write_key(path, _pem(Ed25519PrivateKey.generate()))
    env = {"BLACKBOX_SIGNING_KEY_FILE": str(path), "BLACKBOX_SIGNING_KEY_ID": "env-id"}
    assert CheckpointSigner.from_env(env).key_id == "env-id"
    assert CheckpointSigner.from_env(env, key_id="arg-id").key_id == "arg-id"
    plain = CheckpointSigner.from_env({"BLACKBOX_SIGNING_KEY_FILE": str(path)})
    assert plain.key_id.startswith("ed25519:")


def test_from_env_without_the_variable_says_what_to_set() -> None:
    with pytest.raises(SigningKeyError, match="BLACKBOX_SIGNING_KEY_FILE is not set"):
        CheckpointSigner.from_env({})


def test_a_missing_key_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "absent.pem"
    with pytest.raises(SigningKeyError, match=r"absent\.pem.*openssl genpkey") as caught:
        CheckpointSigner.from_pem_file(path)
    assert isinstance(caught.value.__cause__, OSError)
    with pytest.raises(SigningKeyError, match=r"absent\.pem"):
        CheckpointVerifier.from_pem_files([path])


def test_a_file_that_is_not_a_key_is_named(tmp_path: Path) -> None:
    path = tmp_path / "junk.pem"
    _write_key(path, b"not a key at all")
    with pytest.raises(SigningKeyError, match=r"junk\.pem does not hold a PEM private key"):
        CheckpointSigner.from_pem_file(path)
    with pytest.raises(SigningKeyError, match=r"junk\.pem does not hold a PEM public key"):
        CheckpointVerifier.from_pem_files([path])


def test_a_private_key_is_not_accepted_as_a_public_one(tmp_path: Path) -> None:
    path = tmp_path / "private.pem"
    _write_key(path, _pem(Ed25519PrivateKey.generate()))
    with pytest.raises(SigningKeyError, match="never its private key"):
        CheckpointVerifier.from_pem_files([path])


def test_a_key_of_another_algorithm_is_named(tmp_path: Path) -> None:
    ec = generate_private_key(SECP256R1())
    path = tmp_path / "ec.pem"
    _write_key(path, ec.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    with pytest.raises(SigningKeyError, match=r"ec\.pem holds a .*not an Ed25519 key"):
        CheckpointSigner.from_pem_file(path)
    public = tmp_path / "ec.pub.pem"
    public.write_bytes(
        ec.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    )
    with pytest.raises(SigningKeyError, match=r"ec\.pub\.pem holds a .*not an Ed25519"):
        CheckpointVerifier.from_pem_files([public])


def test_an_encrypted_key_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "locked.pem"
    key = Ed25519PrivateKey.generate()
    _write_key(
        path, key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, BestAvailableEncryption(b"pw"))
    )
    with pytest.raises(SigningKeyError, match=r"locked\.pem is encrypted"):
        CheckpointSigner.from_pem_file(path)


def test_the_signer_never_shows_its_key() -> None:
    signer = CheckpointSigner.generate(key_id="k")
    assert repr(signer) == "CheckpointSigner(key_id='k', <private key>)"


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604])
def test_a_signing_key_file_others_can_read_is_refused(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "signing.pem"
    _write_key(path, _pem(Ed25519PrivateKey.generate()))
    path.chmod(mode)
    with pytest.raises(SigningKeyError, match=rf"mode 0{mode:o}.*chmod 600"):
        CheckpointSigner.from_pem_file(path)
    with pytest.raises(SigningKeyError, match="chmod 600"):
        CheckpointSigner.from_env({"BLACKBOX_SIGNING_KEY_FILE": str(path)})


def test_a_signing_key_file_that_is_a_link_or_not_a_file_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real.pem"
    _write_key(real, _pem(Ed25519PrivateKey.generate()))
    link = tmp_path / "signing.pem"
    link.symlink_to(real)
    with pytest.raises(SigningKeyError, match="symbolic link"):
        CheckpointSigner.from_pem_file(link)
    folder = tmp_path / "folder.pem"
    folder.mkdir(mode=0o700)
    with pytest.raises(SigningKeyError, match="not a regular file"):
        CheckpointSigner.from_pem_file(folder)
