"""Redaction leaves ordinary values alone: image names are not e-mail addresses, ids and
order numbers are not cards.

A redactor that takes every ``name@2x.png`` for an e-mail address and one 16-digit order
number or 63-bit id in thirty for a card number teaches its users to turn it off, and
breaks replays that compare such values. Here a tenant-A writer records, on the real
stack, the values of the generated ordinary corpus that redaction version 2 took for
e-mails and cards; as the replayer, the recorded tool call holds each of them as it was
given, and no rule fired. The whole corpus (24,000 values: ids, order numbers, 63-bit
integer ids, file names, hashes, timestamps, prices, UUIDs...) is redacted at under one
value in a thousand. Each test failed under version 2.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from sqlalchemy import Engine

from agent_blackbox.keystore import AesGcmSealer, AuditedKeys, DataKeyStore, LocalKeyProvider
from agent_blackbox.outbox import AgentRun, Recorder, Redactor, RunSnapshot
from agent_blackbox.schemas import PayloadPipeline, Settings
from bench._redaction_corpus import ORDINARY_SIZE, ordinary_corpus
from tests.conftest import Login
from tests.integration._outbox import outbox_envelopes
from tests.security.conftest import TENANT_A

pytestmark = pytest.mark.integration

PROVIDER = LocalKeyProvider({"v1": os.urandom(32)})
CORPUS = ordinary_corpus()
V2 = Redactor(version=2)


def _taken_by_version_2(rule: str, limit: int = 60) -> list[Any]:
    """Values of the corpus that version 2 redacted by ``rule`` (at most ``limit``)."""
    taken = [value for value in CORPUS if rule in V2.redact(value).fired]
    assert len(taken) >= 20, f"the corpus no longer holds values version 2 took for {rule}"
    return taken[:limit]


def _recorded_arguments(
    engine: Engine, settings: Settings, login: Login, values: list[Any]
) -> tuple[dict[str, str], Any]:
    """Record one tool call given ``values`` as a tenant-A writer; its attributes and
    its arguments as recorded (opened as the tenant's replayer)."""
    writer = login("blackbox_writer", tenant=TENANT_A)
    replayer = login("blackbox_replayer", tenant=TENANT_A)

    def agent(run: AgentRun, input: Any) -> Any:
        return run.call("store", lambda items: len(items), values)

    recorder = Recorder(writer, settings=settings, keys=DataKeyStore(PROVIDER))
    run, output = recorder.record(
        agent, RunSnapshot(code_version="precision.1"), agent_id="ordinary", tenant_id=TENANT_A
    )
    assert output == len(values)
    opener = PayloadPipeline(
        sealer=AesGcmSealer(AuditedKeys(replayer, PROVIDER, purpose="precision check"))
    )
    call = outbox_envelopes(engine, run.run_id)[1]
    body = opener.unpack(call)
    return dict(call.attributes), json.loads(body["arguments_json"])["args"][0]


def test_image_names_with_density_suffixes_are_kept(
    engine: Engine, settings: Settings, login: Login
) -> None:
    names = _taken_by_version_2("email")
    assert any("@2x." in str(name) for name in names)
    attributes, recorded = _recorded_arguments(engine, settings, login, names)
    assert recorded == names
    assert "redacted" not in attributes


def test_order_numbers_and_integer_ids_are_kept(
    engine: Engine, settings: Settings, login: Login
) -> None:
    numbers = _taken_by_version_2("card_number")
    assert any(type(number) is int and number >= 2**62 for number in numbers)  # 63-bit ids
    attributes, recorded = _recorded_arguments(engine, settings, login, numbers)
    assert recorded == json.loads(json.dumps(numbers))  # tuples and floats as JSON has them
    assert "redacted" not in attributes


def test_the_ordinary_corpus_is_redacted_under_one_value_in_a_thousand() -> None:
    redactor = Redactor()
    changed = [value for value in CORPUS if redactor.redact(value).value != value]
    assert len(CORPUS) == ORDINARY_SIZE >= 20_000
    assert len(changed) / len(CORPUS) < 0.001, changed[:20]
