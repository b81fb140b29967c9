"""Database URLs naming several servers (a primary and its standbys).

libpq accepts several ``host:port`` pairs in a URL's authority
(``postgresql://u@h1:5432,h2:5433/db``) and tries them in turn;
``target_session_attrs=read-write`` makes it skip a server that only reads (a standby),
so clients follow a promotion without a change of configuration. SQLAlchemy's URL parser
takes one port per URL and refuses that authority; it accepts the same servers as
repeated ``host`` query options (``postgresql+psycopg://u@/db?host=h1:5432&host=h2:5433``),
which it hands to psycopg as libpq's comma-separated ``host`` and ``port``. This module
rewrites the first form into the second, so either may be configured.
"""

from __future__ import annotations

from urllib.parse import quote

_AUTHORITY_END = "/?#"


def normalize_database_url(url: str) -> str:
    """``url`` with a multi-host authority moved into ``host`` query options.

    ``postgresql+psycopg://user@h1:5432,h2:5433/db?target_session_attrs=read-write``
    becomes ``postgresql+psycopg://user@/db?host=h1:5432&host=h2:5433&target_session_attrs=read-write``.
    Any other URL (one host, or hosts already given as query options) is returned as it
    is, character for character.

    Raises:
        ValueError: the URL names servers both in its authority and as ``host`` options,
            or one of the listed servers is empty.
    """
    scheme, separator, rest = url.partition("://")
    if not separator:
        return url
    end = min((i for i in (rest.find(c) for c in _AUTHORITY_END) if i >= 0), default=len(rest))
    authority, tail = rest[:end], rest[end:]
    user, at, hosts = authority.rpartition("@")
    if "," not in hosts:
        return url
    servers = hosts.split(",")
    if any(not server or server.startswith(":") for server in servers):
        raise ValueError(
            f"the database URL lists an empty server in {hosts!r}; write each as host:port, "
            "comma-separated (h1:5432,h2:5433)"
        )
    path, _, query = tail.partition("?")
    query, hash_mark, fragment = query.partition("#")
    options = [option for option in query.split("&") if option]
    if any(option.split("=", 1)[0] == "host" for option in options):
        raise ValueError(
            "the database URL names servers both before the database name and as host= "
            "options; keep one of the two forms"
        )
    listed = [f"host={quote(server, safe=':[]')}" for server in servers]
    rebuilt = f"{scheme}://{user}{at}{path or '/'}?{'&'.join([*listed, *options])}"
    return rebuilt + (f"#{fragment}" if hash_mark else "")
