"""The parts and what they may import: the architecture, checked on the source.

Every module of a part is read (not imported) and each ``agent_blackbox.<part>`` it
names, at any depth (inside functions and ``TYPE_CHECKING`` blocks too), is an edge of
the graph of parts. The graph must be the one the architecture allows and have no
cycle; an agent's import of the write side must load none of the pipeline's machinery.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PARTS = {
    "schemas": "schemas",
    "keystore": "keystore",
    "broker": "broker",
    "outbox": "outbox",
    "consumers": "consumers",
    "replayer": "replayer",
    "backup": "backup",
    "console": "console",
    "stack": "stack",
    "cli": "cli",
    "wiring": "wiring",
    "examples": "examples",
}
ALLOWED = {
    "schemas": set(),
    # The pool policy: every engine is built there (a leaf, like the contract).
    "wiring": set(),
    "keystore": {"schemas"},
    "broker": {"schemas"},
    # The write side: the relay (outbox.relay) publishes through the broker layer.
    "outbox": {"schemas", "wiring", "keystore", "broker"},
    "consumers": {"schemas", "wiring", "keystore", "broker", "outbox"},
    "replayer": {"schemas", "wiring", "keystore", "broker", "outbox"},
    # Backups and restore drills: a consumer of the topic, a restore of the write side,
    # views rebuilt on the restored copy.
    "backup": {"schemas", "wiring", "keystore", "broker", "outbox", "consumers"},
    # The run console: the views through the read side's functions, bodies through
    # the replayer's audited path, the key store's purpose rule.
    "console": {"schemas", "keystore", "consumers", "replayer"},
    "stack": {"schemas", "broker"},
    "examples": {"schemas", "wiring", "outbox", "consumers", "stack", "backup"},
    # The composition root: the one part that wires the others together.
    "cli": set(PARTS) - {"cli"},
}
# The front door (blackbox/: agent_blackbox itself and agent_blackbox.testing) composes the
# parts in the user's words: what it may import. The parts never import it, but for the
# examples, which are written as a user writes an agent.
FRONT_DOOR = "blackbox"
FRONT_DOOR_ALLOWED = {"schemas", "wiring", "keystore", "outbox", "consumers", "replayer"}
FRONT_DOOR_USERS = {"examples"}
# What an agent process carries: none of the pipeline's machinery.
FORBIDDEN_IN_AGENTS = ("confluent_kafka", "alembic", "prometheus_client", "rich")
# The LLM SDKs are optional extras: on the write side each is imported by its own capture
# module only (the recording transports, instrument() and the clients in the
# integrations package import neither), so an agent loads only the SDK it uses.
SDK_CAPTURES = {
    "openai": "outbox/integrations/openai.py",
    "anthropic": "outbox/integrations/anthropic.py",
}


def _imported_parts(path: Path) -> Iterator[tuple[str, int]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "agent_blackbox" and len(parts) > 1 and parts[1] in PARTS:
                yield parts[1], node.lineno


def _graph() -> dict[str, dict[str, str]]:
    """Part → imported part → one place that imports it."""
    graph: dict[str, dict[str, str]] = {part: {} for part in PARTS}
    for part, folder in PARTS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            for imported, line in _imported_parts(path):
                if imported != part:
                    where = f"{path.relative_to(ROOT)}:{line}"
                    graph[part].setdefault(imported, where)
    return graph


def test_parts_import_only_what_the_architecture_allows() -> None:
    graph = _graph()
    wrong = {
        f"{part} -> {imported} ({where})"
        for part, edges in graph.items()
        for imported, where in edges.items()
        if imported not in ALLOWED[part]
    }
    assert not wrong


def test_the_graph_of_parts_has_no_cycle() -> None:
    graph = {part: set(edges) for part, edges in _graph().items()}
    done: set[str] = set()

    def visit(part: str, path: tuple[str, ...]) -> None:
        assert part not in path, f"import cycle: {' -> '.join((*path, part))}"
        if part in done:
            return
        for imported in sorted(graph[part]):
            visit(imported, (*path, part))
        done.add(part)

    for part in sorted(graph):
        visit(part, ())


def test_the_write_side_imports_neither_the_read_side_nor_the_replayer() -> None:
    edges = _graph()["outbox"]
    assert "consumers" not in edges
    assert "replayer" not in edges


def _imports_of_the_front_door(path: Path) -> Iterator[int]:
    """The lines of ``path`` that import ``agent_blackbox`` itself or a module of its own
    folder (``agent_blackbox.testing``, ``agent_blackbox._replay``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "agent_blackbox" and (len(parts) == 1 or parts[1] not in PARTS):
                yield node.lineno


def test_the_front_door_imports_only_the_parts_it_composes() -> None:
    imported = {
        (part, f"{path.relative_to(ROOT)}:{line}")
        for path in sorted((ROOT / FRONT_DOOR).rglob("*.py"))
        if path.name != "__main__.py"  # ``python -m agent_blackbox`` is the blackbox command
        for part, line in _imported_parts(path)
    }
    assert {part for part, _ in imported} <= FRONT_DOOR_ALLOWED, sorted(imported)


def test_no_part_imports_the_front_door() -> None:
    found = {
        f"{path.relative_to(ROOT)}:{line}"
        for part, folder in PARTS.items()
        if part not in FRONT_DOOR_USERS
        for path in sorted((ROOT / folder).rglob("*.py"))
        for line in _imports_of_the_front_door(path)
    }
    assert not found


def test_the_checker_sees_the_front_door_however_it_is_imported(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "import agent_blackbox as bb\n"
        "from agent_blackbox import Recorder\n"
        "import agent_blackbox.outbox\n"
        "def f():\n"
        "    from agent_blackbox.testing import MemoryRecorder\n",
        encoding="utf-8",
    )
    assert sorted(_imports_of_the_front_door(module)) == [1, 2, 5]


def test_the_checker_sees_an_import_it_must_refuse(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from agent_blackbox.consumers import ViewConsumer\n"
        "def f():\n"
        "    import agent_blackbox.replayer._replay\n",
        encoding="utf-8",
    )
    assert sorted(_imported_parts(module)) == [("consumers", 3), ("replayer", 5)]


def _loaded_after(code: str, watched: tuple[str, ...] = FORBIDDEN_IN_AGENTS) -> list[str]:
    report = f"print(','.join(m for m in {watched!r} if m in sys.modules))"
    probe = f"import sys\n{code}\n{report}"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    return [m for m in done.stdout.strip().split(",") if m]


def test_importing_the_write_side_loads_no_pipeline_machinery() -> None:
    assert _loaded_after("import agent_blackbox.outbox") == []


@pytest.mark.timeout(120)
def test_an_agent_using_every_public_name_loads_no_pipeline_machinery() -> None:
    """Every name of the write side's surface, and a run recorded with the sync and the
    async memory recorder: still no Kafka client, alembic, metrics library or rich."""
    agent = (
        "import asyncio\n"
        "import agent_blackbox.outbox as o\n"
        "for name in o.__all__:\n"
        "    getattr(o, name)\n"
        "snapshot = o.RunSnapshot(code_version='probe', input={'n': 1})\n"
        "def entry(run, value):\n"
        "    return run.call('double', lambda n: 2 * n, value['n'])\n"
        "o.MemoryRecorder().record(entry, snapshot, agent_id='probe')\n"
        "async def entry_async(run, value):\n"
        "    return await run.call('double', lambda n: 2 * n, value['n'])\n"
        "asyncio.run(o.AsyncMemoryRecorder().record(entry_async, snapshot, agent_id='probe'))\n"
    )
    assert _loaded_after(agent) == []
    assert sorted(_loaded_after("import agent_blackbox.outbox.relay")) == [
        "confluent_kafka",
        "prometheus_client",
    ]


def _imported_modules(path: Path) -> Iterator[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module.split(".")[0]


def test_on_the_write_side_each_llm_sdk_is_imported_by_its_own_capture_only() -> None:
    importers = {
        (sdk, str(path.relative_to(ROOT)))
        for path in sorted((ROOT / "outbox").rglob("*.py"))
        for sdk in set(_imported_modules(path)) & SDK_CAPTURES.keys()
    }
    assert importers == set(SDK_CAPTURES.items())


@pytest.mark.timeout(120)
def test_an_agent_loads_only_the_llm_sdk_it_captures() -> None:
    sdks = tuple(SDK_CAPTURES)
    integrations = "agent_blackbox.outbox.integrations"
    assert _loaded_after(f"import agent_blackbox.outbox, {integrations}", sdks) == []
    for sdk in sdks:
        assert _loaded_after(f"import {integrations}.{sdk}", sdks) == [sdk]


def test_the_commands_live_in_the_cli_only() -> None:
    """The parts are libraries: no module of theirs is a command (none imports click);
    the ``blackbox`` commands live under ``cli/``, which wires the parts together."""
    commands = {
        str(path.relative_to(ROOT))
        for part, folder in PARTS.items()
        if part != "cli"
        for path in sorted((ROOT / folder).rglob("*.py"))
        if "click" in set(_imported_modules(path))
    }
    assert commands == set()


# A class is read whole: past this many lines (docstrings included) it holds more than one
# job, and its collaborators belong in classes of their own (issue 32's "no class over
# ~300 lines", with the margin the word "about" gives).
CLASS_LINES_MAX = 310


def test_no_class_is_longer_than_a_reader_holds_at_once() -> None:
    long: list[str] = []
    for folder in sorted({*PARTS.values(), FRONT_DOOR}):
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                    lines = node.end_lineno - node.lineno + 1
                    if lines > CLASS_LINES_MAX:
                        long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} {lines}")
    assert not long, f"classes over {CLASS_LINES_MAX} lines: {long}"


def test_each_command_is_found_under_its_own_name() -> None:
    """The root group imports a command's module when the command is asked for: each
    name of its table names a command of that name."""
    from click import Context

    from agent_blackbox.cli import main

    context = Context(main)
    names = main.list_commands(context)
    assert len(names) == len(set(names)) > 20
    for name in names:
        command = main.get_command(context, name)
        assert command is not None
        assert command.name == name


@pytest.mark.timeout(120)
def test_a_command_loads_only_the_parts_it_runs() -> None:
    """``blackbox replay --help`` does not load what other commands need: the backup
    store's client, the run console, the analytics consumer, the migrations' library."""
    others = (
        "boto3",
        "agent_blackbox.backup",
        "agent_blackbox.console",
        "agent_blackbox.consumers._analytics",
        "alembic",
    )
    code = (
        "from click.testing import CliRunner\n"
        "from agent_blackbox.cli import main\n"
        "done = CliRunner().invoke(main, ['replay', '--help'])\n"
        "assert done.exit_code == 0 and '--all' in done.output, done.output\n"
    )
    assert _loaded_after(code, others) == []
    assert _loaded_after("import agent_blackbox.cli; import agent_blackbox.consumers", others) == []


@pytest.mark.timeout(120)
def test_every_public_name_of_the_read_side_loads() -> None:
    """The read side's names load on first use (``consumers/__init__.pyi``): each one
    named there is there."""
    code = (
        "import agent_blackbox.consumers as c\n"
        "assert len(c.__all__) > 100\n"
        "missing = [n for n in c.__all__ if getattr(c, n, None) is None]\n"
        "assert not missing, missing\n"
    )
    assert _loaded_after(code, ("boto3",)) == []
