"""The Grafana dashboard in docs/ queries metrics the processes really export."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from agent_blackbox.backup._metrics import BackupMetrics
from agent_blackbox.consumers import ConsumerMetrics, CostCounter, RetentionGauges, ViewGauges
from agent_blackbox.outbox._metrics import write_failures
from agent_blackbox.outbox.relay import RelayMetrics

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "agent-blackbox.json"
_SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_created")


def _exported() -> set[str]:
    registry = CollectorRegistry()
    RelayMetrics.create(registry)
    ConsumerMetrics(consumer="c", group="g", topic="t", registry=registry)
    ViewGauges(registry)
    CostCounter(registry)
    RetentionGauges(registry)
    BackupMetrics(topic="t", registry=registry)
    names = {family.name for family in registry.collect()}
    names |= {family.name for family in write_failures().collect()}
    return names


def _base(name: str) -> str:
    for suffix in _SUFFIXES:
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name


def test_every_panel_queries_an_exported_metric() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    queried = {_base(n) for e in exprs for n in re.findall(r"blackbox_[a-z_]+", e)}
    assert len(exprs) > 20
    assert queried - _exported() == set()


def test_every_exported_metric_is_on_the_dashboard() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    queried = {_base(n) for e in exprs for n in re.findall(r"blackbox_[a-z_]+", e)}
    assert _exported() - queried == set()
    assert [i["name"] for i in dashboard["__inputs"]] == ["DS_PROMETHEUS"]  # asked at import
