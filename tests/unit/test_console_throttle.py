"""The console's back-off on wrong tokens and its estimate of a token's strength,
without a server."""

from __future__ import annotations

import secrets

import pytest

from agent_blackbox.console import MIN_TOKEN_BITS, SignInThrottle, new_token, token_bits
from agent_blackbox.console._throttle import FORGET_AFTER_S, MAX_KEYS, MAX_WAIT_S


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_wait_doubles_after_three_free_failures_up_to_its_cap() -> None:
    clock = Clock()
    throttle = SignInThrottle(clock=clock)
    waits = []
    for i in range(16):
        clock.now += throttle.wait("10.0.0.1", f"guess{i:03}")
        waits.append(throttle.failed("10.0.0.1", f"guess{i:03}"))
    assert waits[:8] == [0, 0, 0, 1, 2, 4, 8, 16]
    assert waits[-1] == MAX_WAIT_S
    assert throttle.wait("10.0.0.1", "anything") == MAX_WAIT_S
    assert throttle.wait("10.0.0.2", "anything") == 0  # another address, another prefix


def test_a_quiet_key_is_forgotten_once_its_wait_is_over() -> None:
    clock = Clock()
    throttle = SignInThrottle(clock=clock)
    for i in range(5):
        clock.now += throttle.wait("10.0.0.1", f"g{i}")
        throttle.failed("10.0.0.1", f"g{i}")
    clock.now += FORGET_AFTER_S + 10
    throttle.failed("10.0.0.9", "other")  # forgetting happens as failures come in
    assert throttle.failed("10.0.0.1", "g-again") == 0  # a fresh start: free again


def test_a_flood_of_prefixes_keeps_memory_bounded_and_the_guesser_remembered() -> None:
    clock = Clock()
    throttle = SignInThrottle(clock=clock)
    for i in range(MAX_KEYS + 500):
        clock.now += throttle.wait("10.0.0.1", f"{i:08}") + 0.001
        throttle.failed("10.0.0.1", f"{i:08}")
    assert len(throttle._records) <= MAX_KEYS
    assert throttle.wait("10.0.0.1", "zzzzzzzz") > 0  # its own key is refreshed each time


@pytest.mark.parametrize(
    "weak",
    [
        "password1234password1234",
        "correct-horse-battery-staple-42",
        "abcdefghijklmnopqrstuvwxyz0123",
        "qwertyuiopasdfghjklzxcvbnm1234",
        "Tr0ub4dor&3Tr0ub4dor&3xx",
        "a-token-of-ada-long-enough-1234",
    ],
)
def test_tokens_people_make_up_are_estimated_weak(weak: str) -> None:
    assert token_bits(weak) < MIN_TOKEN_BITS


def test_generated_tokens_are_estimated_strong() -> None:
    assert min(token_bits(new_token()) for _ in range(2_000)) > 1.5 * MIN_TOKEN_BITS
    assert min(token_bits(secrets.token_urlsafe(24)) for _ in range(2_000)) >= MIN_TOKEN_BITS
