"""Who is looking: the console's authentication port and its three adapters.

An :class:`Authenticator` turns a request into a :class:`Viewer` or refuses it. The
console ships:

- :class:`StaticTokens`: named tokens from an owner-only file, each strong enough not to
  be guessed (see :mod:`._token_strength`); a browser signs in once with its token and
  gets a signed, HTTP-only, same-site session cookie; a script sends
  ``Authorization: Bearer <token>``; wrong tokens are slowed down exponentially (see
  :mod:`._throttle`);
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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

from starlette.requests import HTTPConnection

from agent_blackbox.console._throttle import SignInThrottle
from agent_blackbox.console._token_strength import new_token, weakness
from agent_blackbox.schemas import (
    OWNER_ONLY_FORBIDDEN,
    BlackboxError,
    read_checked_file,
    write_owner_only,
)

SESSION_COOKIE = "blackbox_session"
SESSION_SECONDS = 8 * 3600
_IPV4_MAPPED = ipaddress.ip_network("::ffff:0:0/96")
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

    def __init__(
        self,
        tokens: Mapping[str, str],
        *,
        session_key: bytes | None = None,
        throttle: SignInThrottle | None = None,
    ) -> None:
        if not tokens:
            raise ConsoleAuthError("the token file names no token; add a line `name token`")
        for name, token in tokens.items():
            problem = _token_problem(name, token)
            if problem is not None:
                raise ConsoleAuthError(problem)
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
        self.throttle = throttle or SignInThrottle()
        self._lock = threading.Lock()

    @classmethod
    def from_file(cls, path: Path) -> StaticTokens:
        """The tokens of ``path``, which must be owner-only (mode 0600 or stricter).

        Raises:
            ConsoleAuthError: the file cannot be read, is readable by others, or has a
                malformed line (named by its number, never its content).
        """
        raw = _read_token_file(path)
        tokens: dict[str, str] = {}
        for number, line in enumerate(raw.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split()
            if len(parts) != 2:
                raise ConsoleAuthError(f"{path} line {number}: expected `name token`")
            if parts[0] in tokens:
                raise ConsoleAuthError(f"{path} line {number}: {parts[0]} is named twice")
            tokens[parts[0]] = parts[1]
        try:
            return cls(tokens)
        except ConsoleAuthError as exc:
            raise ConsoleAuthError(f"{path}: {exc}") from None

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

    def sign_in(self, client: str, token: str) -> str | int | None:
        """Who ``token``, offered by ``client``, signs in as: the name; or the whole
        seconds to wait first (the client or the token's prefix failed too often: the
        token is not even looked at, so the right one is refused too); or None (a wrong
        token, counted against both)."""
        wait = self.throttle.wait(client, token)
        if wait:
            return wait
        name = self.check_token(token)
        if name is None:
            self.throttle.failed(client, token)
        return name

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
            client = request.client.host if request.client else "?"
            found = self.sign_in(client, header[7:].strip())
            if isinstance(found, str):
                return Viewer(found, "token")
            if found is not None:
                return Refusal(429, f"too many wrong tokens; wait {seconds(found)}")
            return Refusal(401, "the bearer token is not one of this console's tokens")
        cookie = request.cookies.get(SESSION_COOKIE)
        name = None if cookie is None else self._session(cookie)
        if name is None:
            return Refusal(401, "sign in with your console token", can_sign_in=True)
        return Viewer(name, "session")


def seconds(count: int) -> str:
    """``1 second``, ``2 seconds``: how long a refused client must wait."""
    return f"{count} second" if count == 1 else f"{count} seconds"


def add_token(path: Path, name: str) -> str:
    """Give ``name`` a newly generated token in the token file ``path``: created
    owner-only when missing; the line of ``name`` replaced when it has one, every other
    line kept. Returns the token, to hand to its viewer (it is not shown again).

    Raises:
        ConsoleAuthError: the name is not usable, or the file cannot be read safely or
            written.
    """
    if _NAME.fullmatch(name) is None:
        raise ConsoleAuthError(f"token name {name!r}: use 1-64 letters, digits, and _ . @ -")
    lines = _read_token_file(path).splitlines() if path.exists() else []
    kept = [line for line in lines if line.split()[:1] != [name]]
    token = new_token()
    try:
        write_owner_only(path, "".join(f"{line}\n" for line in [*kept, f"{name} {token}"]).encode())
    except OSError as exc:
        raise ConsoleAuthError(f"cannot write the console token file {path}: {exc}") from exc
    return token


def _read_token_file(path: Path) -> str:
    """The text of the token file ``path``, which must be owner-only.

    Raises:
        ConsoleAuthError: it cannot be read, or others may read or write it.
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
    return raw.decode("utf-8", "replace")


def _token_problem(name: str, token: str) -> str | None:
    """What is wrong with the entry ``name token`` of a token file (never showing the
    token), or None."""
    if _NAME.fullmatch(name) is None:
        return f"token name {name!r}: use 1-64 letters, digits, and _ . @ -"
    fix = (
        f"replace it with a generated one: `blackbox web --token-file FILE --new-token "
        f"{name}` writes one into the file and prints it once"
    )
    if len(token) < 24:
        return f"the token of {name} is {len(token)} characters; use at least 24 random ones: {fix}"
    if len(set(token)) < 8:
        return f"the token of {name} repeats a few characters; {fix}"
    problem = weakness(token)
    return None if problem is None else f"the token of {name} is too weak: {problem}; {fix}"


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
