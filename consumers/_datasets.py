"""Choosing recorded runs, and datasets: named sets of them, kept in the views.

A :class:`RunSelection` picks finished runs by agent, tags, code version, status and
start time, newest first (or names them); :func:`select_runs_txn` reads it as the
caller's role, so only runs of its granted tenants are chosen. A dataset freezes such a
choice under a name (``blackbox dataset create``): the same runs, in the same order,
however many are recorded later, for experiments and exports to come back to.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, text
from sqlalchemy.exc import IntegrityError

from agent_blackbox.schemas import TAG_PREFIX, BlackboxError

DATASET_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
DEFAULT_RUNS = 100


class DatasetError(BlackboxError):
    """A dataset cannot be made or found as asked; the message says why and what to do."""


@dataclass(frozen=True, slots=True)
class RunSelection:
    """Which finished runs to take. Empty fields leave that filter out; forks are left
    out unless asked for; at most ``limit`` runs, the newest first. ``run_ids`` names
    runs instead (each must be in the views)."""

    agent: str | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    code_version: str | None = None
    status: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    limit: int = DEFAULT_RUNS
    include_forks: bool = False
    run_ids: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The filters that are set, as JSON values (what a dataset or an experiment
        keeps of how its runs were chosen)."""
        if self.run_ids:
            return {"run_ids": len(self.run_ids)}
        chosen: dict[str, Any] = {
            "agent": self.agent,
            **{f"{TAG_PREFIX}{k}": v for k, v in sorted(self.tags.items())},
            "code_version": self.code_version,
            "status": self.status,
            "since": None if self.since is None else self.since.isoformat(),
            "until": None if self.until is None else self.until.isoformat(),
            "limit": self.limit,
            "include_forks": self.include_forks or None,
        }
        return {k: v for k, v in chosen.items() if v is not None}


@dataclass(frozen=True, slots=True)
class ChosenRun:
    """A run a selection took: its id and tenant."""

    run_id: str
    tenant_id: str


def select_runs_txn(conn: Connection, selection: RunSelection) -> list[ChosenRun]:
    """The finished runs ``selection`` takes, newest first (or in the order named).

    Raises:
        DatasetError: a run named in ``run_ids`` is not in the views (or its tenant is
            not granted to the caller), or has not finished.
    """
    clauses = ["r.started_at IS NOT NULL", "r.status <> 'running'"]
    params: dict[str, Any] = {"limit": selection.limit}
    for name, column in (
        ("agent", "r.agent_id"),
        ("code_version", "r.code_version"),
        ("status", "r.status"),
    ):
        value = getattr(selection, name)
        if value:
            clauses.append(f"{column} = :{name}")
            params[name] = value
    if selection.since is not None:
        clauses.append("r.started_at >= :since")
        params["since"] = selection.since
    if selection.until is not None:
        clauses.append("r.started_at < :until")
        params["until"] = selection.until
    if not selection.include_forks and not selection.run_ids:
        clauses.append("r.parent_run_id IS NULL")
    for number, (tag, value) in enumerate(sorted(selection.tags.items())):
        # Tags travel unsealed on run.started (its first event): read from the index.
        clauses.append(
            "EXISTS (SELECT 1 FROM blackbox_views.events e WHERE e.run_id = r.run_id "
            f"AND e.sequence = 1 AND e.attributes ->> :tag_{number} = :tag_value_{number})"
        )
        params[f"tag_{number}"], params[f"tag_value_{number}"] = f"{TAG_PREFIX}{tag}", value
    if selection.run_ids:
        clauses.append("r.run_id = ANY (:run_ids)")
        params["run_ids"] = list(selection.run_ids)
        params["limit"] = len(selection.run_ids)
    statement = text(
        f"""
        SELECT r.run_id, r.tenant_id FROM blackbox_views.runs r
         WHERE {" AND ".join(clauses)}
         ORDER BY r.started_at DESC, r.run_id DESC
         LIMIT :limit
        """
    )
    chosen = [ChosenRun(str(row[0]), str(row[1])) for row in conn.execute(statement, params)]
    if selection.run_ids:
        return _as_named(chosen, selection.run_ids)
    return chosen


def _as_named(chosen: list[ChosenRun], named: Sequence[str]) -> list[ChosenRun]:
    by_id = {run.run_id: run for run in chosen}
    missing = [run_id for run_id in dict.fromkeys(named) if run_id not in by_id]
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        shown = ", ".join(missing[:5]) + more
        raise DatasetError(
            f"not finished runs in the views this login can see: {shown}; check the ids, "
            "and that the view consumer has caught up (blackbox consume)"
        )
    return [by_id[run_id] for run_id in dict.fromkeys(named)]


@dataclass(frozen=True, slots=True)
class Dataset:
    """A named set of recorded runs."""

    name: str
    description: str | None
    selection: dict[str, Any]
    tenants: list[str]
    runs: int
    created_at: datetime
    created_by: str
    run_ids: tuple[str, ...] = ()
    """Its runs in order (when read whole)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "selection": self.selection,
            "tenants": self.tenants,
            "runs": self.runs,
            "created_at": self.created_at.isoformat(),
            "created_by": self.created_by,
            "run_ids": list(self.run_ids),
        }


def dataset_name_problem(name: str) -> str | None:
    """What is wrong with ``name`` as a dataset's name, or None."""
    if DATASET_NAME.fullmatch(name) is None:
        return (
            f"{name!r} is not a dataset name: use 1-64 characters of a-z, 0-9, '.', '_' "
            "and '-', starting with a letter or digit"
        )
    return None


def create_dataset_txn(
    conn: Connection,
    *,
    name: str,
    selection: Mapping[str, Any],
    runs: Sequence[ChosenRun],
    description: str | None = None,
) -> None:
    """Keep ``runs`` (in this order) as the dataset ``name``; never commits.

    Raises:
        DatasetError: the name is not usable, there is no run, or a dataset of that name
            exists.
    """
    if (problem := dataset_name_problem(name)) is not None:
        raise DatasetError(problem)
    if not runs:
        raise DatasetError(f"dataset {name}: no run was chosen; check the filters")
    tenants = sorted({run.tenant_id for run in runs})
    try:
        conn.execute(
            text(
                "INSERT INTO blackbox_views.datasets (name, description, selection, tenants, runs) "
                "VALUES (:name, :description, CAST(:selection AS jsonb), :tenants, :runs)"
            ),
            {
                "name": name,
                "description": description,
                "selection": json.dumps(dict(selection), sort_keys=True),
                "tenants": tenants,
                "runs": len(runs),
            },
        )
    except IntegrityError as exc:
        raise DatasetError(
            f"a dataset named {name} exists already: pick another name, or delete it first "
            f"(blackbox dataset delete {name})"
        ) from exc
    conn.execute(
        text(
            "INSERT INTO blackbox_views.dataset_runs (dataset, position, run_id, tenant_id) "
            "VALUES (:dataset, :position, :run_id, :tenant_id)"
        ),
        [
            {"dataset": name, "position": i, "run_id": run.run_id, "tenant_id": run.tenant_id}
            for i, run in enumerate(runs)
        ],
    )


_DATASET = (
    "SELECT name, description, selection, tenants, runs, created_at, created_by "
    "FROM blackbox_views.datasets"
)


def datasets_txn(conn: Connection) -> list[Dataset]:
    """Every dataset the caller may see (granted all its tenants), by name."""
    return [_dataset(row) for row in conn.execute(text(f"{_DATASET} ORDER BY name"))]


def dataset_txn(conn: Connection, name: str) -> Dataset | None:
    """The dataset ``name`` with its runs in order; None when there is none the caller
    may see."""
    row = conn.execute(text(f"{_DATASET} WHERE name = :name"), {"name": name}).first()
    if row is None:
        return None
    ids = conn.execute(
        text(
            "SELECT run_id FROM blackbox_views.dataset_runs WHERE dataset = :name ORDER BY position"
        ),
        {"name": name},
    ).scalars()
    return replace(_dataset(row), run_ids=tuple(str(i) for i in ids))


def delete_dataset_txn(conn: Connection, name: str) -> bool:
    """Delete the dataset ``name`` (not its runs); whether there was one to delete."""
    deleted = conn.execute(
        text("DELETE FROM blackbox_views.datasets WHERE name = :name"), {"name": name}
    )
    return bool(deleted.rowcount)


def _dataset(row: Any) -> Dataset:
    return Dataset(
        name=row[0],
        description=row[1],
        selection=dict(row[2]),
        tenants=list(row[3]),
        runs=int(row[4]),
        created_at=row[5],
        created_by=row[6],
    )
