"""The values behind a replay's first divergence, as a replay result keeps them: plain
for a run recorded unencrypted, sealed under the run's own data key (bound to its run,
sequence and tenant) for a sealed run, none when the replay cannot seal them; and the
words anyone may read carry no value."""

from __future__ import annotations

import json
import os

import pytest

from agent_blackbox.keystore import SEALED_ENCODING, AesGcmSealer, CiphertextCorrupt
from agent_blackbox.replayer import Change, Divergence, DivergenceKind
from agent_blackbox.replayer._kept import _context, kept_values
from agent_blackbox.schemas import Sealed
from tests.unit.test_views_unit import envelope

SECRET = os.urandom(32)


class _Keys:
    def opening_key(self, run_id: str, key_id: str) -> bytes:
        assert (run_id, key_id) == ("run-1", "key-1")
        return SECRET


def _divergence(*, revealed: bool = False) -> Divergence:
    return Divergence(
        kind=DivergenceKind.ARGUMENT_MISMATCH,
        run_id="run-1",
        sequence=2,
        expected_type="tool.call",
        actual_type="tool.call",
        expected_name="read_ticket",
        actual_name="read_ticket",
        changes=(Change("args[0]", "T-1", "T-1-x"),),
        revealed=revealed,
        asked={"args": ["T-1-x"]},
    )


def test_the_words_of_a_divergence_never_carry_a_value() -> None:
    divergence = _divergence(revealed=True)
    assert "T-1-x" in divergence.describe()  # revealed on the replay's own terminal
    assert "T-1-x" not in divergence.summary
    assert "args[0]" in divergence.summary
    hidden = _divergence().to_dict()
    assert "asked" not in hidden
    assert hidden["changes"] == [{"path": "args[0]"}]


def test_a_plain_runs_values_are_kept_as_they_are() -> None:
    kept = kept_values(_divergence(), envelope("run-1", 1), None)
    assert kept is not None
    assert kept.key_id is None
    assert json.loads(kept.data) == {
        "changes": [{"path": "args[0]", "expected": "T-1", "actual": "T-1-x"}],
        "asked": {"args": ["T-1-x"]},
    }


def test_a_sealed_runs_values_are_sealed_under_its_key_and_bound_to_it() -> None:
    run = envelope("run-1", 1, key_id="key-1", tenant_id="tenant-a")
    kept = kept_values(_divergence(), run, _Keys())
    assert kept is not None
    assert kept.key_id == "key-1"
    assert b"T-1-x" not in kept.data
    sealed = Sealed(data=kept.data, key_id="key-1", encoding=SEALED_ENCODING)
    opened = AesGcmSealer(_Keys()).open(sealed, _context("run-1", 2, "tenant-a"))
    assert json.loads(opened)["changes"][0]["actual"] == "T-1-x"
    for elsewhere in (_context("run-1", 3, "tenant-a"), _context("run-1", 2, "tenant-b")):
        with pytest.raises(CiphertextCorrupt):
            AesGcmSealer(_Keys()).open(sealed, elsewhere)


def test_a_sealed_run_without_keys_keeps_no_values() -> None:
    run = envelope("run-1", 1, key_id="key-1")
    assert kept_values(_divergence(), run, None) is None
