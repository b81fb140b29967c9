"""Connection settings and names both sides must agree on, read from the environment once."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace

from agent_blackbox.schemas._compression import COMPRESSIONS
from agent_blackbox.schemas._database_url import normalize_database_url
from agent_blackbox.schemas._digests import CANONICALISATIONS, NEW_RUNS, Canonicalisation

DEFAULT_DATABASE_URL = "postgresql+psycopg://blackbox@127.0.0.1:25432/blackbox"
DEFAULT_KAFKA_BOOTSTRAP = "127.0.0.1:29092"


@dataclass(frozen=True, slots=True)
class Settings:
    """Where the services are and how the pipeline is laid out.

    Every field has an environment variable ``BLACKBOX_<FIELD>`` (upper case); the
    defaults point at the local stack that ``blackbox stack up`` starts.
    """

    database_url: str = DEFAULT_DATABASE_URL
    """The Postgres database of the write side (``blackbox``) and the views
    (``blackbox_views``), as an SQLAlchemy URL. Unset, with the Kafka bootstrap unset too,
    it is the local stack's. A primary with standbys is named as libpq names several
    servers (``postgresql+psycopg://u@h1:5432,h2:5433/db?target_session_attrs=read-write``),
    which is kept in the equivalent form SQLAlchemy parses
    (``postgresql+psycopg://u@/db?host=h1:5432&host=h2:5433&...``)."""
    kafka_bootstrap: str = DEFAULT_KAFKA_BOOTSTRAP
    """The Kafka brokers (``host:port``, comma-separated) the relay publishes to and
    every consumer reads from."""
    topic: str = "blackbox.events"
    """The events topic; dead letters go to ``<topic>.dlq``. Replay finds a run's topic
    and partition through the events index, not through this setting."""
    partitions: int = 12
    """The topic's partition count when the relay creates it. Choose it before the topic
    holds data: more partitions later move runs to other partitions."""
    replication_factor: int = 0
    """The topics' replication factor when the relay or a consumer creates them. Unset
    (0): 3 when the cluster reports three brokers or more, else 1. A topic created with
    three replicas or more requires two in sync for a write (``min.insync.replicas=2``),
    so an event acknowledged to the relay (``acks=all``) is on two brokers at least."""
    outbox_shards: int = 16
    """How many shards the outbox is split into, each read by the one relay leasing it.
    Writers and relays must agree; change it only with an empty outbox."""
    blob_threshold_bytes: int = 64 * 1024
    """A body (encoded and sealed) over this many bytes is stored in the content-addressed
    blob store, and the envelope carries its ``payload_ref`` instead of the bytes."""
    max_blob_bytes: int = 256 * 1024 * 1024
    """The ceiling of a body kept whole. An LLM call over it is recorded truncated
    (summary, sizes, digests, a reduced response: ``body_truncated``); any other body
    over it is refused with ``PayloadTooLarge``. 256 MiB is far above any model reply
    (a million-token reply is a few MiB of JSON, a stream of it some tens) while a body
    is held in memory a few times over as it is encoded and sealed, and well under the
    database's 1 GiB value limit. ``BLACKBOX_MAX_PAYLOAD_BYTES``, its former name, is
    still read when this one is not set."""
    payload_compression: str = "zstd"
    """How recorders compress bodies before sealing them: ``zstd`` (with the shared
    dictionary), ``zstd-nodict``, ``deflate`` or ``none``. Each payload names its own
    compression, so readers open every setting, and events recorded before it."""
    payload_compression_tenants: str = ""
    """Tenants whose bodies are compressed otherwise than :attr:`payload_compression`
    says, as ``tenant=compression`` pairs, comma-separated: ``acme=none,globex=deflate``.
    Compression before sealing lets a body's size hint at what it holds (sealed,
    compressed bodies are padded to size buckets, which narrows that but does not close
    it); ``none`` closes it for a tenant whose bodies mix secrets with text others
    control. A tenant id with ``,`` or ``=`` in it cannot be named here."""
    llm_request_references: str = "on"
    """``on``: an LLM request that repeats the start of one of its run's latest requests
    is stored as a reference to it plus what is new (a 50-turn conversation does not
    store turn 1 fifty times); readers rebuild the whole request. ``off``: every request
    is stored whole."""
    canonical_json: str = NEW_RUNS.name
    """How runs started now write the canonical JSON their digests and hash chain are
    taken over: ``rfc8785`` (RFC 8785, the JSON Canonicalization Scheme, which other
    languages reproduce) or ``v1`` (the form of earlier releases, for a fleet whose
    replayers are not all upgraded yet). Each envelope names its run's; readers follow
    the envelope, whatever this says."""
    consumer_group: str = "blackbox-views"
    """The view consumer's group (``blackbox consume``; ``--group`` overrides it). Give
    each topic its own groups."""
    consumer_session_timeout_ms: int = 6000
    """How long the group waits for a silent consumer before giving its partitions to
    another member. 6 s is the broker's smallest allowed session by default; heartbeats
    come from the client's own thread, so a slow batch never counts as silence."""
    consumer_heartbeat_ms: int = 1000
    """How often a consumer tells the group it is alive (well inside the session)."""
    consumer_instance_id: str | None = None
    """Static group membership: a consumer that restarts with the same id gets its
    partitions back at once, without a rebalance or waiting out its old session. Unique
    per member of a group; ``blackbox consume`` and ``sign`` default it to the consumer's
    name and the host's name (``#2``, ``#3``... for more running on the host at once)."""
    schema_registry_url: str | None = None
    """Reserved for a Confluent-compatible schema registry; no part reads it yet, and
    envelopes are written in Avro single-object encoding whatever it holds."""
    keyed_digest_classes: str = "sensitive,restricted"
    """Classifications whose digests must be HMAC-SHA256 under the tenant's key (comma
    list): a recorder without keys refuses their runs. A recorder with keys takes keyed
    digests for every classification anyway, but those of :attr:`plain_digest_classes`."""
    plain_digest_classes: str = ""
    """Classifications whose runs keep plain SHA-256 digests although the recorder has
    keys: an explicit opt-in (comma list, ``*`` for all), for digests that must be
    compared across tenants. Never applies to :attr:`keyed_digest_classes`. Runs recorded
    without keys always take plain digests: their bodies are plaintext anyway."""
    price_file: str | None = None
    """A TOML (or ``.json``) file of LLM prices, US dollars per million tokens, whose
    entries replace or add to the shipped ones: ``[openai."my-model"]`` with ``input``,
    ``output``, optional ``cached_input`` and ``cache_write``, and ``as_of`` (the day the
    price was taken). The analytics consumer prices each call as it reads it; a bad file
    stops it, naming the entry (``blackbox prices`` checks a file)."""
    checkpoint_every_events: int = 1000
    """The checkpoint signer signs a running run's head again once it has grown by this
    many events (and the database agrees with it), so a long run is covered as it goes."""
    checkpoint_every_seconds: int = 60
    """... or once its head has stayed unsigned this long: a run that crashed, or waits,
    is covered up to its last event about a minute after it stopped."""

    def keyed_digests(self, classification: str) -> bool:
        """Whether runs of ``classification`` must take keyed digests."""
        return classification in _classes(self.keyed_digest_classes)

    def digest_keyed(self, classification: str, *, encrypted: bool) -> bool:
        """Whether a run of ``classification`` takes keyed digests, recorded by a recorder
        that has keys (``encrypted``) or not."""
        if self.keyed_digests(classification):
            return True
        plain = _classes(self.plain_digest_classes)
        return encrypted and "*" not in plain and classification not in plain

    def tenant_compressions(self) -> dict[str, str]:
        """:attr:`payload_compression_tenants` as tenant → compression.

        Raises:
            ValueError: a pair is not ``tenant=compression`` with one of the compressions.
        """
        chosen: dict[str, str] = {}
        for pair in self.payload_compression_tenants.split(","):
            if not pair.strip():
                continue
            tenant, equals, compression = (part.strip() for part in pair.partition("="))
            if not tenant or not equals or compression not in COMPRESSIONS:
                raise ValueError(
                    f"BLACKBOX_PAYLOAD_COMPRESSION_TENANTS: {pair.strip()!r} is not "
                    f"tenant=compression with a compression among {', '.join(COMPRESSIONS)} "
                    "(e.g. acme=none)"
                )
            chosen[tenant] = compression
        return chosen

    @property
    def canonicalisation(self) -> Canonicalisation:
        """The canonicalisation of :attr:`canonical_json`."""
        return CANONICALISATIONS[self.canonical_json]

    @property
    def dlq_topic(self) -> str:
        """The dead-letter topic of :attr:`topic`."""
        return f"{self.topic}.dlq"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Settings from ``BLACKBOX_*`` variables, defaults for the rest.

        Raises:
            ValueError: a numeric variable does not hold a positive integer.
        """
        env = os.environ if environ is None else environ
        env = {**_from_former_names(env), **env}
        defaults = cls()
        values: dict[str, object] = {}
        for name in cls.__dataclass_fields__:
            raw = env.get(f"BLACKBOX_{name.upper()}")
            if raw is None or raw == "":
                continue
            current = getattr(defaults, name)
            values[name] = _positive_int(name, raw) if isinstance(current, int) else raw
        return replace(defaults, **values)  # type: ignore[arg-type]

    def __post_init__(self) -> None:
        """Raise ValueError naming a setting whose value is not one of its choices."""
        if self.payload_compression not in COMPRESSIONS:
            raise ValueError(
                f"BLACKBOX_PAYLOAD_COMPRESSION={self.payload_compression!r} is not one of "
                f"{', '.join(COMPRESSIONS)}"
            )
        self.tenant_compressions()  # raises naming a malformed pair
        if self.canonical_json not in CANONICALISATIONS:
            raise ValueError(
                f"BLACKBOX_CANONICAL_JSON={self.canonical_json!r} is not one of "
                f"{', '.join(CANONICALISATIONS)}"
            )
        # A primary-and-standby URL (h1:p1,h2:p2) becomes the form SQLAlchemy parses.
        object.__setattr__(self, "database_url", normalize_database_url(self.database_url))
        _check_database_url(self.database_url)
        on = flag("BLACKBOX_LLM_REQUEST_REFERENCES", self.llm_request_references)
        object.__setattr__(self, "llm_request_references", "on" if on else "off")


def _check_database_url(url: str) -> None:
    """Refuse a database URL no PostgreSQL driver takes, before a command reaches for it
    (its password is never repeated).

    Raises:
        ValueError: saying what the URL should look like.
    """
    scheme, separator, _ = url.partition("://")
    if not url or (separator and scheme.startswith("postgresql")):
        return
    what = f"begins with {scheme}://" if separator else "is not a URL"
    raise ValueError(
        f"BLACKBOX_DATABASE_URL {what}: write postgresql+psycopg://USER:PASSWORD@HOST:5432/DATABASE"
    )


def _classes(listed: str) -> set[str]:
    return {c.strip() for c in listed.split(",") if c.strip()}


def _from_former_names(env: Mapping[str, str]) -> dict[str, str]:
    """Variables under their current names, taken from former names where only those
    are set."""
    return {new: env[old] for old, new in _FORMER_NAMES.items() if env.get(old)}


_FORMER_NAMES = {"BLACKBOX_MAX_PAYLOAD_BYTES": "BLACKBOX_MAX_BLOB_BYTES"}


def _positive_int(name: str, raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"BLACKBOX_{name.upper()}={raw!r} is not an integer") from None
    if value <= 0:
        raise ValueError(f"BLACKBOX_{name.upper()}={raw!r} must be positive")
    return value


_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def flag(name: str, raw: str) -> bool:
    """The on/off value of the variable ``name`` set to ``raw``: ``1``, ``true``,
    ``yes`` or ``on`` (any case) for on, ``0``, ``false``, ``no`` or ``off`` for off.

    Raises:
        ValueError: naming the variable, for anything else.
    """
    word = raw.strip().lower()
    if word in _TRUE or word in _FALSE:
        return word in _TRUE
    raise ValueError(f"{name}={raw!r} is not on or off (1/0, true/false, yes/no)")


def env_flag(name: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether the on/off variable ``name`` is on; unset or empty is off.

    Raises:
        ValueError: the variable holds something else.
    """
    raw = (os.environ if environ is None else environ).get(name, "")
    return bool(raw.strip()) and flag(name, raw)
