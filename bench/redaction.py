"""Redaction: precision and recall on the two corpora, and adversarial text against a 1 s
target.

Figures, each a JSON line (``bench._common.emit``):

- ``false_positive_rate`` (percent; target under 0.1): the share of the generated
  ordinary corpus (24,000 ids, order numbers, 63-bit integer ids, file names with
  ``@2x.png``, hashes, timestamps, prices, UUIDs, ...) that redaction changes;
- ``secret_misses`` (target 0): secrets of the generated secret corpus (every shape
  redaction version 3 was made for, in forty variants each, and the earlier versions'
  shapes) that survive redaction; both corpora come from a seeded generator
  (``bench._redaction_corpus``), for version 3 and, for comparison, version 2;
- ``redact_s`` per adversarial input (about 1 MB each, crafted to make a backtracking
  pattern take quadratic time, or a detector or a decoding view find and check as many
  candidates as it can) and ``worst_redact_s`` / ``worst_redact_cpu_s`` (target: 1 s;
  the worst by CPU seconds, since the bench machine is shared and wall time counts the
  others' work; each input is redacted ``--repeat`` times, 3 by default, and its best
  run counts, which leaves out what other processes took of the machine), with version
  2's worst on the same inputs for comparison;
- the redactor's cost on a typical tool-call value in microseconds, beside version 2's
  and version 1's.

    python -m bench.redaction [--size 1000000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import base64
import json
import time
from collections.abc import Callable, Sequence

from agent_blackbox.outbox._redaction import Redactor
from agent_blackbox.outbox._scrub import Scrub
from agent_blackbox.schemas import canonical_text
from bench._common import emit, progress
from bench._redaction_corpus import ordinary_corpus, secret_corpus

BENCH = "redaction"
TARGET_S = 1.0
TARGET_FALSE_POSITIVE_PERCENT = 0.1
_ADVERSARIAL: dict[str, str] = {
    "xoxb_run": "xoxb-",
    "jwt_prefix_run": "eyJ-",
    "digits_spaced": "1 ",
    "digits_grouped": "4111 ",
    "digits_long": "1",
    "phone_like": "0123456 ",
    "phone_plus": "+1234567 ",
    "emails": "a@b.cd ",
    "email_dots": "a.",
    "pairs_rejected": "key=v ",
    "pairs_accepted": "password=",
    "query_string": "a=b&api_key=",
    "userinfo": "https://a:",
    "bearer_words": "Bearer abcdefgh1 ",
    "pem_begin": "-----BEGIN PRIVATE KEY-----",
    "json_nesting": '{"a":',
    "zero_width": "s\u200bk-",
    "fullwidth": "ｓｋ－ａ＠",
    "cyrillic": "ѕk-аbс ",
    # Version 3: what its decoding views and context checks make it look at.
    "percent_run": "%41",
    "percent_mixed": "a%5F",
    "percent_names": "api%5Fkey=x&",
    "percent_emails": "a%40b.cd ",
    "percent_twice": "%255F",
    "data_urls": "data:;base64,QQ== ",
    "key_breaks": "sk-\n",
    "key_lines": "sk-proj-abc\n",
    "selectors": "s\ufe0fk-",
    "tags": "\U000e0041a",
    "idn_emails": "用户@例子.广告 ",
    "unicode_emails": "é@é.éé ",
    "densities": "logo@2x.png ",
    "card_context": "card 4111111111111111 ",
    "cards_dotted": "4111.1111.1111.1111 ",
    "escaped_pairs": '\\"password\\": \\"',
}
TYPICAL = {
    "args": ["order 8812", {"customer": "c-1042", "note": "ship to dock 4 by 2026-12-03"}],
    "kwargs": {"arguments": '{"city": "Lyon", "units": "metric"}', "limit": 20},
}


def _inputs(size: int) -> dict[str, str]:
    inputs = {name: (unit * (size // len(unit) + 1))[:size] for name, unit in _ADVERSARIAL.items()}
    inputs["xoxb_run"] = ("xoxb-" * (80_000 // 5)) + "_"  # the 80 KB case of the issue
    pairs = ("password=x " * (size // 15))[: size * 3 // 4]
    inputs["data_url_text"] = "data:text/plain;base64," + base64.b64encode(pairs.encode()).decode()
    inputs["data_url_binary"] = "data:image/png;base64," + base64.b64encode(
        bytes(range(256)) * (size * 3 // 4 // 256)
    ).decode(encoding="ascii")
    inputs["json_twice"] = json.dumps(json.dumps({"a": pairs}))
    return inputs


def _per_call_us(redact: Callable[[object], object], n: int = 20_000) -> float:
    started = time.perf_counter()
    for _ in range(n):
        redact(TYPICAL)
    return (time.perf_counter() - started) / n * 1e6


def _corpora(version: int) -> None:
    """The false-positive rate on the ordinary corpus and the misses of the secret one."""
    redactor = Redactor(version=version)
    scrub = Scrub(redactor)
    ordinary = ordinary_corpus()
    changed = sum(1 for value in ordinary if redactor.redact(value).value != value)
    secrets = secret_corpus()
    missed = 0
    for item in secrets:
        out = scrub.response(item.value, set()) if item.stream else redactor.redact(item.value)
        missed += item.secret in canonical_text(out.value if not item.stream else out)
    targets = version == 3  # version 2 is printed for comparison only
    emit(
        BENCH,
        "false_positive_rate",
        changed / len(ordinary) * 100,
        unit="%",
        target=TARGET_FALSE_POSITIVE_PERCENT if targets else None,
        at_least=False,
        version=version,
        corpus=len(ordinary),
        changed=changed,
    )
    emit(
        BENCH,
        "secret_misses",
        missed,
        unit="secrets",
        target=0 if targets else None,
        at_least=False,
        version=version,
        corpus=len(secrets),
    )


def _adversarial(size: int, repeat: int) -> None:
    """Each adversarial input redacted whole, ``repeat`` times (its best run counts);
    the worst of them against the target, and version 2's worst on the same inputs
    beside it (the same machine, the same load)."""
    inputs = _inputs(size)
    for version in (3, 2):
        redactor = Redactor(version=version)
        worst = ("", 0.0, 0.0)
        with progress() as bar:
            task = bar.add_task(f"adversarial inputs, version {version}", total=len(inputs))
            for name, text in inputs.items():
                seconds, cpu_seconds = _best_run(redactor, text, repeat)
                if version == 3:
                    emit(
                        BENCH,
                        "redact_s",
                        seconds,
                        unit="s",
                        target=TARGET_S,
                        at_least=False,
                        input=name,
                    )
                worst = max(worst, (name, seconds, cpu_seconds), key=lambda w: w[2])
                bar.advance(task)
        name, seconds, cpu_seconds = worst
        target = TARGET_S if version == 3 else None
        emit(
            BENCH,
            "worst_redact_s",
            seconds,
            unit="s",
            target=target,
            at_least=False,
            input=name,
            version=version,
        )
        emit(
            BENCH,
            "worst_redact_cpu_s",
            cpu_seconds,
            unit="s",
            target=target,
            at_least=False,
            input=name,
            version=version,
        )


def _best_run(redactor: Redactor, text: str, repeat: int) -> tuple[float, float]:
    """The wall and CPU seconds of the best of ``repeat`` redactions of ``text`` (by CPU
    time)."""
    best = (0.0, float("inf"))
    for _ in range(repeat):
        started, cpu = time.perf_counter(), time.process_time()
        redactor.redact(text)
        run = (time.perf_counter() - started, time.process_time() - cpu)
        best = min(best, run, key=lambda r: r[1])
    return best


def main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.redaction")
    parser.add_argument("--size", type=int, default=1_000_000, help="characters per input")
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs of each adversarial input (the best counts)"
    )
    args = parser.parse_args(argv)
    for version in (3, 2):
        _corpora(version)
    _adversarial(args.size, max(1, args.repeat))
    for version in (3, 2, 1):
        redact = Redactor(version=version).redact
        emit(BENCH, "typical_value_us", _per_call_us(redact), unit="us", version=version)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
