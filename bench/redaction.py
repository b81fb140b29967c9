"""Redaction of adversarial text: each input redacted whole, against a 1 s target.

Each input is about 1 MB, crafted to make a backtracking pattern take quadratic time or
to make a detector find (and check) as many candidates as it can. Figures: seconds per
input (target: under 1 s each), and the redactor's cost on a typical tool-call value in
microseconds, beside the version 1 detectors on the same value.

    python -m bench.redaction [--size 1000000]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence

from agent_blackbox.outbox._redaction import Redactor
from bench._common import emit, progress

BENCH = "redaction"
TARGET_S = 1.0
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
}
TYPICAL = {
    "args": ["order 8812", {"customer": "c-1042", "note": "ship to dock 4 by 2026-12-03"}],
    "kwargs": {"arguments": '{"city": "Lyon", "units": "metric"}', "limit": 20},
}


def _inputs(size: int) -> dict[str, str]:
    inputs = {name: (unit * (size // len(unit) + 1))[:size] for name, unit in _ADVERSARIAL.items()}
    inputs["xoxb_run"] = ("xoxb-" * (80_000 // 5)) + "_"  # the 80 KB case of the issue
    return inputs


def _per_call_us(redact: Callable[[object], object], n: int = 20_000) -> float:
    started = time.perf_counter()
    for _ in range(n):
        redact(TYPICAL)
    return (time.perf_counter() - started) / n * 1e6


def main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.redaction")
    parser.add_argument("--size", type=int, default=1_000_000, help="characters per input")
    args = parser.parse_args(argv)
    redactor = Redactor()
    inputs = _inputs(args.size)
    with progress() as bar:
        task = bar.add_task("adversarial inputs", total=len(inputs))
        for name, text in inputs.items():
            started = time.perf_counter()
            redactor.redact(text)
            seconds = time.perf_counter() - started
            emit(BENCH, "redact_s", seconds, unit="s", target=TARGET_S, at_least=False, input=name)
            bar.advance(task)
    emit(BENCH, "typical_value_us", _per_call_us(redactor.redact), unit="us", version=2)
    emit(BENCH, "typical_value_us", _per_call_us(Redactor(version=1).redact), unit="us", version=1)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
