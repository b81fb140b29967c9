"""A console token cannot be guessed: guesses are slowed exponentially, and weak tokens
never get in.

The console runs over the real views as a reader login, with a token file. Attacks:
- a guesser at one address posts wrong tokens to the sign-in form as fast as the console
  lets it, retrying the moment it is told it may; over a simulated hour, the guesses the
  console actually looks at are counted per minute (the console's clock is the test's,
  so the hour takes no hour);
- the same guesser, once told to wait, sends the right token, by the form and as a
  bearer token: refused too, so a guess teaches it nothing while it waits;
- fifty addresses guess tokens sharing one known prefix: slowed as one guesser;
- a token file with a made-up token (``password1234password1234``) is refused at
  start, naming its entry and never showing the token; ``blackbox web --new-token``
  writes a generated one that is accepted.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine
from starlette.testclient import TestClient

from agent_blackbox.cli import main
from agent_blackbox.console import (
    ConsoleAuthError,
    SignInThrottle,
    StaticTokens,
    create_app,
    new_token,
)
from agent_blackbox.consumers import migrate_views
from agent_blackbox.schemas import Settings
from tests.conftest import Login

pytestmark = pytest.mark.integration

TOKEN = "Ju8izountVIkrVlEzZxoU9Nf_o5BaX_Z"
REQUEST_S = 0.05
"""How long one request takes the guesser (simulated)."""
_WAIT = re.compile(r"wait (\d+) seconds?")


class Clock:
    """The console's monotonic clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def _console(settings: Settings, reader: Engine, clock: Clock) -> StaticTokens:
    migrate_views(settings.database_url)
    return StaticTokens({"ada": TOKEN}, throttle=SignInThrottle(clock=clock))


def _client(settings: Settings, reader: Engine, tokens: StaticTokens, address: str) -> TestClient:
    app = create_app(settings, reader, tokens)
    return TestClient(app, client=(address, 40000), base_url="http://127.0.0.1:8765")


def _guess(client: TestClient, token: str) -> tuple[int, int]:
    """Post ``token`` to the sign-in form: the status, and the seconds it was told to wait."""
    answer = client.post("/login", data={"token": token, "next": "/runs"}, follow_redirects=False)
    told = _WAIT.search(answer.text)
    return answer.status_code, int(told.group(1)) if told else 0


def _attack(
    clock: Clock, guessers: list[TestClient], seconds: float, token: Callable[[int], str]
) -> list[float]:
    """Guess for ``seconds`` of simulated time, each guesser retrying as soon as it is
    allowed; the times at which the console looked at a guess (and said 401)."""
    looked_at: list[float] = []
    start, due = clock.now, [clock.now] * len(guessers)
    while min(due) < start + seconds:
        turn = due.index(min(due))
        clock.now = max(clock.now, due[turn])
        status, wait = _guess(guessers[turn], token(len(looked_at)))
        assert status in (401, 429)
        if status == 401:
            looked_at.append(clock.now - start)
        clock.now += REQUEST_S
        due[turn] = clock.now + wait
    return looked_at


def _per_minute(times: list[float], minutes: int) -> list[int]:
    return [sum(60 * m <= t < 60 * (m + 1) for t in times) for m in range(minutes)]


def test_a_guesser_gets_a_handful_of_guesses_a_minute_then_fewer(
    settings: Settings, login: Login
) -> None:
    reader, clock = login("blackbox_reader", tenant="*"), Clock()
    tokens = _console(settings, reader, clock)
    guesser = _client(settings, reader, tokens, "203.0.113.9")

    looked_at = _attack(clock, [guesser], 3600, lambda i: os.urandom(16).hex())

    per_minute = _per_minute(looked_at, 60)
    assert per_minute[0] <= 10, per_minute  # typos are free, then the wait doubles
    assert max(per_minute[10:]) <= 1, per_minute
    assert len(looked_at) <= 16, looked_at  # in the whole hour (it was 5 a minute: 300)


def test_the_right_token_is_refused_while_its_sender_must_wait(
    settings: Settings, login: Login
) -> None:
    reader, clock = login("blackbox_reader", tenant="*"), Clock()
    tokens = _console(settings, reader, clock)
    guesser = _client(settings, reader, tokens, "203.0.113.9")
    answers = [_guess(guesser, f"wrong-{i}-{os.urandom(8).hex()}")[0] for i in range(4)]
    assert answers == [401, 401, 401, 401]

    assert _guess(guesser, TOKEN) == (429, 1)
    bearer = guesser.get("/runs", headers={"Authorization": f"Bearer {TOKEN}"})
    assert bearer.status_code == 429
    assert "wait 1 second" in bearer.text
    clock.now += 1  # waited as told: the right token signs in, the pages read the views
    assert _guess(guesser, TOKEN)[0] == 303
    assert guesser.get("/runs").status_code == 200


def test_many_addresses_guessing_one_prefix_are_slowed_as_one(
    settings: Settings, login: Login
) -> None:
    reader, clock = login("blackbox_reader", tenant="*"), Clock()
    tokens = _console(settings, reader, clock)
    botnet = [_client(settings, reader, tokens, f"198.51.100.{i}") for i in range(1, 51)]
    known = TOKEN[:6]  # say the first characters leaked, from a screenshot

    looked_at = _attack(clock, botnet, 600, lambda i: known + os.urandom(16).hex())

    assert len(looked_at) <= 13, _per_minute(looked_at, 10)


def test_a_made_up_token_is_refused_and_a_generated_one_takes_its_place(
    tmp_path: Path,
) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"ada {TOKEN}\neve password1234password1234\n")
    path.chmod(stat.S_IRUSR | stat.S_IWUSR)
    with pytest.raises(ConsoleAuthError, match="token of eve is too weak") as refused:
        StaticTokens.from_file(path)
    assert "password1234" not in str(refused.value)
    assert "--new-token eve" in str(refused.value)
    for weak in ("correct-horse-battery-staple-42", "Tr0ub4dor&3Tr0ub4dor&3xx", "a" * 40):
        with pytest.raises(ConsoleAuthError):
            StaticTokens({"eve": weak})

    env = {"BLACKBOX_DATABASE_URL": "postgresql+psycopg://nobody@127.0.0.1:9/none"}
    started = CliRunner(env=env).invoke(main, ["web", "--token-file", str(path)])
    assert started.exit_code == 2
    assert "eve" in started.output
    assert "password1234" not in started.output

    made = CliRunner().invoke(main, ["web", "--token-file", str(path), "--new-token", "eve"])
    assert made.exit_code == 0, made.output
    fresh = made.stdout.strip()
    loaded = StaticTokens.from_file(path)
    assert loaded.check_token(fresh) == "eve"
    assert loaded.check_token(TOKEN) == "ada"
    assert "password1234" not in path.read_text()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    StaticTokens({f"viewer{i}": new_token() for i in range(1_000)})  # generated: all pass
