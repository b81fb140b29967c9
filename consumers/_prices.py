"""What an LLM call cost: a price per provider and model, and the arithmetic.

The shipped table (``prices.toml`` beside this module) holds the standard prices of
current OpenAI and Anthropic models, each with the day it was taken; a file named by
``BLACKBOX_PRICE_FILE`` (TOML or JSON, the same shape) replaces or adds entries. Money
is :class:`~decimal.Decimal` throughout, never a float: a cost is the exact product of
token counts and prices, so sums over millions of calls are exact too.

A model is looked up by its exact name, then by its name without a dated-snapshot
suffix (``gpt-4o-2024-08-06`` is priced as ``gpt-4o``, ``claude-sonnet-4-5-20250929``
as ``claude-sonnet-4-5``) or a ``-latest`` alias. A model found neither way has no
price: its calls' cost is unknown (NULL in the views), never zero.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import date
from decimal import Decimal
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from agent_blackbox.schemas import BlackboxError

PER_TOKENS = 1_000_000
"""Prices are per this many tokens."""

_SNAPSHOT = re.compile(r"-(?:\d{4}-\d{2}-\d{2}|\d{8}|latest)$")
_REQUIRED = ("input", "output", "as_of")
_REMEMBERED = 10_000
_OPTIONAL = ("cached_input", "cache_write")


class PriceFileError(BlackboxError):
    """A price file cannot be read, or one of its entries is malformed."""


@dataclass(frozen=True, slots=True)
class TokenCounts:
    """The tokens of one call as the analytics views count them.

    ``input_tokens`` is the whole input, with the cached part and the part written to
    the cache inside it (OpenAI's ``prompt_tokens``; for Anthropic the sum of its three
    input counts, as the recorder puts them).
    """

    input_tokens: int
    output_tokens: int
    cached_tokens: int = 0
    cache_write_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Price:
    """One model's prices in US dollars per million tokens."""

    provider: str
    model: str
    input: Decimal
    output: Decimal
    cached_input: Decimal
    cache_write: Decimal
    as_of: date
    source: str
    """``shipped``, or the path of the file that gave this entry."""

    def cost(self, tokens: TokenCounts) -> Decimal:
        """The exact cost in dollars of a call that used ``tokens``.

        Input read from the cache is priced at :attr:`cached_input`, input written to
        it at :attr:`cache_write`, the rest of the input at :attr:`input`. Counts that
        do not add up (more cached than input, which no provider reports) are taken
        as they are for the cached part and never make the rest negative.
        """
        cached = max(tokens.cached_tokens, 0)
        written = max(tokens.cache_write_tokens, 0)
        fresh = max(tokens.input_tokens - cached - written, 0)
        dollars = (
            fresh * self.input
            + cached * self.cached_input
            + written * self.cache_write
            + max(tokens.output_tokens, 0) * self.output
        )
        # Dividing by a power of ten moves the point: exact at any precision.
        return dollars.scaleb(-6)


class PriceTable:
    """Prices by provider and model; look one up with :meth:`price`."""

    def __init__(self, prices: Mapping[tuple[str, str], Price]) -> None:
        self._prices = dict(prices)
        # What each name seen resolved to (a snapshot's model, or no price): the consumer
        # asks once per call, for a handful of names.
        self._found: dict[tuple[str, str], Price | None] = {}

    @classmethod
    def shipped(cls) -> PriceTable:
        """The table shipped with the package."""
        return _shipped()

    @classmethod
    def load(cls, path: str | Path | None) -> PriceTable:
        """The shipped table with the entries of the file at ``path`` (TOML, or JSON for
        a ``.json`` name) replacing or adding to it; the shipped table alone for None.

        Raises:
            PriceFileError: the file cannot be read or parsed, or an entry is malformed
                (naming the file, the entry and what is wrong).
        """
        shipped = _shipped()
        if path is None or str(path) == "":
            return shipped
        added = parse_prices(_read(Path(path)), source=str(path))
        return cls({**shipped._prices, **added})

    def price(self, provider: str | None, model: str | None) -> Price | None:
        """The price of ``model`` of ``provider``: its own entry, else its dated
        snapshot's model's; None when neither is in the table."""
        if not provider or not model:
            return None
        key = (provider, model)
        if key in self._found:
            return self._found[key]
        found = self._prices.get(key)
        if found is None:
            base = _SNAPSHOT.sub("", model)
            found = self._prices.get((provider, base)) if base != model else None
        if len(self._found) >= _REMEMBERED:
            self._found.clear()  # names are few; a flood of distinct ones stays bounded
        self._found[key] = found
        return found

    def __iter__(self) -> Iterator[Price]:
        """Every entry, by provider then model."""
        return iter(sorted(self._prices.values(), key=lambda p: (p.provider, p.model)))

    def __len__(self) -> int:
        return len(self._prices)


def parse_prices(document: Mapping[str, Any], *, source: str) -> dict[tuple[str, str], Price]:
    """The entries of a parsed price document: ``{provider: {model: entry}}``.

    Raises:
        PriceFileError: naming ``source``, the entry and what is wrong with it.
    """
    prices: dict[tuple[str, str], Price] = {}
    for provider, models in document.items():
        if not isinstance(models, Mapping):
            raise PriceFileError(
                f"{source}: {provider!r} must be a table of models "
                f'([{provider}."model-name"] with input, output and as_of)'
            )
        for model, entry in models.items():
            prices[(provider, model)] = _entry(provider, model, entry, source)
    return prices


def _entry(provider: str, model: str, entry: Any, source: str) -> Price:
    name = f'{source}: entry {provider}."{model}"'
    if not isinstance(entry, Mapping):
        raise PriceFileError(f"{name} must be a table with input, output and as_of")
    unknown = sorted(set(entry) - {*_REQUIRED, *_OPTIONAL})
    if unknown:
        allowed = ", ".join((*_REQUIRED, *_OPTIONAL))
        raise PriceFileError(f"{name} has unknown keys {', '.join(unknown)}; allowed: {allowed}")
    missing = [key for key in _REQUIRED if key not in entry]
    if missing:
        raise PriceFileError(f"{name} lacks {', '.join(missing)}")
    money = {
        key: _dollars(name, key, entry[key])
        for key in ("input", "output", *_OPTIONAL)
        if key in entry
    }
    return Price(
        provider=provider,
        model=model,
        input=money["input"],
        output=money["output"],
        cached_input=money.get("cached_input", money["input"]),
        cache_write=money.get("cache_write", money["input"]),
        as_of=_day(name, entry["as_of"]),
        source=source,
    )


def _dollars(name: str, key: str, raw: Any) -> Decimal:
    """A price as a Decimal: from a TOML or JSON number (read as Decimal, never through
    a float), or a string of one."""
    if isinstance(raw, bool) or not isinstance(raw, int | Decimal | str):
        raise PriceFileError(f"{name}: {key} must be a number of dollars, not {raw!r}")
    try:
        value = Decimal(raw.strip() if isinstance(raw, str) else raw)
    except ArithmeticError:
        raise PriceFileError(f"{name}: {key} {raw!r} is not a number of dollars") from None
    if not value.is_finite() or value < 0:
        raise PriceFileError(f"{name}: {key} must be a finite number of dollars >= 0, not {raw}")
    return value


def _day(name: str, raw: Any) -> date:
    if isinstance(raw, date):
        return raw
    if isinstance(raw, str):
        try:
            return date.fromisoformat(raw)
        except ValueError:
            pass
    raise PriceFileError(f"{name}: as_of must be a day (2025-11-20), not {raw!r}")


def _read(path: Path) -> Mapping[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise PriceFileError(
            f"cannot read the price file {path}: {reason}; check BLACKBOX_PRICE_FILE"
        ) from exc
    return _parse(text, source=str(path), as_json=path.suffix.lower() == ".json")


def _parse(text: str, *, source: str, as_json: bool) -> Mapping[str, Any]:
    try:
        document: Any = (
            json.loads(text, parse_float=Decimal)
            if as_json
            else tomllib.loads(text, parse_float=Decimal)
        )
    except ValueError as exc:  # JSONDecodeError and TOMLDecodeError are ValueErrors
        kind = "JSON" if as_json else "TOML"
        raise PriceFileError(f"the price file {source} is not valid {kind}: {exc}") from exc
    if not isinstance(document, Mapping):
        raise PriceFileError(f"the price file {source} must hold a table of providers")
    return document


@cache
def _shipped() -> PriceTable:
    text = resources.files("agent_blackbox.consumers").joinpath("prices.toml").read_text("utf-8")
    return PriceTable(parse_prices(_parse(text, source="shipped", as_json=False), source="shipped"))


def dollars_text(amount: Decimal) -> str:
    """``amount`` as people read money: cents from a dollar up (``$1,234.50``), three
    significant digits below (``$0.0123``, ``$0.0000015``), never in exponent form."""
    if amount == 0:
        return "$0.00"
    if abs(amount) >= 1:
        return f"${amount:,.2f}"
    digits = max(2, 2 - amount.adjusted())
    text = f"{amount:.{digits}f}".rstrip("0")
    whole, _, cents = text.partition(".")
    return f"${whole}.{cents.ljust(2, '0')}"


def dollars_json(amount: Decimal | None) -> str | None:
    """``amount`` exactly, as a plain decimal string (JSON has no exact number type)."""
    return None if amount is None else format(amount.normalize(), "f")
