"""The distribution as a user installs it: one import package, nothing shadowed by theirs.

The wheel is built from a copy of the sources and installed into a fresh virtualenv
without the network: its dependencies are lent from the test's own environment (every
installed distribution but this project, linked into a folder the new environment
reads after its own site-packages). The user's application lives in a folder holding a
``schemas.py``, a ``cli.py`` and a ``stack/`` of its own, each refusing to be imported.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

# Builds the wheel and installs it into fresh environments: the slowest unit tests. CI runs
# them (``make test`` selects every marker); ``-m 'not packaging'`` leaves them out locally.
pytestmark = pytest.mark.packaging

ROOT = Path(__file__).resolve().parents[2]
PROJECT = "agent_blackbox"
# What a user's own files next to their agent may be called; importing one fails.
USER_FILES = {
    "schemas.py": "raise ImportError('the user application schemas.py was imported')\n",
    "cli.py": "raise ImportError('the user application cli.py was imported')\n",
    "stack/__init__.py": "raise ImportError('the user application stack/ was imported')\n",
}
IGNORED = shutil.ignore_patterns(
    ".venv", ".cache", "build", "dist", ".git", "*.egg-info", "__pycache__", ".*_cache"
)


def _run(*command: str | Path, cwd: Path | None = None) -> str:
    done = subprocess.run(
        [str(part) for part in command],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, f"{command} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _lent_dependencies(target: Path) -> Path:
    """A folder of links to every distribution installed here, this project's excepted."""
    target.mkdir()
    site = Path(sysconfig.get_paths()["purelib"])
    for entry in site.iterdir():
        if (
            entry.name.startswith((PROJECT, "__editable__", "_" + PROJECT))
            or entry.suffix == ".pth"
        ):
            continue
        (target / entry.name).symlink_to(entry)
    return target


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with the project's wheel installed; its bin folder."""
    work = tmp_path_factory.mktemp("packaging")
    source = work / "source"
    shutil.copytree(ROOT, source, ignore=IGNORED, symlinks=True)
    wheels = work / "wheels"
    _run(
        sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
        "--quiet", "--wheel-dir", wheels, source,
    )  # fmt: skip
    [wheel] = wheels.glob("*.whl")
    fresh = work / "fresh"
    venv.EnvBuilder(with_pip=True).create(fresh)
    python = fresh / "bin" / "python"
    fresh_site = Path(
        _run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip()
    )
    lent = _lent_dependencies(work / "lent")
    # Read after the new environment's own site-packages, so the wheel wins.
    (fresh_site / "zz_lent_dependencies.pth").write_text(f"{lent}\n", encoding="utf-8")
    _run(python, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet", wheel)
    return fresh / "bin"


@pytest.mark.timeout(300)
def test_the_agent_import_works_beside_a_users_own_schemas_cli_and_stack(
    installed: Path, tmp_path: Path
) -> None:
    app = tmp_path / "app"
    for name, text in USER_FILES.items():
        (app / name).parent.mkdir(parents=True, exist_ok=True)
        (app / name).write_text(text, encoding="utf-8")
    code = (
        "from agent_blackbox import Recorder, RunSnapshot, replay\n"
        "from agent_blackbox.testing import MemoryRecorder\n"
        "import agent_blackbox, agent_blackbox.schemas\n"
        "assert 'site-packages' in agent_blackbox.__file__, agent_blackbox.__file__\n"
        "recorder = MemoryRecorder()\n"
        "agent = lambda r, i: r.call('t', len, i)\n"
        "run, out = recorder.record(agent, RunSnapshot('v', 'abc'), agent_id='a')\n"
        "assert out == 3 and len(recorder.events) == 3\n"
        "assert replay(recorder.events, agent).passed\n"
        "print('ok')\n"
    )
    assert _run(installed / "python", "-c", code, cwd=app).strip() == "ok"


@pytest.mark.timeout(300)
def test_the_wheel_installs_only_agent_blackbox_and_its_data(installed: Path) -> None:
    shown = _run(installed / "python", "-m", "pip", "show", "--files", "agent-blackbox")
    files = [line.strip() for line in shown.split("Files:", 1)[1].splitlines() if line.strip()]
    top = {Path(f).parts[0] for f in files if not f.startswith("..")}
    assert top == {PROJECT, "agent_blackbox-0.1.0.dist-info"}
    for data in (
        "agent_blackbox/py.typed",
        "agent_blackbox/__init__.pyi",
        "agent_blackbox/outbox/__init__.pyi",
        "agent_blackbox/replayer/__init__.pyi",
        "agent_blackbox/testing/fixtures.py",
        "agent_blackbox/schemas/avsc/envelope.v1.avsc",
        "agent_blackbox/outbox/migrations/env.py",
        "agent_blackbox/outbox/migrations/script.py.mako",
        "agent_blackbox/consumers/migrations/versions/0001_views.py",
        "agent_blackbox/stack/kafka/pom.xml",
        "agent_blackbox/stack/s3proxy/pom.xml",
        "agent_blackbox/stack/kafka/log4j2.xml",
    ):
        assert data in files, f"{data} is not in the wheel"
    assert not any(f.startswith(("agent_blackbox/tests", "agent_blackbox/bench")) for f in files)
    scripts = [f for f in files if f.startswith("..")]
    assert [Path(f).name for f in scripts] == ["blackbox"]


@pytest.mark.timeout(300)
def test_the_installed_command_and_data_files_work(installed: Path, tmp_path: Path) -> None:
    assert "flight recorder" in _run(installed / "blackbox", "--help", cwd=tmp_path)
    versions = (
        "from agent_blackbox.schemas import default_registry\n"
        "print(len(default_registry().versions('llm.call')))\n"
    )
    assert int(_run(installed / "python", "-c", versions, cwd=tmp_path)) >= 2
