"""The LLM price table: the shipped entries, how a model name finds its price, a user
file over it, bad files, and exact Decimal arithmetic with cached input at its rate."""

from __future__ import annotations

import json
from datetime import date
from decimal import Decimal
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent_blackbox.cli import main
from agent_blackbox.consumers import (
    PriceFileError,
    PriceTable,
    TokenCounts,
    dollars_json,
    dollars_text,
)
from agent_blackbox.outbox._llm import llm_call
from agent_blackbox.schemas import Settings

SHIPPED = PriceTable.shipped()


def test_every_shipped_entry_has_its_prices_and_the_day_they_were_taken() -> None:
    providers = {p.provider for p in SHIPPED}
    assert providers == {"openai", "anthropic"}
    assert len(SHIPPED) >= 20
    for price in SHIPPED:
        assert price.source == "shipped"
        assert date(2025, 1, 1) <= price.as_of <= date.today(), price
        assert price.input > 0 or price.model.startswith("text-embedding"), price
        # Reading from a cache never costs more than reading fresh input.
        assert price.cached_input <= price.input, price
        for value in (price.input, price.output, price.cached_input, price.cache_write):
            assert isinstance(value, Decimal)


@pytest.mark.parametrize(
    ("provider", "model", "priced_as"),
    [
        ("openai", "gpt-4o", "gpt-4o"),
        ("openai", "gpt-4o-2024-08-06", "gpt-4o"),
        ("openai", "gpt-4o-mini-2024-07-18", "gpt-4o-mini"),
        ("openai", "gpt-4.1-2025-04-14", "gpt-4.1"),
        ("anthropic", "claude-sonnet-4-5-20250929", "claude-sonnet-4-5"),
        ("anthropic", "claude-opus-4-1-20250805", "claude-opus-4-1"),
        ("anthropic", "claude-opus-4-20250514", "claude-opus-4"),
        ("anthropic", "claude-3-5-haiku-latest", "claude-3-5-haiku"),
    ],
)
def test_a_model_is_priced_by_its_name_or_its_dated_snapshots_model(
    provider: str, model: str, priced_as: str
) -> None:
    price = SHIPPED.price(provider, model)
    assert price is not None
    assert (price.provider, price.model) == (provider, priced_as)


@pytest.mark.parametrize(
    ("provider", "model"),
    [
        ("openai", "gpt-4o-audio-preview"),  # another model, not a snapshot of gpt-4o
        ("openai", "gpt-4o-realtime-preview-2024-12-17"),
        ("openai", "llama3"),  # an OpenAI-compatible server's own model
        ("anthropic", "gpt-4o"),  # the provider is part of the key
        ("mistral", "gpt-4o"),
        ("openai", ""),
        (None, "gpt-4o"),
        ("openai", None),
    ],
)
def test_a_model_without_an_entry_has_no_price(provider: str | None, model: str | None) -> None:
    assert SHIPPED.price(provider, model) is None


def test_cached_input_is_priced_at_the_cached_rate_and_cache_writes_at_theirs() -> None:
    gpt4o = SHIPPED.price("openai", "gpt-4o")
    assert gpt4o is not None
    # 1,000 input of which 400 cached, 200 output: 600 × 2.50 + 400 × 1.25 + 200 × 10.
    cost = gpt4o.cost(TokenCounts(input_tokens=1000, output_tokens=200, cached_tokens=400))
    assert cost == Decimal("0.004")
    uncached = gpt4o.cost(TokenCounts(input_tokens=1000, output_tokens=200))
    assert uncached == Decimal("0.0045")
    sonnet = SHIPPED.price("anthropic", "claude-sonnet-4-5-20250929")
    assert sonnet is not None
    # Anthropic's 12 fresh + 3 written + 8 read, 5 output, as the recorder counts them.
    tokens = TokenCounts(input_tokens=23, output_tokens=5, cached_tokens=8, cache_write_tokens=3)
    assert sonnet.cost(tokens) == Decimal("0.00012465")  # 12×3 + 8×0.30 + 3×3.75 + 5×15


def test_a_model_without_a_cache_price_charges_its_input_price_for_cached_input() -> None:
    turbo = SHIPPED.price("openai", "gpt-4-turbo")
    assert turbo is not None
    assert turbo.cached_input == turbo.input == Decimal("10.00")
    assert turbo.cost(TokenCounts(100, 0, cached_tokens=100)) == Decimal("0.001")


def test_counts_that_do_not_add_up_never_make_a_cost_negative() -> None:
    price = SHIPPED.price("openai", "gpt-4o")
    assert price is not None
    assert price.cost(TokenCounts(input_tokens=10, output_tokens=0, cached_tokens=50)) == (
        Decimal("0.0000625")  # the 50 cached at 1.25; no negative fresh input
    )
    assert price.cost(TokenCounts(0, 0)) == 0


def test_costs_are_exact_decimals_where_floats_drift() -> None:
    mini = SHIPPED.price("openai", "gpt-4o-mini")
    assert mini is not None
    one = mini.cost(TokenCounts(input_tokens=1, output_tokens=1))
    assert one == Decimal("0.00000075")
    total = sum((one for _ in range(100_000)), Decimal(0))
    assert total == Decimal("0.075")
    drifting = sum(0.00000075 for _ in range(100_000))
    assert drifting != 0.075  # what a float sum would have stored


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def test_a_user_file_replaces_and_adds_entries(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "prices.toml",
        """
[openai."gpt-4o"]
input = 2.00
output = 8
as_of = 2026-01-15

[openai."my-finetune"]
input = "3.0"
cached_input = 1.5
output = 12.0
as_of = 2026-01-15
""",
    )
    table = PriceTable.load(path)
    gpt4o = table.price("openai", "gpt-4o-2024-08-06")
    assert gpt4o is not None
    assert (gpt4o.input, gpt4o.output, gpt4o.as_of) == (Decimal("2.00"), 8, date(2026, 1, 15))
    assert gpt4o.cached_input == Decimal("2.00")  # the entry is replaced whole
    assert gpt4o.source == str(path)
    mine = table.price("openai", "my-finetune")
    assert mine is not None
    assert mine.cached_input == Decimal("1.5")
    assert len(table) == len(SHIPPED) + 1
    assert SHIPPED.price("openai", "my-finetune") is None  # the shipped table is untouched


def test_an_exact_entry_wins_over_its_snapshots_model(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "prices.json",
        json.dumps(
            {"openai": {"gpt-4o-2024-05-13": {"input": 5.0, "output": 15, "as_of": "2025-11-20"}}}
        ),
    )
    table = PriceTable.load(path)
    old = table.price("openai", "gpt-4o-2024-05-13")
    assert old is not None
    assert old.model == "gpt-4o-2024-05-13"
    assert old.input == Decimal("5.0")
    newer = table.price("openai", "gpt-4o-2024-08-06")
    assert newer is not None
    assert newer.model == "gpt-4o"


def test_no_file_is_the_shipped_table() -> None:
    assert PriceTable.load(None) is SHIPPED
    assert PriceTable.load("") is SHIPPED


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('[openai."m"]\ninput = 1\noutput = 2\n', 'entry openai."m" lacks as_of'),
        ('[openai."m"]\ninput = 1\ncached = 0.5\noutput = 2\nas_of = 2025-01-01\n', "cached"),
        ('[openai."m"]\ninput = -1\noutput = 2\nas_of = 2025-01-01\n', "input must be"),
        ('[openai."m"]\ninput = 1\noutput = "two"\nas_of = 2025-01-01\n', "output 'two' is not"),
        ('[openai."m"]\ninput = 1\noutput = 2\nas_of = "last week"\n', "as_of must be a day"),
        ('[openai."m"]\ninput = true\noutput = 2\nas_of = 2025-01-01\n', "input must be"),
        ('[openai."m"]\ninput = nan\noutput = 2\nas_of = 2025-01-01\n', "input must be"),
        ('openai = "cheap"\n', "'openai' must be a table of models"),
        ("[openai]\nm = 3\n", 'entry openai."m" must be a table'),
        ('[openai."m"\ninput = 1\n', "is not valid TOML"),
    ],
)
def test_a_bad_file_names_the_file_the_entry_and_what_is_wrong(
    tmp_path: Path, text: str, said: str
) -> None:
    path = _write(tmp_path, "prices.toml", text)
    with pytest.raises(PriceFileError) as raised:
        PriceTable.load(path)
    assert str(path) in str(raised.value)
    assert said in str(raised.value)


def test_a_missing_file_or_bad_json_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(PriceFileError, match=r"cannot read the price file .*BLACKBOX_PRICE_FILE"):
        PriceTable.load(tmp_path / "absent.toml")
    path = _write(tmp_path, "prices.json", '{"openai": ')
    with pytest.raises(PriceFileError, match="is not valid JSON"):
        PriceTable.load(path)


def test_the_setting_names_the_file() -> None:
    settings = Settings.from_env({"BLACKBOX_PRICE_FILE": "/etc/blackbox/prices.toml"})
    assert settings.price_file == "/etc/blackbox/prices.toml"
    assert Settings.from_env({}).price_file is None


@pytest.mark.parametrize(
    ("amount", "shown"),
    [
        ("0", "$0.00"),
        ("0.5", "$0.50"),
        ("0.0123", "$0.0123"),
        ("0.00012465", "$0.000125"),
        ("0.0000015", "$0.0000015"),
        ("1234.5", "$1,234.50"),
    ],
)
def test_dollars_read_as_money_and_exactly_in_json(amount: str, shown: str) -> None:
    assert dollars_text(Decimal(amount)) == shown
    assert dollars_json(Decimal(amount)) == amount
    assert dollars_json(Decimal("1.5E-6")) == "0.0000015"  # never in exponent form


def test_the_recorder_keeps_anthropic_cache_writes_apart() -> None:
    usage = {
        "input_tokens": 12,
        "cache_creation_input_tokens": 3,
        "cache_read_input_tokens": 8,
        "output_tokens": 5,
    }
    response = {"type": "message", "role": "assistant", "content": [], "usage": usage}
    crossing = llm_call(
        provider="anthropic",
        model="claude-sonnet-4-5",
        request={"model": "claude-sonnet-4-5", "messages": []},
        response=response,
        error=None,
        latency_ms=1.0,
    )
    attributes = crossing.attributes
    assert (attributes["prompt_tokens"], attributes["cached_tokens"]) == ("23", "8")
    assert attributes["cache_write_tokens"] == "3"
    chat = {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 1}}
    plain = llm_call(
        provider="openai",
        model="gpt-4o",
        request={"model": "gpt-4o", "messages": []},
        response=chat,
        error=None,
        latency_ms=1.0,
    )
    assert "cache_write_tokens" not in plain.attributes


def test_prices_command_shows_the_table_and_checks_a_file(tmp_path: Path) -> None:
    runner = CliRunner()
    shown = runner.invoke(main, ["prices", "--model", "gpt-4o-2024-08-06", "--json"])
    assert shown.exit_code == 0, shown.output
    line = json.loads(shown.stdout)
    assert (line["model"], line["input"], line["cached_input"]) == ("gpt-4o", "2.5", "1.25")
    unpriced = runner.invoke(main, ["prices", "--model", "llama3"])
    assert unpriced.exit_code == 1
    assert "has no price" in unpriced.output
    bad = _write(tmp_path, "bad.toml", '[openai."m"]\ninput = 1\noutput = 2\n')
    refused = runner.invoke(main, ["prices", "--file", str(bad)])
    assert refused.exit_code == 2
    assert 'openai."m" lacks as_of' in refused.output


def test_the_analytics_command_refuses_a_bad_price_file_before_it_starts(tmp_path: Path) -> None:
    bad = _write(tmp_path, "bad.toml", '[openai."m"]\ninput = 1\noutput = 2\n')
    env = {
        "BLACKBOX_PRICE_FILE": str(bad),
        # Nothing listens there: the command must stop before it reaches for either.
        "BLACKBOX_DATABASE_URL": "postgresql+psycopg://nobody@127.0.0.1:9/none",
        "BLACKBOX_KAFKA_BOOTSTRAP": "127.0.0.1:9",
    }
    refused = CliRunner(env=env).invoke(main, ["analytics", "--until-idle", "1"])
    assert refused.exit_code == 2
    assert f'{bad}: entry openai."m" lacks as_of' in refused.output
