"""The checks a drill runs on the restored copy, each naming what it found wrong.

The project's own tools check the copy where one exists (``blackbox verify --all`` and
``blackbox replay --all``, run as child processes with the target's credentials, so
the copy is read exactly as an operator would read it after a real restore).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

import agent_blackbox.outbox.snapshot as write_side
from agent_blackbox.backup._drill_sample import (
    EntryPoints,
    SamplePlan,
    plan_sample,
    replay_arguments,
)
from agent_blackbox.backup._errors import BackupError
from agent_blackbox.backup._restore import RestoredTables
from agent_blackbox.backup._tally import EventTally
from agent_blackbox.backup._target import Target
from agent_blackbox.backup._verify import StoreCheck
from agent_blackbox.broker import KafkaUnavailable, watermarks
from agent_blackbox.consumers import (
    event_references_txn,
    event_spans_txn,
    unscrubbed_view_runs_txn,
    view_digests_txn,
)
from agent_blackbox.keystore import key_states_txn
from agent_blackbox.outbox.lifecycle import shredded_runs_txn, unscrubbed_runs_txn
from agent_blackbox.schemas import Settings
from agent_blackbox.wiring import COMMAND_POOL

_SHOWN = 20
_CHILD_TIMEOUT_S = 1_800.0


@dataclass(frozen=True, slots=True)
class Check:
    """One verification of a drill. ``passed`` is None when it could not apply."""

    name: str
    passed: bool | None
    detail: str
    where: tuple[str, ...] = ()
    """The objects, offsets or runs concerned (at most a screenful)."""
    unrun: bool = False
    """It failed for want of a service or a setting, not for what it found (the drill
    then could not run, exit 2, unless another check found something)."""


class DrillChecks:
    """Checks of one restored copy against its backup (and production, where it answers).

    Args:
        production: production's settings (its views are compared, its replays asked).
        target: the restored copy.
        engine: the copy's database.
        check: the check of the backup the copy was restored from.
        tally: the distinct events of the messages restored.
        agents: the drill's ``--agent`` entry points (besides ``BLACKBOX_AGENTS``).
    """

    def __init__(
        self,
        production: Settings,
        target: Target,
        engine: Engine,
        check: StoreCheck,
        tally: EventTally,
        *,
        agents: Sequence[str] = (),
    ) -> None:
        self._production = production
        self._target = target
        self._engine = engine
        self._check = check
        self._tally = tally
        self._entries = EntryPoints.of(agents)
        self.skipped = 0
        """Runs the replay sample skipped (their agents have no entry point)."""
        if check.cut is None:
            raise BackupError("a drill checks a restored cut; this check found none")

    def all(self, tables: RestoredTables, *, sample: int, purpose: str) -> Iterator[Check]:
        """Every check, in order (see :mod:`agent_blackbox.backup._drill`)."""
        for found in (
            self.partitions(),
            self.runs(),
            self.references(),
            self.forgotten(),
            self.verify_all(),
            self.same_views(),
            self.replay_sample(sample, purpose),
        ):
            yield replace(found, where=found.where[:_SHOWN])
        if tables.checkpoints_past_cut:
            yield Check(
                "checkpoints within the cut",
                None,
                f"{tables.checkpoints_past_cut} checkpoints signed events after the cut "
                "(the signer was ahead of the backup) were left out",
            )

    # -- against the manifests -------------------------------------------------------

    def partitions(self) -> Check:
        expected: dict[int, int] = {}
        for segment in self._check.segments_held():
            expected[segment.partition] = expected.get(segment.partition, 0) + segment.count
        try:
            ends = watermarks(self._target.settings, self._target.settings.topic)
        except KafkaUnavailable as exc:
            problem = f"cannot read the restored topic: {exc}"
            return Check("events per partition", False, problem, unrun=True)
        held = {p: high - low for p, (low, high) in ends.items() if high - low}
        wrong = [
            f"partition {p}: manifests {expected.get(p, 0)}, restored topic {held.get(p, 0)}"
            for p in sorted(set(expected) | set(held))
            if expected.get(p, 0) != held.get(p, 0)
        ]
        lost = [
            f"partition {r.partition} offsets {r.first_offset}..{r.end_offset - 1}: removed "
            "by the topic's retention before the backup read them"
            for m in self._check.chain.manifests
            for r in m.lost
        ]
        detail = f"{sum(held.values()):,} events in {len(held)} partitions"
        return Check("events per partition", not wrong and not lost, detail, tuple(lost + wrong))

    def runs(self) -> Check:
        """Per run, the restored views hold the backup's distinct events (a re-delivered
        copy counted once, a conflicting one failing), the manifests account for every
        message restored, and the sequences run 1..n."""
        manifests: dict[str, int] = {}
        for segment in self._check.segments_held():
            for run in segment.runs:
                manifests[run.run_id] = manifests.get(run.run_id, 0) + run.count
        tally = self._tally
        with self._engine.connect() as conn:
            spans = event_spans_txn(conn)
        wrong = list(tally.conflicts)
        if (more := tally.conflicting - len(tally.conflicts)) > 0:
            wrong.append(f"... and {more} more conflicting copies")
        for run_id in sorted(set(manifests) | set(tally.runs)):
            problem = _run_problem(run_id, manifests.get(run_id, 0), tally, spans)
            if problem is not None:
                wrong.append(problem)
        detail = (
            f"{len(manifests):,} runs, {tally.events:,} distinct events, each run counted and "
            "contiguous from sequence 1"
        )
        if tally.duplicates:
            detail += f"; {tally.duplicates:,} re-delivered copies counted once"
        if tally.conflicting:
            detail += f"; {tally.conflicting:,} conflicting copies"
        return Check("events per run, contiguous sequences", not wrong, detail, tuple(wrong))

    def references(self) -> Check:
        with self._engine.connect() as conn:
            keys, blobs = event_references_txn(conn)
            states = key_states_txn(conn, key_ids=list(keys))
            stored = set(write_side.blob_digests_txn(conn))
        wrong = [
            f"run {run}: its events are sealed under data key {key}, which the backup's key "
            "rows lack (missing data key)"
            for key, run in sorted(keys.items())
            if key not in states
        ]
        wrong += [
            f"run {run}: body {ref} stored out of line is not in the restored blobs"
            for ref, run in sorted(blobs.items())
            if ref not in stored
        ]
        live = sum(1 for _run, is_live in states.values() if is_live)
        detail = f"{len(keys)} data keys ({live} live), {len(blobs)} out-of-line bodies"
        return Check("data keys and blobs the events name", not wrong, detail, tuple(wrong))

    def forgotten(self) -> Check:
        with self._engine.connect() as conn:
            ledger = list(write_side.ledger_rows_txn(conn))
            runs = sorted({str(r["run_id"]) for r in ledger})
            states = key_states_txn(conn, run_ids=runs)
            shredded = shredded_runs_txn(conn)
            rows = unscrubbed_runs_txn(conn, shredded)
            views = unscrubbed_view_runs_txn(conn, shredded)
        live = [
            f"run {run}: data key {key} is live in the restored copy although the ledger "
            "destroyed it"
            for key, (run, is_live) in sorted(states.items())
            if is_live and any(key in r["key_ids"] for r in ledger if r["run_id"] == run)
        ]
        live += [f"run {run}: its row or effects still hold values forget scrubs" for run in rows]
        live += [f"run {run}: the views still hold its digests or labels" for run in views]
        detail = (
            f"{len(runs)} runs in the deletion ledger: none of their destroyed keys is live, "
            f"and {len(shredded)} shredded runs are scrubbed in rows and views"
        )
        return Check("forgotten stays unreadable", not live, detail, tuple(live))

    # -- with the project's own tools ------------------------------------------------

    def verify_all(self) -> Check:
        code, out, err = self._child(["verify", "--all", "--json"])
        name = "verify --all on the restored copy"
        if code == 2 or not out.strip():
            return Check(name, False, f"could not run: {_tail(err)}", unrun=True)
        reports = json.loads(out)
        bad = [f"run {r['run_id']}: {r['problem']}: {r['detail']}" for r in reports if r["problem"]]
        ok = sum(1 for r in reports if r["ok"])
        detail = (
            f"{len(reports)} runs: {ok} verified against signed checkpoints, "
            f"{len(reports) - ok - len(bad)} sound without one, {len(bad)} with a problem"
        )
        return Check(name, code == 0 and not bad, detail, tuple(bad))

    def same_views(self) -> Check:
        name = "views equal production's at the cut"
        limits = {run: head[0] for run, head in self._check.heads.items()}
        try:
            production = COMMAND_POOL.engine(self._production.database_url)
            try:
                with production.connect() as conn:
                    theirs = view_digests_txn(conn, limits)
            finally:
                production.dispose()
        except SQLAlchemyError as exc:
            return Check(name, None, f"production database not reachable: {_first(exc)}")
        with self._engine.connect() as conn:
            ours = view_digests_txn(conn, limits)
            forgotten = set(shredded_runs_txn(conn))
        # Production's views may lag behind the backup (its consumer is slower than the
        # backup writer): a run they hold fewer events of is not compared, only counted.
        behind = [r for r in limits if theirs.get(r, (0, ""))[0] < ours.get(r, (0, ""))[0]]
        # A run shredded after the cut is scrubbed in the copy, and in production's views
        # only once their consumer reads its run.redacted: not a difference of the copy.
        unscrubbed = [
            r for r in limits if r in forgotten and r not in behind and ours.get(r) != theirs.get(r)
        ]
        wrong = [
            f"run {run}: {ours.get(run, (0, ''))[0]} events, digests differ from production's"
            for run in sorted(limits)
            if run not in behind and run not in unscrubbed and ours.get(run) != theirs.get(run)
        ]
        detail = f"{len(limits) - len(behind):,} runs digested row by row up to the cut"
        if behind:
            detail += f"; {len(behind):,} not compared (production's views are behind)"
        if unscrubbed:
            detail += (
                f"; {len(unscrubbed):,} shredded runs scrubbed in the copy, not yet in "
                "production's views"
            )
        return Check(name, not wrong, detail, tuple(wrong))

    def replay_sample(self, sample: int, purpose: str) -> Check:
        """Replay ``sample`` runs of the copy, drawn from the agents with an entry point
        (see :mod:`._drill_sample`); the runs of other agents are counted as skipped. A
        run that could not be replayed (a setup or access problem) fails the check as
        such, never as a divergence; a run that diverged passes only when it diverges
        the same way in production."""
        name = "sample of runs replayed"
        if sample <= 0:
            return Check(name, None, "no sample asked for (--sample 0)")
        if self._entries.empty:
            return Check(
                name,
                False,
                "could not replay: no entry points; set BLACKBOX_AGENTS (name=module:function,"
                "...) or give --agent, or give --sample 0",
                unrun=True,
            )
        plan = plan_sample(self._tally.agents, self._entries, sample)
        self.skipped = plan.skipped_runs
        runs: list[dict[str, Any]] = []
        for _agent, args in replay_arguments(plan, self._entries, purpose):
            _code, out, err = self._child(args)
            lines = [json.loads(line) for line in out.splitlines() if line.strip()]
            found = [line for line in lines if line.get("type") == "run"]
            if not found:
                return Check(name, False, f"could not replay: {_tail(err)}", unrun=True)
            runs += found
        if not runs:
            return Check(
                name, None, f"no run of an agent with an entry point; {plan.describe_skipped()}"
            )
        return self._sample_check(name, runs, plan, purpose)

    def _sample_check(
        self, name: str, runs: list[dict[str, Any]], plan: SamplePlan, purpose: str
    ) -> Check:
        self.skipped += sum(1 for r in runs if r["result"] == "SKIPPED")
        unreplayed = [
            f"run {r['run_id']}: {r['result']}: {r.get('error') or ''}"
            for r in runs
            if r["result"] == "ERROR"
        ]
        differ = [
            f"run {r['run_id']}: {r['result']} on the restored copy, {theirs} in production"
            for r in runs
            if r["result"] not in ("PASS", "LIMITED", "ERROR", "SKIPPED")
            and (theirs := self._production_result(r["run_id"], purpose)) != r["result"]
        ]
        passed = sum(1 for r in runs if r["result"] in ("PASS", "LIMITED"))
        skipped = sum(1 for r in runs if r["result"] == "SKIPPED")
        detail = f"{len(runs) - skipped} runs: {passed} passed"
        if same := len(runs) - skipped - passed - len(unreplayed) - len(differ):
            detail += f", {same} diverged as in production"
        if unreplayed:
            detail += f", {len(unreplayed)} could not be replayed"
        if plan.skipped_runs:
            detail += f"; {plan.describe_skipped()}"
        if skipped:
            detail += f"; {skipped} runs skipped by replay"
        wrong = tuple(unreplayed + differ)
        return Check(name, not wrong, detail, wrong)

    def _production_result(self, run_id: str, purpose: str) -> str:
        args = ["replay", run_id, "--json", "--purpose", purpose]
        _code, out, _err = _run_child(args, _environment(self._production))
        for line in out.splitlines():
            if line.strip() and (doc := json.loads(line)).get("type") == "run":
                return str(doc["result"])
        return "unreadable"

    def _child(self, args: list[str]) -> tuple[int, str, str]:
        return _run_child(args, _environment(self._target.settings))


def _run_problem(
    run_id: str, manifests: int, tally: EventTally, spans: Mapping[str, tuple[int, int, int]]
) -> str | None:
    """What is wrong with ``run_id`` in the copy, or None."""
    messages, distinct = tally.copies(run_id), tally.distinct(run_id)
    if messages != manifests:
        return f"run {run_id}: manifests {manifests} messages, backup segments {messages}"
    indexed, first, last = spans.get(run_id, (0, 0, 0))
    if indexed != distinct:
        return (
            f"run {run_id}: backup {distinct} distinct events ({messages} messages), "
            f"restored views {indexed}"
        )
    if first != 1 or last != indexed:
        return f"run {run_id}: sequences {first}..{last} for {indexed} events (not 1..n)"
    return None


def _environment(settings: Settings) -> dict[str, str]:
    """This process's environment pointed at ``settings``'s database and topic."""
    env = dict(os.environ)
    env.update(
        BLACKBOX_DATABASE_URL=settings.database_url,
        BLACKBOX_KAFKA_BOOTSTRAP=settings.kafka_bootstrap,
        BLACKBOX_TOPIC=settings.topic,
        BLACKBOX_PARTITIONS=str(settings.partitions),
        BLACKBOX_CONSUMER_GROUP=settings.consumer_group,
    )
    return env


def _run_child(args: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    done = subprocess.run(
        [sys.executable, "-m", "agent_blackbox", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=_CHILD_TIMEOUT_S,
        check=False,
    )
    return done.returncode, done.stdout, done.stderr


def _tail(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return " / ".join(lines[-3:]) or "no output"


def _first(exc: SQLAlchemyError) -> str:
    return str(exc).splitlines()[0]
