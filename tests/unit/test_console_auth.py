"""The console's gate without a database: who is let in, the security headers on every
answer, sign-in, sessions, forms from other sites. (Pages that read the views answer
503 here: the database URL points nowhere.)"""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine
from starlette.testclient import TestClient

from agent_blackbox.console import (
    CSP,
    ConsoleAuthError,
    LoopbackOnly,
    SignInThrottle,
    StaticTokens,
    TrustedProxyHeader,
    create_app,
)
from agent_blackbox.schemas import Settings

TOKEN = "Ju8izountVIkrVlEzZxoU9Nf_o5BaX_Z"  # generated: weak ones are refused
TOKEN_B = "CWZkispZHmPKE17nwhRP73aVeGITtykL"
NOWHERE = "postgresql+psycopg://nobody@127.0.0.1:9/none?connect_timeout=1"


def _client(
    auth: object,
    *,
    client: tuple[str, int] = ("127.0.0.1", 5000),
    hosts: tuple[str, ...] = (),
    base_url: str = "http://127.0.0.1:8765",
) -> TestClient:
    app = create_app(Settings(), create_engine(NOWHERE), auth, allowed_hosts=hosts)  # type: ignore[arg-type]
    return TestClient(app, client=client, base_url=base_url, follow_redirects=False)


def test_without_authentication_a_client_off_this_machine_is_refused() -> None:
    outside = _client(LoopbackOnly(), client=("203.0.113.7", 40000))
    answer = outside.get("/runs", headers={"X-Forwarded-For": "127.0.0.1"})
    assert answer.status_code == 403
    assert "serves its own machine only" in answer.text
    assert answer.headers["content-security-policy"] == CSP

    local = _client(LoopbackOnly(), client=("::1", 40000))
    answer = local.get("/runs")
    assert answer.status_code == 503  # let in; the views are not there
    assert "could not be read" in answer.text


@pytest.mark.parametrize("path", ["/runs", "/runs/x", "/charts", "/static/console.css", "/nope"])
def test_every_answer_carries_the_security_headers(path: str) -> None:
    answer = _client(LoopbackOnly()).get(path)
    assert answer.headers["content-security-policy"] == CSP
    assert "script-src" not in CSP  # default-src 'none' forbids every script
    assert answer.headers["x-content-type-options"] == "nosniff"
    assert answer.headers["x-frame-options"] == "DENY"
    assert answer.headers["cache-control"] == "no-store"


def test_a_browser_signs_in_with_its_token_and_gets_a_strict_session() -> None:
    client = _client(StaticTokens({"ada": TOKEN}))
    assert client.get("/runs").headers["location"] == "/login?next=%2Fruns"
    refused = client.post("/login", data={"token": "guess", "next": "/runs"})
    assert refused.status_code == 401
    signed = client.post("/login", data={"token": TOKEN, "next": "//evil.example/x"})
    assert signed.status_code == 303
    assert signed.headers["location"] == "/runs"  # never a redirect off the console
    cookie = signed.headers["set-cookie"]
    assert "httponly" in cookie.lower()
    assert "samesite=strict" in cookie.lower()
    assert TOKEN not in cookie
    assert client.get("/runs").status_code == 503  # in: the views are not there


def test_a_forged_or_foreign_session_is_refused() -> None:
    tokens = StaticTokens({"ada": TOKEN, "bob": TOKEN_B})
    client = _client(tokens)
    good = tokens.session_cookie("ada")
    _name, expires, nonce, mac = good.split("|")
    for forged in (
        f"bob|{expires}|{nonce}|{mac}",
        f"ada|{int(expires) + 999}|{nonce}|{mac}",
        f"ada|{expires}|other|{mac}",
        "ada",
        "",
    ):
        client.cookies.set("blackbox_session", forged)
        assert client.get("/runs").status_code == 303  # back to sign-in
    other = StaticTokens({"ada": TOKEN})  # another console process: another key
    client.cookies.set("blackbox_session", other.session_cookie("ada"))
    assert client.get("/runs").status_code == 303


def test_a_script_sends_a_bearer_token() -> None:
    client = _client(StaticTokens({"ada": TOKEN}))
    assert client.get("/runs", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert client.get("/runs", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 503


def test_a_body_form_posted_from_another_site_is_refused() -> None:
    tokens = StaticTokens({"ada": TOKEN})
    client = _client(tokens)
    client.cookies.set("blackbox_session", tokens.session_cookie("ada"))
    purpose = {"purpose": "reading it", "csrf": "x"}
    for headers in (
        {"Origin": "https://evil.example"},
        {"Origin": "null"},
        {"Sec-Fetch-Site": "cross-site"},
        {},  # same site, but no session token in the form
    ):
        answer = client.post("/runs/r1/events/1/body", data=purpose, headers=headers)
        assert answer.status_code == 403


def test_a_proxy_header_is_believed_from_the_proxy_only() -> None:
    auth = TrustedProxyHeader("X-Forwarded-User", ["10.0.0.5"])
    direct = _client(auth, client=("10.0.0.9", 1234))
    assert direct.get("/runs", headers={"X-Forwarded-User": "ada"}).status_code == 403
    proxied = _client(auth, client=("10.0.0.5", 1234))
    assert proxied.get("/runs").status_code == 401
    assert proxied.get("/runs", headers={"X-Forwarded-User": "ada<script>"}).status_code == 401
    assert proxied.get("/runs", headers={"X-Forwarded-User": "ada"}).status_code == 503


def test_a_token_file_must_be_owner_only_and_well_formed(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"ada {TOKEN}\n")
    path.chmod(0o644)
    with pytest.raises(ConsoleAuthError, match="chmod 600"):
        StaticTokens.from_file(path)
    path.chmod(stat.S_IRUSR | stat.S_IWUSR)
    assert StaticTokens.from_file(path).check_token(TOKEN) == "ada"
    path.write_text(f"ada {TOKEN} extra\n")
    with pytest.raises(ConsoleAuthError, match="line 1") as caught:
        StaticTokens.from_file(path)
    assert TOKEN not in str(caught.value)
    with pytest.raises(ConsoleAuthError, match="at least 24"):
        StaticTokens({"ada": "short"})


def test_a_page_that_fails_answers_without_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("secret detail of a broken page")

    monkeypatch.setattr("agent_blackbox.console._app.list_runs_txn", broken)
    app = create_app(Settings(), create_engine(NOWHERE), LoopbackOnly())
    client = TestClient(
        app, client=("127.0.0.1", 1), base_url="http://127.0.0.1", raise_server_exceptions=False
    )
    with monkeypatch.context() as patch:
        patch.setattr("sqlalchemy.engine.Engine.connect", lambda _self: _NoConnection())
        answer = client.get("/runs")
    assert answer.status_code == 500
    assert "secret detail" not in answer.text
    assert "Traceback" not in answer.text
    assert answer.headers["content-security-policy"] == CSP


class _NoConnection:
    def __enter__(self) -> _NoConnection:
        return self

    def __exit__(self, *_exc: object) -> None:
        return None


@pytest.mark.parametrize("host", ["evil.example:8765", "evil.example", "127.0.0.1.evil.example"])
def test_without_authentication_a_page_under_another_name_is_refused(host: str) -> None:
    # DNS rebinding: a site the local user visits resolves its own name to 127.0.0.1.
    answer = _client(LoopbackOnly()).get("/runs", headers={"Host": host})
    assert answer.status_code == 403
    assert "localhost and loopback addresses only" in answer.text
    for local in ("localhost:8765", "127.0.0.1:8765", "[::1]:8765"):
        assert _client(LoopbackOnly()).get("/runs", headers={"Host": local}).status_code == 503


def test_the_allowed_host_names_are_the_only_ones_answered() -> None:
    tokens = StaticTokens({"ada": TOKEN})
    client = _client(tokens, hosts=("console.example",), base_url="http://console.example")
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    assert client.get("/runs", headers=bearer).status_code == 503
    wrong = client.get("/runs", headers={**bearer, "Host": "evil.example"})
    assert wrong.status_code == 400
    assert "console.example only" in wrong.text


def test_signing_out_ends_the_session_for_good() -> None:
    tokens = StaticTokens({"ada": TOKEN})
    client = _client(tokens)
    session = tokens.session_cookie("ada")
    client.cookies.set("blackbox_session", session)
    assert client.get("/runs").status_code == 503
    csrf = tokens.csrf_token(session)
    assert client.post("/logout", data={"csrf": csrf}).status_code == 303
    client.cookies.set("blackbox_session", session)  # the old cookie, kept by an attacker
    assert client.get("/runs").status_code == 303


def test_sign_in_backs_off_after_repeated_failures() -> None:
    now = [0.0]
    tokens = StaticTokens({"ada": TOKEN}, throttle=SignInThrottle(clock=lambda: now[0]))
    client = _client(tokens)
    answers = [client.post("/login", data={"token": f"guess-{i}"}).status_code for i in range(5)]
    assert answers == [401] * 4 + [429]  # three free, then a second's wait
    # While it waits, the right token is refused too: trying teaches a guesser nothing.
    refused = client.post("/login", data={"token": TOKEN})
    assert refused.status_code == 429
    assert "wait 1 second " in refused.text
    bearer = client.get("/runs", headers={"Authorization": f"Bearer {TOKEN}"})
    assert bearer.status_code == 429
    now[0] += 1
    assert client.post("/login", data={"token": TOKEN}).status_code == 303
    # Another address, with another token prefix, is not slowed by the guesser.
    other = _client(tokens, client=("127.0.0.2", 5000))
    assert other.get("/runs", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 503


def test_a_user_named_twice_by_the_proxy_is_refused() -> None:
    auth = TrustedProxyHeader("X-Forwarded-User", ["10.0.0.5"])
    proxied = _client(auth, client=("10.0.0.5", 1234))
    twice = [("X-Forwarded-User", "ada"), ("X-Forwarded-User", "mallory")]
    assert proxied.get("/runs", headers=twice).status_code == 401


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda: TrustedProxyHeader("X-User", ["0.0.0.0/0"]), "almost"),
        (lambda: TrustedProxyHeader("X-User", ["::/0"]), "almost"),
        (lambda: StaticTokens({"ada": TOKEN, "bob": TOKEN}), "share a token"),
        (lambda: StaticTokens({"ada": "a" * 30}), "repeats"),
    ],
)
def test_unsafe_authentication_settings_are_refused(make: Any, named: str) -> None:
    with pytest.raises(ConsoleAuthError, match=named):
        make()


def test_a_filter_with_a_control_character_is_bad_input_and_the_form_stays() -> None:
    answer = _client(LoopbackOnly()).get("/runs", params={"agent": "a\x00b"})
    assert answer.status_code == 400
    assert "control or invisible character" in answer.text
    assert 'id="filters"' in answer.text


def test_an_unknown_page_is_the_console_s_own_404() -> None:
    answer = _client(LoopbackOnly()).get("/runs/r1/events/-1")
    assert answer.status_code == 404
    assert "no such page" in answer.text
    assert answer.headers["content-security-policy"] == CSP


def test_a_sign_in_keeps_the_filters_of_the_page_asked_for() -> None:
    answer = _client(StaticTokens({"ada": TOKEN})).get("/runs?agent=a&since=1h")
    assert answer.headers["location"] == "/login?next=%2Fruns%3Fagent%3Da%26since%3D1h"


@pytest.mark.parametrize(
    "query", ["since=999999d", "limit=%C2%B2", "after_at=2026-12-05T00:00&after_id=a%00b"]
)
def test_odd_filters_are_bad_input_not_failures(query: str) -> None:
    assert _client(LoopbackOnly()).get(f"/runs?{query}").status_code == 400


@pytest.mark.parametrize("query", ["until=2h", "since=2h&until=30m", "until=2026-12-01T10:00"])
def test_until_takes_a_span_back_from_now_as_since_does(query: str) -> None:
    answer = _client(LoopbackOnly()).get(f"/runs?{query}")
    assert answer.status_code == 503, answer.text  # past the filters: no database here


def test_a_bad_until_says_which_forms_it_takes() -> None:
    answer = _client(LoopbackOnly()).get("/runs?until=2x")
    assert answer.status_code == 400
    assert "until: give a time like 2026-12-01T10:00 or a span like 6h" in answer.text


def test_a_trailing_dot_on_localhost_is_still_local() -> None:
    answer = _client(LoopbackOnly()).get("/runs", headers={"Host": "localhost.:8765"})
    assert answer.status_code == 503
