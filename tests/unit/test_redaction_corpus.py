"""The redaction corpus: secret shapes that must go, ids and values that must stay.

The secrets are every shape of issue 11's item 3; the non-secret corpus is generated
deterministically (UUIDs, snowflakes, epoch times, ISO dates, SHAs, versions, order ids,
file names, ...), and at most 0.1% of it may be redacted.
"""

from __future__ import annotations

import hashlib
import json
import random
import uuid
from typing import Any

import pytest

from agent_blackbox.outbox._redaction import (
    SCAN_CAP,
    RedactionConfigError,
    Redactor,
    placeholder,
)
from agent_blackbox.outbox._scrub import Scrub
from agent_blackbox.schemas import canonical_text

REDACTOR = Redactor()
SK = "sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8t"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
PEM = (
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6\n"
    "-----END RSA PRIVATE KEY-----"
)
SECRET = "Zq7vTb19Kx"  # a value with no shape: only its key name or context gives it away

# (value, what must not survive redaction)
SECRETS: list[tuple[Any, str]] = [
    # key shapes
    (f"use {SK} now", SK),
    ("sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWx", "AbCdEfGhIjKlMnOpQrStUvWx"),
    ("sk_live_4eC39HqLyjWDarjtT1zdp7dc", "4eC39HqLyjWDarjtT1zdp7dc"),
    ("sk_test_4eC39HqLyjWDarjtT1zdp7dc", "4eC39HqLyjWDarjtT1zdp7dc"),
    ("rk_live_51H8abcdefghijklmnopqrst", "51H8abcdefghijklmnopqrst"),
    ("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
    ("AKIAIOSFODNN7EXAMPLE", "IOSFODNN7EXAMPLE"),
    ("ASIAY34FZKBOKMUTVV7A", "Y34FZKBOKMUTVV7A"),
    ("ghp_16C7e42F292c6912E7710c838347Ae178B4a", "16C7e42F292c6912E7710c838347Ae178B4a"),
    ("gho_16C7e42F292c6912E7710c838347Ae178B4a", "16C7e42F292c6912E7710c838347Ae178B4a"),
    ("github_pat_11ABCDEFG0123456789_abcdefghijkl", "11ABCDEFG0123456789_abcdefghijkl"),
    ("glpat-xYz12AbC34dEf56GhI78j", "xYz12AbC34dEf56GhI78j"),
    ("hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456", "aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456"),
    ("ya29.a0AfH6SMBx7yZabcdefghijklmnopq", "a0AfH6SMBx7yZabcdefghijklmnopq"),
    ("xoxb-123456789012-1234567890123-AbCdEf", "1234567890123-AbCdEf"),
    ("xoxp-123456789012-1234567890123-AbCdEf", "1234567890123-AbCdEf"),
    ("xapp-1-A0123456789-1234567890123-abcdef", "1234567890123-abcdef"),
    ("AIzaSyDaGmWKa4JsXZ-HjGw7ISLn_3namBGewQe", "SyDaGmWKa4JsXZ-HjGw7ISLn_3namBGewQe"),
    ("npm_abcdefghijklmnopqrstuvwxyz0123456789", "abcdefghijklmnopqrstuvwxyz0123456789"),
    ("SG.abcdefghijklmnopqrstuv.abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG", "ABCDEFG"),
    (JWT, "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"),
    (PEM, "MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6"),
    (PEM.replace("RSA ", "").split("\n-----END")[0], "MIIEowIBAAKCAQEA"),  # truncated
    (PEM.replace("RSA", "OPENSSH"), "MIIEowIBAAKCAQEA"),
    (PEM.replace("RSA", "EC"), "MIIEowIBAAKCAQEA"),
    ("https://hooks.slack.com/services/T0000/B0000/XXXXXXXXXXXXXXXXXXXX", "XXXXXXXXXXXX"),
    ("https://discord.com/api/webhooks/123456/AbCdEfGhIjKlMnOpQrStUv", "AbCdEfGhIjKlMnOpQrStUv"),
    ("Authorization: Bearer abc.def123.ghi456", "def123"),
    ("Basic dXNlcjpwYXNzd29yZA==", "dXNlcjpwYXNzd29yZA"),
    # URL query strings and userinfo
    (f"https://api.example.com/v1?api_key={SECRET}&q=1", SECRET),
    (f"https://api.example.com/v1?q=1&access_token={SECRET}", SECRET),
    (f"https://x.example.com/cb#id_token={SECRET}", SECRET),
    (f"https://s.example.net/f?sv=2022&sig={SECRET}", SECRET),
    (f"https://s.example.net/f?X-Amz-Signature={SECRET}", SECRET),
    (f"postgresql://app:{SECRET}@db.internal:5432/app", SECRET),
    (f"redis://:{SECRET}@cache:6379/0", SECRET),
    # name=value in text: exception messages, logs, config dumps
    (f"connect failed: password={SECRET}", SECRET),
    (f"db_password: {SECRET}", SECRET),
    (f"client_secret='{SECRET}'", SECRET),
    (f'"apiKey": "{SECRET}" in body', SECRET),
    (f"X-Api-Key: {SECRET}", SECRET),
    (f"Cookie: session_id={SECRET}", SECRET),
    # credential key names
    ({"token": SECRET}, SECRET),
    ({"clientSecret": SECRET}, SECRET),
    ({"db_password": SECRET}, SECRET),
    ({"x-goog-api-key": SECRET}, SECRET),
    ({"Ocp-Apim-Subscription-Key": SECRET}, SECRET),
    ({"X-Amz-Security-Token": SECRET}, SECRET),
    ({"refreshToken": SECRET}, SECRET),
    ({"AWS_SECRET_ACCESS_KEY": SECRET}, SECRET),
    ({"privateKey": SECRET}, SECRET),
    ({"headers": [["Authorization", SECRET]]}, SECRET),
    ({"headers": [{"name": "X-Api-Key", "value": SECRET}]}, SECRET),
    ({"extra_body": {"metadata": {"user_api_key": SECRET}}}, SECRET),
    # JSON-encoded strings (a tool call's arguments), nested twice
    ({"arguments": json.dumps({"api_key": SECRET, "city": "Lyon"})}, SECRET),
    ({"arguments": json.dumps({"q": json.dumps({"password": SECRET})})}, SECRET),
    (json.dumps({"auth": {"token": SECRET}}), SECRET),
    ('{"key": "\\u0073k-proj-Ab3dEf6hIj9kLm2nOp5qRs8t"}', "Ab3dEf6hIj9kLm2nOp5qRs8t"),
    # dict keys
    ({SK: "value"}, SK),
    ({f"user@{SECRET}.com": 1}, SECRET),
    # normalisation: zero-width characters, full-width forms, look-alike letters
    ("s\u200bk-proj-Ab3dEf6hIj9kLm2nOp5qRs8t", "Ab3dEf6hIj9kLm2nOp5qRs8t"),
    ("AKIA\u200dIOSFODNN7EXAMPLE", "IOSFODNN7EXAMPLE"),
    ("ann\uff20example.com", "example.com"),
    (
        "ｓｋ－ｐｒｏｊ－Ａｂ３ｄＥｆ６ｈＩｊ９ｋＬｍ２ｎＯｐ５ｑＲｓ８ｔ",
        "Ab3dEf6hIj9kLm2nOp5qRs8t",
    ),
    ("ѕk-proj-Ab3dEf6hIj9kLm2nOp5qRs8t", "Ab3dEf6hIj9kLm2nOp5qRs8t"),  # Cyrillic ѕ
    ("раssword=" + SECRET, SECRET),  # Cyrillic р and а
    # personal data
    ("mail ann.lee+x@example.co.uk", "ann.lee"),
    ("card 4111 1111 1111 1111 exp 12/29", "4111 1111 1111 1111"),
    ("amex 3782 822463 10005", "822463"),
    ("paid with 5555555555554444", "5555555555554444"),
    ("call +44 20 7946 0958", "7946 0958"),
]


@pytest.mark.parametrize(("value", "secret"), SECRETS)
def test_every_secret_shape_is_removed(value: Any, secret: str) -> None:
    result = REDACTOR.redact(value)
    assert secret not in canonical_text(result.value), result.value
    assert result.fired


def test_the_secret_corpus_holds_at_least_sixty_shapes() -> None:
    assert len(SECRETS) >= 60


def _corpus(n: int) -> list[Any]:
    rng = random.Random(20261203)
    makers = [
        lambda: str(uuid.UUID(int=rng.getrandbits(128), version=4)),
        lambda: str(rng.randrange(10**18, 2 * 10**18)),  # snowflakes
        lambda: rng.randrange(10**18, 2 * 10**18),
        lambda: str(rng.randrange(1_500_000_000, 1_900_000_000)),  # epoch seconds
        lambda: str(rng.randrange(1_500_000_000_000, 1_900_000_000_000)),  # ms
        lambda: rng.randrange(1_500_000_000_000_000, 1_900_000_000_000_000),  # µs
        lambda: str(rng.randrange(1_500_000_000 * 10**9, 1_900_000_000 * 10**9)),  # ns
        lambda: (
            f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T"
            f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}Z"
        ),
        lambda: hashlib.sha1(rng.randbytes(8)).hexdigest(),
        lambda: hashlib.sha256(rng.randbytes(8)).hexdigest(),
        lambda: f"{rng.randint(0, 9)}.{rng.randint(0, 40)}.{rng.randint(0, 200)}",
        lambda: f"ORD-{rng.randint(2020, 2026)}-{rng.randrange(10**6):06d}",
        lambda: f"order {rng.randrange(10**8, 10**9)}",
        lambda: f"inv_{rng.randrange(16**12):012x}",
        lambda: f"report_{rng.randint(2020, 2026)}-{rng.randint(1, 12):02d}-01.pdf",
        lambda: f"IMG_{rng.randrange(10**4):04d}.jpg",
        lambda: f"/var/data/{rng.randrange(10**6)}/part-{rng.randrange(10**5):05d}.parquet",
        lambda: f"192.168.{rng.randint(0, 255)}.{rng.randint(0, 255)}",
        lambda: f"tokens used: {rng.randint(1, 100000)}",
        lambda: {"max_tokens": rng.randint(1, 4096), "prompt_tokens": rng.randint(1, 9999)},
        lambda: {"token": "Hello", "logprob": -rng.random()},
        lambda: {"id": f"chatcmpl-{rng.randrange(16**20):020x}", "created": 1764720000},
        lambda: f"call_{rng.randrange(36**24):x}",
        lambda: f"{rng.randrange(10**4)}-{rng.randrange(10**4)}-{rng.randrange(10**4)}",
        lambda: f"the meeting is at {rng.randint(1, 12)}:{rng.randint(0, 59):02d}",
        lambda: f"amount {rng.randrange(10**6)}.{rng.randrange(100):02d} EUR",
        lambda: f"key={rng.choice(['color', 'size', 'name'])}",
        lambda: f"sha256:{hashlib.sha256(rng.randbytes(4)).hexdigest()}",
        lambda: f"https://example.com/items/{rng.randrange(10**9)}?page={rng.randint(1, 9)}",
        lambda: f"commit {hashlib.sha1(rng.randbytes(8)).hexdigest()[:7]}",
    ]
    return [makers[i % len(makers)]() for i in range(n)]


def test_realistic_ids_and_values_are_kept() -> None:
    corpus = _corpus(12_000)
    redacted = [value for value in corpus if REDACTOR.redact(value).value != value]
    assert len(redacted) < len(corpus) / 1000, redacted[:20]


# --- item 4: detection cannot be stalled (times are in bench/redaction.py) --------------


def test_adversarial_inputs_are_redacted_right() -> None:
    xoxb = "xoxb-" * 16_000 + "_"
    assert REDACTOR.redact(xoxb).value == placeholder("api_key") + "_"
    jwt_like = "eyJ-" * 250_000
    assert REDACTOR.redact(jwt_like).value == jwt_like
    digits = "1 " * 50_000
    assert REDACTOR.redact(digits).value == digits
    cards = "4111 1111 1111 1111 " * 1000
    assert REDACTOR.redact(cards).value == (placeholder("card_number") + " ") * 1000


def test_a_string_past_the_scan_cap_is_scanned_whole_window_by_window() -> None:
    # A large model reply is kept whole (replay hands it back as it came): every window
    # is scanned, secrets near a window's edge included, and nothing else changes.
    filler = "a " * (SCAN_CAP // 2 - 3)
    text = filler + SK + " " + filler + "more text " + SK + " end"
    result = REDACTOR.redact(text)
    assert SK not in result.value
    assert result.value == text.replace(SK, placeholder("api_key"))
    assert len(text) > 2 * SCAN_CAP


# --- versions: old runs replay with the detectors they were recorded with ---------------


def test_rules_recorded_without_a_version_replay_with_version_1() -> None:
    rules = '{"detectors":["api_key","bearer_token","card_number","email","phone"],"paths":[]}'
    old = Scrub.recorded_in({"redaction": rules})
    fired: set[str] = set()
    # Version 1 kept a key named "token" and JSON inside strings as they were.
    value = {"token": "abc", "arguments": '{"password": "x"}'}
    assert old.value(value, fired) == {"token": "abc", "arguments": '{"password": "x"}'}
    new = Scrub.recorded_in({"redaction": Scrub(Redactor()).rules_text() or ""})
    scrubbed = new.value(value, set())
    assert scrubbed["token"] == placeholder("credential")
    assert json.loads(scrubbed["arguments"]) == {"password": placeholder("credential")}


def test_an_unknown_version_is_refused() -> None:
    with pytest.raises(RedactionConfigError, match="version"):
        Redactor.from_config({"version": 9})
    with pytest.raises(RedactionConfigError, match="version"):
        Redactor.from_config({"version": "2"})


def test_a_keyed_version_1_redactor_stays_version_1() -> None:
    old = Redactor(pseudonyms=["email"], version=1)
    keyed = old.keyed(b"k" * 32)
    assert keyed.version == 1
    assert keyed.redact({"token": "abc"}).value == {"token": "abc"}
    assert Redactor(pseudonyms=["email"]).keyed(b"k" * 32).version == 3
    assert Redactor(pseudonyms=["email"], version=2).keyed(b"k" * 32).version == 2


def test_a_snapshots_flags_and_a_transitions_reason_are_scrubbed_and_still_replay() -> None:
    from agent_blackbox.outbox import MemoryRecorder, RunSnapshot
    from agent_blackbox.replayer import replay_run
    from agent_blackbox.schemas import EventType, PayloadPipeline

    def agent(run: Any, input: Any) -> Any:
        run.transition("escalated", state={"n": 1}, reason="asked by ann@example.com")
        return "ok"

    recorder = MemoryRecorder(redaction=REDACTOR)
    snapshot = RunSnapshot(code_version="1", flags={"beta": "on", "note": f"key {SK}"})
    recorder.record(agent, snapshot, agent_id="flags")
    bodies = {e.event_type: PayloadPipeline().unpack(e) for e in recorder.events}
    assert SK not in json.dumps(bodies[EventType.RUN_STARTED]["flags"])
    assert bodies[EventType.RUN_STARTED]["flags"]["beta"] == "on"
    assert "ann@example.com" not in bodies[EventType.STATE_TRANSITION]["reason"]
    assert replay_run(recorder.events, agent).passed


def test_every_snapshot_field_is_scrubbed_in_the_body_and_the_attributes() -> None:
    from agent_blackbox.outbox import MemoryRecorder, RunSnapshot
    from agent_blackbox.replayer import replay_run
    from agent_blackbox.schemas import PayloadPipeline

    def agent(run: Any, input: Any) -> Any:
        return "ok"

    recorder = MemoryRecorder(redaction=REDACTOR)
    snapshot = RunSnapshot(
        code_version=f"build?api_key={SK}",
        input={"q": 1},
        prompt_templates={"greeting": f"sha {SK}", JWT: "d"},
        tool_schemas={"lookup": f"v1 password={SECRET}"},
        model_ids=(f"gpt?token={SECRET}",),
        flags={"db_password": SECRET},
        permissions=(f"scope bearer {JWT}",),
        changes={"model": f"key {SK}"},
    )
    recorder.record(agent, snapshot, agent_id="snap")
    started = recorder.events[0]
    recorded = json.dumps(PayloadPipeline().unpack(started)) + json.dumps(started.attributes)
    for secret in (SK, JWT, SECRET):
        assert secret not in recorded
    assert PayloadPipeline().unpack(started)["tool_schemas"][0]["name"] == "lookup"
    assert replay_run(recorder.events, agent).passed
