"""Canonicalisations, and the digests taken over them.

What a digest or a chain hash covers is the canonical JSON of a value, and there are two
ways to write it:

- :data:`CANONICAL_V1`, what every run recorded before RFC 8785 was adopted hashes:
  Python's ``json`` with sorted keys (by code point), no whitespace, text unescaped,
  integers as their digits and floats as Python's ``repr`` (``1e-05``, ``2.0``);
- :data:`RFC8785`, what new runs hash: the JSON Canonicalization Scheme
  (:mod:`~agent_blackbox.schemas._jcs`), which any language can reproduce.

A run keeps one canonicalisation for all its digests and its chain, and each of its
envelopes names it in the :data:`C14N_ATTRIBUTE` attribute (absent: version 1, so every
envelope written before keeps its meaning). Readers take it from the envelope in hand
(:func:`canonicalisation_of`): a consumer can check any event, also one in the middle
of a run, without having seen the run start.

Texts stored inside bodies (arguments, results, requests) are not hashed as they are:
they stay JSON that reads back as the same Python value, floats as floats.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from agent_blackbox.schemas._canonical import DIGEST_PREFIX, HMAC_PREFIX, canonical_json
from agent_blackbox.schemas._errors import UndecodableMessage
from agent_blackbox.schemas._jcs import jcs_alike, rfc8785_json

C14N_ATTRIBUTE: Final = "c14n"
"""The envelope attribute naming the canonicalisation of the envelope's digests and chain
material; absent on runs of version 1."""


@dataclass(frozen=True, slots=True, eq=False)
class Canonicalisation:
    """One way of writing a JSON value as the bytes that are hashed.

    Compared by identity: there is one object per canonicalisation.
    """

    name: str
    """What the :data:`C14N_ATTRIBUTE` attribute says (``v1`` is never written)."""
    encode: Callable[..., bytes] = field(repr=False)
    """``encode(value, *, path)``: the canonical bytes, or NotSerialisable naming where."""
    code_point_keys: bool = field(repr=False)
    """Whether object keys sort by code point (version 1) or by UTF-16 code units."""
    as_v1: Callable[[Any], bool] = field(repr=False)
    """Whether it writes a value exactly as version 1 does (:meth:`json_beside`)."""

    def json(self, value: Any, *, path: str = "$") -> bytes:
        """The canonical JSON of ``value``.

        Raises:
            NotSerialisable: naming the path of the first value that has no JSON form.
        """
        result: bytes = self.encode(value, path=path)
        return result

    def json_beside(self, value: Any, v1: str) -> str:
        """The canonical JSON of ``value`` as text, given its version 1 text ``v1``: that
        same text wherever this canonicalisation writes ``value`` alike (RFC 8785 does
        for the common value: see :func:`~agent_blackbox.schemas._jcs.jcs_alike`).

        Raises:
            NotSerialisable: as :meth:`json`.
        """
        return v1 if self.as_v1(value) else self.json(value).decode("utf-8")

    @property
    def digest(self) -> PlainDigest:
        """SHA-256 over this canonicalisation, as ``sha256:<hex>``."""
        return _PLAIN[self.name]

    @property
    def attributes(self) -> dict[str, str]:
        """The attribute every envelope of a run of this canonicalisation carries."""
        return {} if self is CANONICAL_V1 else {C14N_ATTRIBUTE: self.name}


CANONICAL_V1: Final = Canonicalisation(
    "v1", canonical_json, code_point_keys=True, as_v1=lambda _: True
)
RFC8785: Final = Canonicalisation("rfc8785", rfc8785_json, code_point_keys=False, as_v1=jcs_alike)

NEW_RUNS: Final = RFC8785
"""The canonicalisation runs started by this release take."""

CANONICALISATIONS: Final = {c.name: c for c in (CANONICAL_V1, RFC8785)}


class UnknownCanonicalisation(UndecodableMessage):
    """An envelope names a canonicalisation this release does not know."""


def canonicalisation_of(attributes: Mapping[str, str]) -> Canonicalisation:
    """The canonicalisation an envelope with ``attributes`` was digested and chained with.

    Raises:
        UnknownCanonicalisation: it names one this release does not know (a newer
            release wrote it).
    """
    name = attributes.get(C14N_ATTRIBUTE)
    if name is None:
        return CANONICAL_V1
    found = CANONICALISATIONS.get(name)
    if found is None or found is CANONICAL_V1:
        raise UnknownCanonicalisation(
            f"the envelope names canonicalisation {name!r}, which this release does not "
            f"know ({', '.join(CANONICALISATIONS)}); read it with a newer release"
        )
    return found


class Digester(Protocol):
    """Takes the digest of a JSON value: a :class:`PlainDigest` or a :class:`KeyedDigest`,
    each under one canonicalisation."""

    @property
    def canonical(self) -> Canonicalisation:
        """The canonicalisation the digests are taken over."""
        ...

    def __call__(self, value: Any, *, path: str = "$") -> str:
        """The digest of ``value``; NotSerialisable naming the path of a bad value."""
        ...

    def under(self, canonical: Canonicalisation) -> Digester:
        """This digest (the same key, if any) over ``canonical``."""
        ...

    def of_canonical(self, data: bytes) -> str:
        """The digest of a value whose canonical JSON (under :attr:`canonical`) is
        ``data``, written by the caller from texts it already held."""
        ...

    def begin(self) -> RunningDigest:
        """A digest to feed canonical JSON piece by piece (:meth:`finished` gives it);
        copied, it goes on from the same bytes twice."""
        ...

    def finished(self, running: RunningDigest) -> str:
        """The digest of what ``running`` (from :meth:`begin`) was fed."""
        ...


class RunningDigest(Protocol):
    """A hash being fed: ``hashlib``'s, or an HMAC."""

    def update(self, data: bytes, /) -> None: ...

    def copy(self) -> RunningDigest: ...

    def hexdigest(self) -> str: ...


_sha256 = hashlib.sha256


class PlainDigest:
    """SHA-256 over canonical JSON, as ``sha256:<hex>``: :data:`digest` for version 1,
    ``RFC8785.digest`` for new runs."""

    __slots__ = ("canonical",)

    def __init__(self, canonical: Canonicalisation) -> None:
        self.canonical = canonical

    def __call__(self, value: Any, *, path: str = "$") -> str:
        return DIGEST_PREFIX + _sha256(self.canonical.encode(value, path=path)).hexdigest()

    def under(self, canonical: Canonicalisation) -> PlainDigest:
        return canonical.digest

    def of_canonical(self, data: bytes) -> str:
        return DIGEST_PREFIX + _sha256(data).hexdigest()

    def begin(self) -> RunningDigest:
        return _sha256()

    def finished(self, running: RunningDigest) -> str:
        return DIGEST_PREFIX + running.hexdigest()

    def __repr__(self) -> str:
        return f"PlainDigest({self.canonical.name})"


_PLAIN: Final = {c.name: PlainDigest(c) for c in (CANONICAL_V1, RFC8785)}

digest: Final = _PLAIN[CANONICAL_V1.name]
"""SHA-256 over version 1 canonical JSON, as ``sha256:<hex>``: the digest of runs
recorded before RFC 8785; ``RFC8785.digest`` is the one new runs take."""


class KeyedDigest:
    """HMAC-SHA256 over canonical JSON under a tenant's key, as ``hmac-sha256:<hex>``:
    digests of sensitive runs, so a low-entropy value (a yes/no, a card's last four)
    cannot be found by hashing guesses. Call it like :data:`digest`.

    Args:
        key: the tenant's digest key, at least 32 bytes.
        canonical: the canonicalisation digested (version 1 unless told;
            :meth:`under` gives the same key over another).
    """

    __slots__ = ("_keyed", "canonical")

    def __init__(self, key: bytes, canonical: Canonicalisation = CANONICAL_V1) -> None:
        if len(key) < 32:
            raise ValueError("a digest key needs at least 32 bytes")
        # The key's inner and outer pads are hashed once here; each digest copies that
        # state instead of keying a new HMAC (about a third of its cost on small values).
        self._keyed = hmac.new(key, digestmod=hashlib.sha256)
        self.canonical = canonical

    def __call__(self, value: Any, *, path: str = "$") -> str:
        mac = self._keyed.copy()
        mac.update(self.canonical.encode(value, path=path))
        return HMAC_PREFIX + mac.hexdigest()

    def of_canonical(self, data: bytes) -> str:
        mac = self._keyed.copy()
        mac.update(data)
        return HMAC_PREFIX + mac.hexdigest()

    def begin(self) -> RunningDigest:
        return self._keyed.copy()

    def finished(self, running: RunningDigest) -> str:
        return HMAC_PREFIX + running.hexdigest()

    def under(self, canonical: Canonicalisation) -> KeyedDigest:
        if canonical is self.canonical:
            return self
        twin = object.__new__(KeyedDigest)
        twin._keyed = self._keyed
        twin.canonical = canonical
        return twin

    def __repr__(self) -> str:
        return f"KeyedDigest(<key>, {self.canonical.name})"
