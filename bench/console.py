"""The run console over a million runs: the run list with filters, its search, a session's
page, and the page of a 10,000-event run, answered by ``blackbox web`` over HTTP.

A database of its own (``<name>_console_bench``, dropped at the end) is migrated and
filled with synthetic rows of the views (runs in sessions of ten, per-run rollups with
tags, a tool call, an LLM call and the words of its messages per run, one run's events
and LLM calls) by ``generate_series``: what the consumers would have built from the
topic.
Then ``blackbox web`` serves it in a process of its own and each page is fetched
repeatedly, timing the whole answer (request, query, render, transfer).

Figures: p95 of the run list per filter and over all (target < 200 ms), of the search
per query and over all and of the session page (target < 300 ms each), and the p95 of
the 10,000-event run page (target < 1 s), with the console process's CPU per page (the
same target as a budget: wall time on two shared cores moves with the load).

    python -m bench.console [--runs 1000000] [--requests 20]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlencode

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from agent_blackbox.consumers import migrate_views
from agent_blackbox.outbox.storage import migrate_write_side
from agent_blackbox.schemas import Settings
from bench._common import emit, percentile, progress, stage

BENCH = "console"
LIST_TARGET_MS = 200.0
SEARCH_TARGET_MS = 300.0
SESSION_TARGET_MS = 300.0
RUN_PAGE_TARGET_MS = 1000.0
BIG_RUN = "run-with-10000-events"

FILTERS = {
    "none": "",
    "agent": "agent=agent-7",
    "model": "model=model-3",
    "has_error": "has_error=1",
    "prompt_version": "prompt_version=p2",
    "latency_above": "latency_above_ms=4900",
    "status": "status=failed",
    "since_1d": "since=1d",
    "tenant_and_model": "tenant=tenant-3&model=model-3",
    # No run matches (agent-7 runs only call model-2): the page walks all of agent-7's.
    "agent_and_model_none_match": "agent=agent-7&model=model-0",
}
"""Filter name → query; a page deep in the list (half way down) is added at run time."""

SEARCHES = {
    "run_prefix": "run:r0012",
    "tag": "tag:team=t7",
    "tool": "tool:tool-3",
    "rare_tool": "tool:tool-rare",
    "model": "model:model-3",
    "error_class": "error:TimeoutError",
    "status": "status:failed",
    "code_and_prompt": "code:v3 prompt:p2",
    "session": "session:s0012345",
    "user": "user:u-1234",
    "words_common": "refund",
    "words_rare": "order7919",
    "phrase": '"refund order7919"',
    "words_and_tool": "refund tool:tool-3",
    "nothing_matches": "tool:tool-rare error:TimeoutError",
}
"""Search name → what is typed in the search box."""


_TOOL = "CASE WHEN i % 100000 = 7 THEN 'tool-rare' ELSE 'tool-' || (i % 10) END"
"""The tool a synthetic run calls: one of ten, or (one run in 100,000) a rare one."""
_WORDS = (
    "'customer asks about order' || (i % 100003) || ' '"
    " || (ARRAY['refund', 'delivery', 'invoice', 'password', 'upgrade'])[1 + i % 5]"
    " || ' order' || (i % 100003) || ' please answer kindly word' || (i % 997)"
)
"""The text of a synthetic run's LLM call: a topic of five, an order number, a word."""


def _fill(url: str, runs: int) -> None:
    engine = create_engine(url)
    statements = [
        f"""
        INSERT INTO blackbox_views.runs (run_id, tenant_id, agent_id, status, event_count,
               last_sequence, started_at, finished_at, last_event_at, code_version,
               session_id, user_id)
        SELECT 'r' || lpad(i::text, 8, '0'), 'tenant-' || (i % 20), 'agent-' || (i % 50),
               CASE WHEN i % 50 = 0 THEN 'failed' ELSE 'succeeded' END, 20, 20,
               now() - i * interval '2 seconds', now() - i * interval '2 seconds' + interval '5 s',
               now() - i * interval '2 seconds' + interval '5 s', 'v' || (i % 7),
               's' || lpad((i / 10)::text, 7, '0'), 'u-' || (i / 10 % 5000)
          FROM generate_series(1, {runs}) AS i
        """,
        f"""
        INSERT INTO blackbox_views.run_rollups (run_id, tenant_id, agent_id, code_version,
               prompt_version, started_at, llm_calls, tool_calls, errors, total_tokens,
               llm_latency_ms, max_latency_ms, models, tags, cost_usd, tools,
               error_classes, words)
        SELECT 'r' || lpad(i::text, 8, '0'), 'tenant-' || (i % 20), 'agent-' || (i % 50),
               'v' || (i % 7), 'p' || (i % 4), now() - i * interval '2 seconds', 4, 3,
               (i % 37 = 0)::int, 1000 + i % 900, 2000, (i::bigint * 7919) % 5000,
               ARRAY['model-' || (i % 5)], jsonb_build_object('team', 't' || (i % 13)),
               (1000 + i % 900) * 0.000002, ARRAY[{_TOOL}],
               array_remove(ARRAY[CASE WHEN i % 37 = 0 THEN 'TimeoutError' END,
                                  CASE WHEN i % 50 = 0 THEN 'ValueError' END], NULL),
               strip(to_tsvector('simple', {_WORDS}))
          FROM generate_series(1, {runs}) AS i
        """,
        # One tool call per run (a tool of ten; one run in 100,000 calls a rare one) and
        # one LLM call (one in 37 fails with a timeout), with the words of its messages.
        f"""
        INSERT INTO blackbox_views.tool_calls (run_id, sequence, event_id, tenant_id,
               agent_id, recorded_at, latency_ms, tool)
        SELECT 'r' || lpad(i::text, 8, '0'), 3, 't-' || i, 'tenant-' || (i % 20),
               'agent-' || (i % 50), now() - i * interval '2 seconds', 12, {_TOOL}
          FROM generate_series(1, {runs}) AS i
        """,
        f"""
        INSERT INTO blackbox_views.llm_calls (run_id, sequence, event_id, tenant_id, agent_id,
               recorded_at, latency_ms, error_class, provider, model, prompt_tokens,
               completion_tokens, total_tokens)
        SELECT 'r' || lpad(i::text, 8, '0'), 2, 'l-' || i, 'tenant-' || (i % 20),
               'agent-' || (i % 50), now() - i * interval '2 seconds', 800,
               CASE WHEN i % 37 = 0 THEN 'TimeoutError' END, 'openai', 'model-' || (i % 5),
               900, 100, 1000
          FROM generate_series(1, {runs}) AS i
        """,
        f"""
        INSERT INTO blackbox_views.message_text (run_id, sequence, tenant_id, recorded_at,
               words)
        SELECT 'r' || lpad(i::text, 8, '0'), 2, 'tenant-' || (i % 20),
               now() - i * interval '2 seconds',
               to_tsvector('simple', {_WORDS})
          FROM generate_series(1, {runs}) AS i
        """,
        f"""
        INSERT INTO blackbox_views.runs (run_id, tenant_id, agent_id, status, event_count,
               last_sequence, started_at, finished_at, last_event_at, code_version)
        VALUES ('{BIG_RUN}', 'tenant-1', 'agent-1', 'succeeded', 10000, 10000,
                now() - interval '1 hour', now(), now(), 'v1')
        """,
        f"""
        INSERT INTO blackbox_views.events (run_id, sequence, event_id, event_type,
               body_version, topic, partition, "offset", input_digest, output_digest,
               chain_hash, recorded_at, attributes)
        SELECT '{BIG_RUN}', s, 'e-' || s,
               (ARRAY['llm.call', 'tool.call', 'clock.read', 'state.transition',
                      'random.draw'])[1 + s % 5],
               1, 'bench', 0, s, 'd', 'd', 'h',
               now() - interval '1 hour' + s * interval '300 ms',
               jsonb_build_object('model', 'model-1', 'latency_ms', '250.0',
                                  'branch', (s % 3)::text)
          FROM generate_series(1, 10000) AS s
        """,
        f"""
        INSERT INTO blackbox_views.llm_calls (run_id, sequence, event_id, tenant_id, agent_id,
               recorded_at, latency_ms, provider, model, prompt_tokens, completion_tokens,
               total_tokens)
        SELECT '{BIG_RUN}', s, 'e-' || s, 'tenant-1', 'agent-1',
               now() - interval '1 hour' + s * interval '300 ms', 250, 'openai', 'model-1',
               100, 20, 120
          FROM generate_series(5, 10000, 5) AS s
        """,
        "ANALYZE blackbox_views.runs",
        "ANALYZE blackbox_views.run_rollups",
        "ANALYZE blackbox_views.events",
        "ANALYZE blackbox_views.tool_calls",
        "ANALYZE blackbox_views.llm_calls",
        "ANALYZE blackbox_views.message_text",
    ]
    with progress() as display:
        task = display.add_task("filling the views", total=len(statements))
        with engine.begin() as conn:
            for statement in statements:
                conn.execute(text(statement))
                display.advance(task)
    engine.dispose()


def _searches(root: str, requests: int, runs: int) -> None:
    """The p95 of the run list searched by each of :data:`SEARCHES`, and over all."""
    every: list[float] = []
    for label, typed in SEARCHES.items():
        url = f"{root}/runs?{urlencode({'q': typed})}"
        _timed(url)  # a first request warms the pool
        times = [_timed(url) for _ in range(requests)]
        every += times
        emit(
            BENCH,
            "search_p95_ms",
            percentile(times, 95),
            unit="ms",
            target=SEARCH_TARGET_MS,
            at_least=False,
            search=label,
            runs=runs,
        )
    emit(
        BENCH,
        "search_p95_ms",
        percentile(every, 95),
        unit="ms",
        target=SEARCH_TARGET_MS,
        at_least=False,
        search="all",
        runs=runs,
    )


def _timed(url: str) -> float:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as answer:
        answer.read()
        if answer.status != 200:
            raise RuntimeError(f"{url} answered {answer.status}")
    return (time.perf_counter() - started) * 1000


def _cpu_seconds(pid: int) -> float:
    """CPU seconds (user and system) process ``pid`` has used, from its own counters."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _serve(url: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "BLACKBOX_DATABASE_URL": url}
    command = [sys.executable, "-m", "agent_blackbox.cli", "web", "--port", str(port)]
    with log.open("wb") as out:
        child = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while True:
        try:
            _timed(f"http://127.0.0.1:{port}/static/console.css")
            return child
        except OSError:
            if child.poll() is not None or time.monotonic() > deadline:
                child.kill()
                raise RuntimeError(
                    f"blackbox web did not start: {log.read_text()[-2000:]}"
                ) from None
            time.sleep(0.1)  # polling interval of the start-up deadline loop


def main(argv: Sequence[str] = ()) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.console")
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--port", type=int, default=28765)
    args = parser.parse_args(list(argv))
    base = make_url(Settings.from_env().database_url)
    name = f"{base.database}_console_bench"
    url = base.set(database=name).render_as_string(hide_password=False)
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    log = Path(f"/tmp/bench-console-{os.getpid()}.log")
    child = None
    try:
        with stage(f"migrate and fill {args.runs:,} runs"):
            migrate_write_side(url)
            migrate_views(url)
            _fill(url, args.runs)
        child = _serve(url, args.port, log)
        root = f"http://127.0.0.1:{args.port}"
        every: list[float] = []
        middle = datetime.now(UTC) - timedelta(seconds=args.runs)  # runs start 2 s apart
        deep = urlencode({"code_version": "v3", "after_at": middle.isoformat(), "after_id": "r"})
        with stage("run list"):
            for label, query in {**FILTERS, "code_version_half_way_down": deep}.items():
                _timed(f"{root}/runs?{query}")  # a first request warms the pool
                times = [_timed(f"{root}/runs?{query}") for _ in range(args.requests)]
                every += times
                emit(
                    BENCH,
                    "run_list_p95_ms",
                    percentile(times, 95),
                    unit="ms",
                    target=LIST_TARGET_MS,
                    at_least=False,
                    filter=label,
                    runs=args.runs,
                )
            emit(
                BENCH,
                "run_list_p95_ms",
                percentile(every, 95),
                unit="ms",
                target=LIST_TARGET_MS,
                at_least=False,
                filter="all",
                runs=args.runs,
            )
        with stage("search"):
            _searches(root, args.requests, args.runs)
        with stage("session page"):
            sessions = [f"s{n:07d}" for n in range(1, args.runs // 10, max(args.runs // 200, 1))]
            for session in sessions[:3]:
                _timed(f"{root}/sessions/{session}")  # warm
            times = [
                _timed(f"{root}/sessions/{sessions[n % len(sessions)]}")
                for n in range(args.requests * 2)
            ]
            emit(
                BENCH,
                "session_page_p95_ms",
                percentile(times, 95),
                unit="ms",
                target=SESSION_TARGET_MS,
                at_least=False,
                runs=args.runs,
                runs_per_session=10,
            )
        with stage("run page of 10,000 events"):
            _timed(f"{root}/runs/{BIG_RUN}")
            times, cpu = [], []
            for _ in range(max(args.requests // 4, 3)):
                before = _cpu_seconds(child.pid)
                times.append(_timed(f"{root}/runs/{BIG_RUN}"))
                cpu.append((_cpu_seconds(child.pid) - before) * 1000)
            emit(
                BENCH,
                "run_page_10k_events_p95_ms",
                percentile(times, 95),
                unit="ms",
                target=RUN_PAGE_TARGET_MS,
                at_least=False,
                events=10_000,
            )
            # The console's own CPU per page: what the wall figure is on a quiet machine,
            # less the database's time, whatever else runs on the cores.
            emit(
                BENCH,
                "run_page_10k_events_console_cpu_ms",
                percentile(cpu, 50),
                unit="ms",
                target=RUN_PAGE_TARGET_MS,
                at_least=False,
                events=10_000,
            )
    finally:
        if child is not None:
            child.terminate()
            child.wait(timeout=10)
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


if __name__ == "__main__":
    main(sys.argv[1:])
