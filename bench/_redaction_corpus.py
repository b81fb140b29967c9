"""The two redaction corpora, generated from a fixed seed: secrets that must go, and
ordinary values that must stay.

The secret corpus holds every shape redaction version 3 was made to catch (credential
names and addresses percent-encoded, invisible, tag characters and line breaks inside a
key or a key name, JSON encoded twice, ``data:`` URL bodies, cards grouped by dots or
slashes or given as numbers where a card is expected, internationalised addresses, a key
cut across the chunks of a legacy completions stream) in many variants, and the shapes of
the earlier versions. The ordinary corpus holds what tool calls and model replies are full
of: ids, order numbers, 63-bit integer ids, file names (``logo@2x.png`` among them),
hashes, timestamps, prices, UUIDs, versions, URLs.

Both are built in code from a seeded generator, so a bench run and a test see the same
values and nothing large is committed.
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
import string
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

SEED = 20261206
ORDINARY_SIZE = 24_000


@dataclass(frozen=True)
class Secret:
    """A value holding a secret: ``secret`` must not survive redaction of ``value``.
    ``stream``: the value is a recorded streamed response (redacted as one)."""

    shape: str
    value: Any
    secret: str
    stream: bool = False


_NAMES = ("api_key", "access_token", "password", "client_secret", "apiKey", "auth_token")
_ISSUERS = ("4", "51", "52", "53", "54", "55", "2221", "2720", "34", "37", "6011", "65", "3528")
_CARD_WORDS = ("card", "visa", "paid with", "credit card", "cc", "Mastercard", "card_number")
_IDN = (
    ("josé", "exämple.com"),
    ("用户", "例子.广告"),
    ("алиса", "пример.рф"),
    ("müller", "bücher.de"),
    ("θέμις", "παράδειγμα.ελ"),
    ("ユーザー", "例え.jp"),
    ("ana", "xn--bcher-kva.de"),
    ("راشد", "مثال.إختبار"),
)
_DOMAINS = ("example.com", "mail.example.org", "corp.example.co.uk", "example.io")


def _word(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(n))


def _luhn_completed(prefix: str, length: int, rng: random.Random) -> str:
    body = prefix + "".join(rng.choice(string.digits) for _ in range(length - len(prefix) - 1))
    total = 0
    for position, char in enumerate(reversed(body)):
        digit = int(char)
        if position % 2 == 0:
            digit = digit * 2 - 9 if digit > 4 else digit * 2
        total += digit
    return body + str((10 - total % 10) % 10)


def _card(rng: random.Random) -> str:
    prefix = rng.choice(_ISSUERS)
    return _luhn_completed(prefix, 15 if prefix in ("34", "37") else 16, rng)


def _percent(text: str, rng: random.Random, *, every: bool = False) -> str:
    """``text`` with some (or every) non-alphanumeric character and some letters encoded."""
    return "".join(
        f"%{ord(c):02X}" if every or not c.isalnum() or rng.random() < 0.2 else c for c in text
    )


def _key(rng: random.Random) -> tuple[str, str]:
    """A provider key and its tail (what must not survive)."""
    tail = _word(rng, 24)
    prefix = rng.choice(("sk-proj-", "sk-", "ghp_", "glpat-", "sk_live_", "hf_"))
    return prefix + tail + ("" if prefix != "hf_" else _word(rng, 8)), tail


def _interrupted(key: str, tail: str, rng: random.Random, marks: tuple[str, ...]) -> str:
    at = len(key) - len(tail) + rng.randrange(2, len(tail) - 2)
    return key[:at] + rng.choice(marks) + key[at:]


def _completions_stream(text: str, rng: random.Random) -> dict[str, Any]:
    cut = rng.randrange(3, 7)
    pieces = [text[i : i + cut] for i in range(0, len(text), cut)]
    return {
        "stream": [
            {"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": p}]}
            for p in pieces
        ]
    }


def _secret_variants(rng: random.Random) -> list[Secret]:
    secret = _word(rng, 14)
    name = rng.choice(_NAMES)
    local, domain = f"{_word(rng, 6).lower()}.{_word(rng, 5).lower()}", rng.choice(_DOMAINS)
    card = _card(rng)
    groups = [card[:4], card[4:8], card[8:12], card[12:]]
    key, tail = _key(rng)
    idn_local, idn_domain = rng.choice(_IDN)
    stream_text = f"Here is the key you asked for: {key} - keep it safe."
    inner = json.dumps({name: secret, "city": "Lyon"})
    data_text = f"{name}={secret}\nuser={local}@{domain}\n"
    return [
        Secret("percent name", f"https://api.example.com/?{_percent(name, rng)}={secret}", secret),
        Secret("percent name all", f"/cb?{_percent(name, rng, every=True)}={secret}&x=1", secret),
        Secret("percent name twice", f"?{name.replace('_', '%255F')}={secret}", secret),
        Secret("percent email", f"email={local}%40{domain}", local),
        Secret("percent email all", f"to={_percent(local + '@' + domain, rng)}", local),
        Secret("fe0f in key", _interrupted(key, tail, rng, ("\ufe0f", "\ufe0e")), tail[-8:]),
        Secret("tag in key", _interrupted(key, tail, rng, ("\U000e0041", "\U000e007f")), tail[-8:]),
        Secret("newline in key", _interrupted(key, tail, rng, ("\n", "\r\n")), tail[-8:]),
        Secret("newline in key name", {name[:3] + "\n" + name[3:]: secret}, secret),
        Secret("fe0f in key name", {name + "\ufe0f": secret}, secret),
        Secret("double JSON", json.dumps(inner), secret),
        Secret("double JSON field", {"arguments": json.dumps(inner)}, secret),
        Secret("escaped JSON in text", f"body={json.dumps(inner)} sent", secret),
        Secret(
            "data url",
            "data:text/plain;base64," + base64.b64encode(data_text.encode()).decode(),
            base64.b64encode(data_text.encode()).decode()[:16],
        ),
        Secret(
            "data url urlsafe",
            "see data:application/json;charset=utf-8;base64,"
            + base64.urlsafe_b64encode(json.dumps({"token": secret}).encode()).decode(),
            base64.urlsafe_b64encode(json.dumps({"token": secret}).encode()).decode()[:16],
        ),
        Secret("card dots", f"card {'.'.join(groups)}", card[4:12]),
        Secret("card slashes", f"{'/'.join(groups)}", card[4:12]),
        Secret("card spaces", f"pay {' '.join(groups)} now", card[4:12]),
        Secret("card context", f"{rng.choice(_CARD_WORDS)}: {card}", card),
        Secret("card float", {"card": float(card)}, card[:12]),
        Secret("card float text", f"card_number={card}.0", card),
        Secret("card int field", {"cardNumber": int(card)}, card),
        Secret("card str field", {"cc_num": card}, card),
        Secret("card details", {"number": card, "exp_month": 12, "cvc": "123"}, card),
        Secret("card nested", {"card": {"number": int(card), "brand": "visa"}}, card),
        Secret("idn email", f"write to {idn_local}@{idn_domain} today", idn_local),
        Secret("email", f"mail {local}@{domain}", local),
        Secret("legacy stream key", _completions_stream(stream_text, rng), tail, stream=True),
        Secret(
            "legacy stream email",
            _completions_stream(f"contact {local}@{domain} please", rng),
            local,
            stream=True,
        ),
    ]


_SK = "sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8t"
_JWT = (
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
)
_S = "Zq7vTb19Kx"
EARLIER: tuple[tuple[Any, str], ...] = (
    # The shapes versions 1 and 2 catch, which version 3 must still catch.
    (f"use {_SK} now", _SK),
    ("sk_live_4eC39HqLyjWDarjtT1zdp7dc", "4eC39HqLyjWDarjtT1zdp7dc"),
    ("AKIAIOSFODNN7EXAMPLE", "IOSFODNN7EXAMPLE"),
    ("ghp_16C7e42F292c6912E7710c838347Ae178B4a", "16C7e42F292c6912E7710c838347Ae178B4a"),
    ("xoxb-123456789012-1234567890123-AbCdEf", "1234567890123-AbCdEf"),
    ("AIzaSyDaGmWKa4JsXZ-HjGw7ISLn_3namBGewQe", "SyDaGmWKa4JsXZ-HjGw7ISLn_3namBGewQe"),
    (_JWT, "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"),
    (
        "-----BEGIN RSA PRIVATE KEY-----\n"
        "MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6\n"
        "-----END RSA PRIVATE KEY-----",
        "MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6",
    ),
    ("https://hooks.slack.com/services/T0000/B0000/XXXXXXXXXXXXXXXXXXXX", "XXXXXXXXXXXX"),
    ("Authorization: Bearer abc.def123.ghi456", "def123"),
    ("Basic dXNlcjpwYXNzd29yZA==", "dXNlcjpwYXNzd29yZA"),
    (f"https://api.example.com/v1?api_key={_S}&q=1", _S),
    (f"https://s.example.net/f?sv=2022&sig={_S}", _S),
    (f"postgresql://app:{_S}@db.internal:5432/app", _S),
    (f"connect failed: password={_S}", _S),
    (f'"apiKey": "{_S}" in body', _S),
    ({"token": _S}, _S),
    ({"Ocp-Apim-Subscription-Key": _S}, _S),
    ({"headers": [["Authorization", _S]]}, _S),
    ({"arguments": json.dumps({"q": json.dumps({"password": _S})})}, _S),
    ("s\u200bk-proj-Ab3dEf6hIj9kLm2nOp5qRs8t", "Ab3dEf6hIj9kLm2nOp5qRs8t"),
    ("ｓｋ－ｐｒｏｊ－Ａｂ３ｄＥｆ６ｈＩｊ９ｋＬｍ２ｎＯｐ５ｑＲｓ８ｔ", "Ab3dEf6hIj"),
    ("раssword=" + _S, _S),
    ("mail ann.lee+x@example.co.uk", "ann.lee"),
    ("ann\uff20example.com", "example.com"),
    ("card 4111 1111 1111 1111 exp 12/29", "4111 1111 1111 1111"),
    ("amex 3782 822463 10005", "822463"),
    ("paid with 5555555555554444", "5555555555554444"),
    ("call +44 20 7946 0958", "7946 0958"),
)


def secret_corpus(variants: int = 40) -> list[Secret]:
    """Every secret shape, ``variants`` times each with other secrets, then the earlier
    versions' shapes."""
    rng = random.Random(SEED)
    corpus = [secret for _ in range(variants) for secret in _secret_variants(rng)]
    corpus += [Secret("earlier", value, secret) for value, secret in EARLIER]
    return corpus


def _ordinary_makers(rng: random.Random) -> list[Callable[[], Any]]:
    def digits(n: int) -> str:
        return str(rng.randrange(10 ** (n - 1), 10**n))

    def sha(n: int = 8) -> hashlib._Hash:
        return hashlib.sha256(rng.randbytes(n))

    density = ("@2x", "@3x", "@1.5x", "@2X", "@4x")
    images = ("png", "jpg", "webp", "svg", "gif", "jpeg", "avif")
    return [
        lambda: str(uuid.UUID(int=rng.getrandbits(128), version=4)),
        lambda: uuid.UUID(int=rng.getrandbits(128), version=4).hex,
        lambda: rng.getrandbits(63),  # 63-bit integer ids
        lambda: str(rng.getrandbits(63)),
        lambda: {"id": rng.getrandbits(63), "parent_id": rng.getrandbits(63)},
        lambda: digits(16),  # 16-digit order numbers
        lambda: int(digits(16)),
        lambda: {"order_id": int(digits(16)), "status": rng.choice(("paid", "shipped"))},
        lambda: f"Order #{digits(16)} has shipped",
        lambda: f"order {digits(rng.randint(13, 19))} confirmed",
        lambda: float(digits(16)),
        lambda: f"ORD-{rng.randint(2020, 2026)}-{rng.randrange(10**6):06d}",
        lambda: f"INV-{digits(8)}",
        lambda: f"tracking {digits(rng.choice((12, 15, 20, 22)))}",
        lambda: f"1Z{''.join(rng.choices(string.ascii_uppercase + string.digits, k=16))}",
        lambda: digits(13),  # EAN-13 barcodes
        lambda: f"978-{rng.randint(0, 9)}-{digits(3)}-{digits(5)}-{rng.randint(0, 9)}",
        lambda: str(rng.randrange(1_500_000_000, 1_900_000_000)),
        lambda: rng.randrange(1_500_000_000_000, 1_900_000_000_000),
        lambda: str(rng.randrange(1_500_000_000_000_000, 1_900_000_000_000_000)),
        lambda: rng.randrange(1_500_000_000 * 10**9, 1_900_000_000 * 10**9),
        lambda: (
            f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T"
            f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}."
            f"{rng.randrange(10**6):06d}Z"
        ),
        lambda: f"Sun, 06 Dec 2026 {rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00 +0000",
        lambda: f"{rng.randint(1, 28):02d}/{rng.randint(1, 12):02d}/2026 {rng.randint(0, 23)}:05",
        lambda: hashlib.md5(rng.randbytes(8), usedforsecurity=False).hexdigest(),
        lambda: hashlib.sha1(rng.randbytes(8), usedforsecurity=False).hexdigest(),
        lambda: sha().hexdigest(),
        lambda: "sha256-" + base64.b64encode(sha().digest()).decode(),
        lambda: f"sha256:{sha().hexdigest()}",
        lambda: f"nginx@sha256:{sha().hexdigest()}",
        lambda: f"commit {sha().hexdigest()[:7]}",
        lambda: f"logo{rng.choice(density)}.{rng.choice(images)}",
        lambda: f"icon-{rng.choice(('home', 'cart', 'user'))}{rng.choice(density)}.png",
        lambda: f"assets/img/avatar_{digits(6)}{rng.choice(density)}.{rng.choice(images)}",
        lambda: f"https://cdn.example.com/static/hero{rng.choice(density)}.{rng.choice(images)}",
        lambda: f"IMG_{rng.randrange(10**4):04d}.jpg",
        lambda: f"report_{rng.randint(2020, 2026)}-{rng.randint(1, 12):02d}-01.pdf",
        lambda: f"/var/data/{rng.randrange(10**6)}/part-{rng.randrange(10**5):05d}.parquet",
        lambda: f"${rng.randrange(10**4):,}.{rng.randrange(100):02d}",
        lambda: f"€{rng.randrange(10**3)},{rng.randrange(100):02d}",
        lambda: f"{rng.randrange(10**6):,}.{rng.randrange(100):02d} USD".replace(",", " "),
        lambda: round(rng.uniform(0, 10_000), 2),
        lambda: {"price": round(rng.uniform(0, 500), 2), "currency": "EUR", "qty": 2},
        lambda: rng.randrange(10**8),  # prices in cents
        lambda: f"{rng.randint(0, 9)}.{rng.randint(0, 40)}.{rng.randint(0, 200)}",
        lambda: f"lodash@{rng.randint(1, 4)}.{rng.randint(0, 17)}.{rng.randint(0, 21)}",
        lambda: f"@scope/pkg@{rng.randint(1, 9)}.{rng.randint(0, 9)}.0-rc.{rng.randint(1, 5)}",
        lambda: f"10.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(0, 255)}:8080",
        lambda: f"https://example.com/items/{digits(9)}?page={rng.randint(1, 9)}",
        lambda: f"https://example.com/search?q=red%20shoes%20{digits(4)}&sort=price%3Aasc",
        lambda: f"https://example.com/a/{digits(16)}/b%2F{digits(6)}",
        lambda: "data:image/png;base64," + base64.b64encode(rng.randbytes(96)).decode(),
        lambda: f"projects/{digits(12)}/locations/europe-west1/jobs/job-{digits(5)}",
        lambda: f"web-{rng.getrandbits(36):09x}-{rng.choice(('x2kqp', 'b7zzl', 'q0mfa'))}",
        lambda: {"max_tokens": rng.randint(1, 4096), "prompt_tokens": rng.randint(1, 9999)},
        lambda: {"token": "Hello", "logprob": -rng.random()},
        lambda: {"id": f"chatcmpl-{rng.randrange(16**20):020x}", "created": 1764720000},
        lambda: f"call_{rng.randrange(36**24):x}",
        lambda: f"the meeting is at {rng.randint(1, 12)}:{rng.randint(0, 59):02d}",
        lambda: f"tokens used: {rng.randint(1, 100000)}",
        lambda: f"pi is {rng.random() * 4:.15f}",
        lambda: rng.random() * 10 ** rng.randint(0, 18),
    ]


def ordinary_corpus(size: int = ORDINARY_SIZE) -> list[Any]:
    """``size`` realistic values that hold nothing to redact, every maker in turn."""
    rng = random.Random(SEED)
    makers = _ordinary_makers(rng)
    return [makers[i % len(makers)]() for i in range(size)]
