"""Who is looking: the console's authentication port and its three adapters.

An :class:`Authenticator` turns a request into a :class:`Viewer` or refuses it. The
console ships:

- :class:`StaticTokens`: named tokens from an owner-only file; a browser signs in once
  with its token and gets a signed, HTTP-only, same-site session cookie; a script sends
  ``Authorization: Bearer <token>``;
- :class:`TrustedProxyHeader`: a reverse proxy in front (an SSO gateway) names the user
  in a header; the header is believed only from the proxy's own addresses;
- :class:`LoopbackOnly`: no authentication at all, for a console on the operator's own
  machine: every client that is not on a loopback address is refused.

Who may see what is the database's business: the console's login sees the tenants it is
granted, and bodies open only for a login that may unwrap the run's key.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import os
import re
import secrets
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

from starlette.requests import HTTPConnection

from agent_blackbox.schemas import OWNER_ONLY_FORBIDDEN, BlackboxError, read_checked_file

SESSION_COOKIE = "blackbox_session"
SESSION_SECONDS = 8 * 3600
_IPV4_MAPPED = ipaddress.ip_network("::ffff:0:0/96")
SIGN_IN_FAILURES = 5
SIGN_IN_WINDOW_S = 60.0
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")


class ConsoleAuthError(BlackboxError):
    """The console's authentication is set up wrongly (a token file, a proxy address)."""


@dataclass(frozen=True, slots=True)
class Viewer:
    """Someone the console let in: the name the audit records beside each purpose."""

    name: str
    via: str


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request was not let in, and whether signing in would help."""

    status: int
    reason: str
    can_sign_in: bool = False


class Authenticator(Protocol):
    """The port: who made ``request``, or why it is refused."""

    def authenticate(self, request: HTTPConnection) -> Viewer | Refusal: ...

    @property
    def description(self) -> str:
        """One line for the startup banner: how viewers are authenticated."""
        ...


def request_host(request: HTTPConnection) -> str | None:
    """The host name the client asked for (the ``Host`` header without its port, IPv6
    without brackets, lower case), or None when there is no usable one."""
    raw = request.headers.get("host", "")
    if not raw or any(c in raw for c in "/?#@\\ "):
        return None
    try:
        name = urlsplit(f"//{raw}").hostname
    except ValueError:
        return None
    return name.removesuffix(".") if name else None  # "localhost." is "localhost"


def is_loopback_name(host: str | None) -> bool:
    """Whether ``host`` (a requested host name) names this machine: ``localhost`` or a
    loopback address. A page that reaches the console under any other name came through
    a name someone else controls (DNS rebinding)."""
    return host == "localhost" or is_loopback(host)


def is_loopback(host: str | None) -> bool:
    """Whether ``host`` (a client's address) is a loopback address."""
    if not host:
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class LoopbackOnly:
    """No authentication: clients on a loopback address only (``127.0.0.0/8``, ``::1``).

    The address is the socket's peer (the console never believes forwarding headers),
    so a browser on the same machine is let in and anything else is refused. Do not put
    a reverse proxy on the same machine in front of it: use a token or the proxy header.
    """

    description = "none: loopback clients only (no token configured)"

    def authenticate(self, request: HTTPConnection) -> Viewer | Refusal:
        host = request.client.host if request.client else None
        if not is_loopback(host):
            return Refusal(
                403,
                "this console runs without authentication and serves its own machine only; "
                "start it with --token-file (or behind a trusted proxy) to serve others",
            )
        if not is_loopback_name(request_host(request)):
            return Refusal(
                403,
                "this console answers to localhost and loopback addresses only; open it as "
                f"http://127.0.0.1:{request.url.port or 80}{request.url.path} (another name "
                "may be a page that rebinds its DNS)",
            )
        return Viewer("local", "loopback")


class StaticTokens:
    """Named static tokens, read from an owner-only file of ``name token`` lines
    (``#`` starts a comment). Tokens are compared in constant time; sessions are signed
    with a key made at start, so a restart signs everyone out."""

    description = "static tokens (sign in with a token; scripts send a bearer token)"

    def __init__(self, tokens: Mapping[str, str], *, session_key: bytes | None = None) -> None:
        if not tokens:
            raise ConsoleAuthError("the token file names no token; add a line `name token`")
        for name, token in tokens.items():
            if _NAME.fullmatch(name) is None:
                raise ConsoleAuthError(
                    f"token name {name!r}: use 1-64 letters, digits, and _ . @ -"
                )
            if len(token) < 24:
                raise ConsoleAuthError(
                    f"the token of {name} is {len(token)} characters; use at least 24 random "
                    "ones (`python -c 'import secrets; print(secrets.token_urlsafe())'`)"
                )
            if len(set(token)) < 8:
                raise ConsoleAuthError(
                    f"the token of {name} repeats a few characters; use a random one"
                )
        if len(set(tokens.values())) != len(tokens):
            raise ConsoleAuthError(
                "two names share a token: give each viewer a token of their own, so the "
                "audit can tell who read what"
            )
        self._tokens = {
            name: hashlib.sha256(token.encode("utf-8")).digest() for name, token in tokens.items()
        }
        self._key = session_key or secrets.token_bytes(32)
        self._revoked: dict[str, float] = {}
        self._failures: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_file(cls, path: Path) -> StaticTokens:
        """The tokens of ``path``, which must be owner-only (mode 0600 or stricter).

        Raises:
            ConsoleAuthError: the file cannot be read, is readable by others, or has a
                malformed line (named by its number, never its content).
        """
        raw = read_checked_file(
            path,
            what="console token file",
            forbidden=OWNER_ONLY_FORBIDDEN,
            refusal="is readable or writable by others (mode {mode}), and whoever reads it "
            "can sign in to the console; restrict it with `chmod 600 {path}`",
            unsafe=ConsoleAuthError,
            unreadable=ConsoleAuthError,
        )
        tokens: dict[str, str] = {}
        for number, line in enumerate(raw.decode("utf-8", "replace").splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split()
            if len(parts) != 2:
                raise ConsoleAuthError(f"{path} line {number}: expected `name token`")
            if parts[0] in tokens:
                raise ConsoleAuthError(f"{path} line {number}: {parts[0]} is named twice")
            tokens[parts[0]] = parts[1]
        return cls(tokens)

    def check_token(self, token: str) -> str | None:
        """The name ``token`` belongs to, or None."""
        offered = hashlib.sha256(token.encode("utf-8")).digest()
        found = None
        for name, known in self._tokens.items():  # every one compared: no early exit
            if hmac.compare_digest(offered, known):
                found = name
        return found

    def session_cookie(self, name: str, *, now: float | None = None) -> str:
        """A signed session value for ``name``, valid :data:`SESSION_SECONDS` or until
        signed out (:meth:`end_session`)."""
        expires = int((now or time.time()) + SESSION_SECONDS)
        payload = f"{name}|{expires}|{secrets.token_urlsafe(12)}"
        return f"{payload}|{self._sign(payload)}"

    def end_session(self, value: str) -> None:
        """Sign the session ``value`` out: it is refused from now on (until it would have
        expired anyway; a restart ends every session)."""
        parts = value.split("|")
        if self._session(value) is None or len(parts) != 4:
            return
        now = time.time()
        with self._lock:
            self._revoked = {n: t for n, t in self._revoked.items() if t > now}
            self._revoked[parts[2]] = float(parts[1])

    def throttled(self, client: str) -> bool:
        """Whether ``client`` failed to sign in :data:`SIGN_IN_FAILURES` times within the
        last :data:`SIGN_IN_WINDOW_S` seconds: its wrong tokens are then answered "wait"
        (429) until a minute has passed since the fifth. A right token is always let in
        (a token of 24 random characters is not found by guessing; the wait only slows
        guessing down), so whoever shares an address with a guesser is not locked out."""
        now = time.monotonic()
        with self._lock:
            failures = self._failures.get(client)
            while failures and failures[0] < now - SIGN_IN_WINDOW_S:
                failures.popleft()
            return failures is not None and len(failures) >= SIGN_IN_FAILURES

    def failed_sign_in(self, client: str) -> None:
        """Count a failed sign-in (or bearer token) of ``client``."""
        with self._lock:
            failures = self._failures.pop(client, None) or deque(maxlen=SIGN_IN_FAILURES)
            failures.append(time.monotonic())
            self._failures[client] = failures  # most recent last: the oldest go first
            while len(self._failures) > 10_000:
                del self._failures[next(iter(self._failures))]

    def csrf_token(self, session: str) -> str:
        """The token a form of this session must carry back."""
        return self._sign(f"csrf|{session}")

    def _sign(self, payload: str) -> str:
        mac = hmac.new(self._key, payload.encode("utf-8"), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac).decode("ascii").rstrip("=")

    def _session(self, value: str) -> str | None:
        parts = value.split("|")
        if len(parts) != 4:
            return None
        name, expires, nonce, mac = parts
        if not hmac.compare_digest(mac, self._sign(f"{name}|{expires}|{nonce}")):
            return None
        if not expires.isdigit() or int(expires) < time.time() or name not in self._tokens:
            return None
        with self._lock:
            if nonce in self._revoked:
                return None
        return name

    def authenticate(self, request: HTTPConnection) -> Viewer | Refusal:
        header = request.headers.get("authorization", "")
        if header.lower().startswith("bearer "):
            name = self.check_token(header[7:].strip())
            if name is not None:
                return Viewer(name, "token")
            client = request.client.host if request.client else "?"
            if self.throttled(client):
                return Refusal(429, "too many wrong tokens from here; wait a minute")
            self.failed_sign_in(client)
            return Refusal(401, "the bearer token is not one of this console's tokens")
        cookie = request.cookies.get(SESSION_COOKIE)
        name = None if cookie is None else self._session(cookie)
        if name is None:
            return Refusal(401, "sign in with your console token", can_sign_in=True)
        return Viewer(name, "session")


class TrustedProxyHeader:
    """The user named by a reverse proxy in ``header``, believed only when the request
    comes straight from one of ``proxies`` (addresses or networks); any other client is
    refused, with or without the header."""

    def __init__(self, header: str, proxies: Iterable[str]) -> None:
        self.header = header.lower()
        try:
            self._proxies = [ipaddress.ip_network(p, strict=False) for p in proxies]
        except ValueError as exc:
            raise ConsoleAuthError(f"a trusted proxy address is not an address: {exc}") from exc
        if not self._proxies:
            raise ConsoleAuthError("name the proxy's address with --trusted-proxy")
        for network in self._proxies:
            mapped = network.version == 6 and network.subnet_of(_IPV4_MAPPED)  # type: ignore[arg-type]
            widest = 8 if network.version == 4 else 104 if mapped else 32
            if network.prefixlen < widest:
                raise ConsoleAuthError(
                    f"--trusted-proxy {network} would believe the header from almost "
                    "anyone; name the proxy's own address (or its small network)"
                )

    @property
    def description(self) -> str:
        networks = ", ".join(str(p) for p in self._proxies)
        return f"the {self.header} header, from {networks} only"

    def authenticate(self, request: HTTPConnection) -> Viewer | Refusal:
        host = request.client.host if request.client else None
        try:
            peer = ipaddress.ip_address(host or "")
        except ValueError:
            peer = None
        if peer is None or not any(peer in network for network in self._proxies):
            return Refusal(403, "this console is served through its proxy only")
        named = request.headers.getlist(self.header)
        if len(named) > 1:
            return Refusal(401, f"the request names its user in {self.header} more than once")
        name = named[0].strip() if named else ""
        if _NAME.fullmatch(name) is None:
            return Refusal(401, f"the proxy sent no usable user in {self.header}")
        return Viewer(name, "proxy")


def token_file_from_env() -> Path | None:
    """``BLACKBOX_CONSOLE_TOKEN_FILE``, when set."""
    value = os.environ.get("BLACKBOX_CONSOLE_TOKEN_FILE")
    return Path(value) if value else None
