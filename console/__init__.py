"""The run console: ``blackbox web``, a browser view of recorded runs.

It reads the views (as a ``blackbox_reader`` login, or a ``blackbox_replayer`` one to
open bodies), renders every page on the server with no script, and opens a recorded
body only after the viewer states a purpose, through the audited replayer path.
Authentication is a port (:class:`Authenticator`) with three adapters.
"""

from agent_blackbox.console._app import CSP, create_app
from agent_blackbox.console._auth import (
    Authenticator,
    ConsoleAuthError,
    LoopbackOnly,
    Refusal,
    StaticTokens,
    TrustedProxyHeader,
    Viewer,
    add_token,
    is_loopback,
)
from agent_blackbox.console._throttle import SignInThrottle
from agent_blackbox.console._token_strength import MIN_TOKEN_BITS, new_token, token_bits

__all__ = [
    "CSP",
    "MIN_TOKEN_BITS",
    "Authenticator",
    "ConsoleAuthError",
    "LoopbackOnly",
    "Refusal",
    "SignInThrottle",
    "StaticTokens",
    "TrustedProxyHeader",
    "Viewer",
    "add_token",
    "create_app",
    "is_loopback",
    "new_token",
    "token_bits",
]
