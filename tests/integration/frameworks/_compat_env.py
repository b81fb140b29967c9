"""A virtualenv of its own for the framework recipes whose packages cannot share the
project's development environment.

instructor (its ``jiter<0.15``) and LlamaIndex's OpenAI LLM (``openai<3``) pin the
``openai`` SDK below the dev pins (``openai>=3.57``, which needs ``jiter>=0.16``). Their
extras (``agent-blackbox[instructor,llama-index]``) resolve together to ``openai`` 2.x,
on the legacy ``httpx`` library, so their tests also cover the legacy recording
transport. The agent code of those tests runs in this environment, in a subprocess
(``_compat_driver``); the test process keeps the model server and the assertions.

The environment lives in the project's cache folder, ``.cache/blackbox/venvs/<hash>``
(``BLACKBOX_CACHE_DIR/venvs/<hash>`` when that is set), named after a hash of what it
holds: the Python that runs it, the project's dependencies and those two extras, the
folders its package is mapped from, and this checkout's path. A complete one (its marker
file is written once the install and an import check succeeded) is reused as it is, so
later runs need no network; another set of requirements gets another folder. Building
one is a ``pip install`` of the project with the two extras, its lines shown as progress:
about 80 distributions, 340 MB installed; 100 s on a busy 2-core machine with pip's
cache warm, plus the downloads on a cold one. Bytecode is compiled as modules are first
imported (``--no-compile``): the tests import a small part of what is installed.

The project is installed *editable in lenient mode*: a finder that maps
``agent_blackbox.*`` onto this checkout's folders, so the tests always run today's code
(no reinstall after an edit, none after adding a module) and nothing is written under
``build/``, where the main environment's strict editable install keeps its tree of links.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
EXTRAS = ("instructor", "llama-index")
LAYOUT = 1
"""The version of how the environment is built; a change of it builds a new one."""
INSTALL_TIMEOUT = 1200.0
"""Seconds a ``pip install`` may take before it is given up as hung."""
CHECK_IMPORTS = (
    "import importlib.metadata as m, json, instructor, llama_index.llms.openai, openai, httpx;"
    "import agent_blackbox.outbox.integrations._legacy, agent_blackbox.replayer;"
    "names = ('openai', 'httpx', 'instructor', 'llama-index-llms-openai', 'llama-index-core');"
    "print(json.dumps({n: m.version(n) for n in names}))"
)
PIP_OPTIONS = ("--progress-bar", "off", "--disable-pip-version-check", "--no-compile")
_MARKER = "blackbox-complete.json"
Say = Callable[[str], None]


class CompatEnvUnavailable(Exception):
    """The environment could not be built; ``offline`` when only because the package index
    is unreachable (the tests skip), otherwise a real failure (the tests fail)."""

    def __init__(self, message: str, *, offline: bool) -> None:
        super().__init__(message)
        self.offline = offline


@dataclass(frozen=True)
class CompatEnv:
    """A built environment: its folder and the versions it holds."""

    path: Path
    versions: dict[str, str]

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def describe(self) -> str:
        held = ", ".join(f"{name} {version}" for name, version in self.versions.items())
        return f"{_shown(self.path)} ({held})"


def cache_dir() -> Path:
    """The project's cache folder (``BLACKBOX_CACHE_DIR`` or ``.cache/blackbox``)."""
    base = os.environ.get("BLACKBOX_CACHE_DIR")
    return Path(base) if base else ROOT / ".cache" / "blackbox"


def requirement_set(root: Path = ROOT) -> dict[str, Any]:
    """What decides the environment's content (its folder is named after its hash)."""
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    project = pyproject["project"]
    extras = project.get("optional-dependencies", {})
    return {
        "layout": LAYOUT,
        "python": sys.version.split()[0],
        "implementation": sys.implementation.name,
        "root": str(root),
        "dependencies": project.get("dependencies", []),
        "extras": {name: extras[name] for name in EXTRAS},
        "scripts": project.get("scripts", {}),
        # The finder maps each folder of package-dir: a new one needs a new install.
        "package_dir": pyproject.get("tool", {}).get("setuptools", {}).get("package-dir", {}),
    }


def env_dir(requirements: dict[str, Any], base: Path | None = None) -> Path:
    """The folder of the environment that holds ``requirements``."""
    text = json.dumps(requirements, sort_keys=True, separators=(",", ":"))
    name = hashlib.sha256(text.encode()).hexdigest()[:16]
    return (base or cache_dir()) / "venvs" / name


def ensure_compat_env(*, say: Say = print, root: Path = ROOT) -> CompatEnv:
    """The environment for the current requirement set: reused when complete, built
    otherwise (one builder at a time: a file lock beside it).

    Raises:
        CompatEnvUnavailable: it could not be built.
    """
    requirements = requirement_set(root)
    path = env_dir(requirements)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path.with_suffix(".lock")):
        found = _complete(path, requirements)
        if found is not None:
            return found
        return _build(path, requirements, say=say, root=root)


@contextmanager
def _locked(lock: Path) -> Iterator[None]:
    with lock.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # another session building it: wait for it
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _complete(path: Path, requirements: dict[str, Any]) -> CompatEnv | None:
    marker = path / _MARKER
    if not marker.is_file() or not (path / "bin" / "python").exists():
        return None
    written = json.loads(marker.read_text())
    if written.get("requirements") != requirements:
        return None
    return CompatEnv(path, written["versions"])


def _build(path: Path, requirements: dict[str, Any], *, say: Say, root: Path) -> CompatEnv:
    """Create the venv, install the project with the extras, check the imports, mark it
    complete. A half-built folder (an interrupted build) is removed first."""
    started = time.monotonic()
    if path.exists():
        shutil.rmtree(path)
    say(f"building {_shown(path)}: the project with extras {', '.join(EXTRAS)} (once)")
    log = path.with_suffix(".log")
    log.write_text("")
    _step([sys.executable, "-m", "venv", str(path)], say=say, log=log, quiet=True)
    python = str(path / "bin" / "python")
    target = f"{root}[{','.join(EXTRAS)}]"
    # Lenient editable: a finder onto this checkout; nothing is written under build/.
    editable = ["--config-settings", "editable_mode=lenient", "--editable", target]
    _step([python, "-m", "pip", "install", *PIP_OPTIONS, *editable], say=say, log=log)
    checked = _step([python, "-c", CHECK_IMPORTS], say=say, log=log, quiet=True)
    versions = json.loads(checked.strip().splitlines()[-1])
    marker = {"requirements": requirements, "versions": versions}
    (path / _MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True))
    built = CompatEnv(path, versions)
    say(f"built {built.describe()} in {time.monotonic() - started:.0f} s")
    return built


def _step(command: list[str], *, say: Say, log: Path, quiet: bool = False) -> str:
    """Run one step of the build, its lines shown as they come (but ``quiet`` ones) and
    kept in ``log``; returns its output.

    Raises:
        CompatEnvUnavailable: it failed or hung.
    """
    lines: list[str] = []
    with log.open("a") as kept:
        kept.write(f"$ {' '.join(command)}\n")
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PIP_NO_INPUT": "1"},
        )
        assert process.stdout is not None
        watchdog = threading.Timer(INSTALL_TIMEOUT, process.kill)  # a hung pip is ended
        watchdog.start()
        try:
            for line in process.stdout:
                kept.write(line)
                lines.append(line.rstrip())
                if not quiet and line.strip() and not line.startswith(" "):
                    say(line.split(" (from ", 1)[0].rstrip())  # not the whole chain
            status = process.wait()
        finally:
            watchdog.cancel()
    if status != 0:
        raise _failure(command, status, lines, log)
    return "\n".join(lines)


def _failure(command: list[str], status: int, lines: list[str], log: Path) -> CompatEnvUnavailable:
    offline = not _index_answers(Path(command[0]))
    why = "the package index is unreachable" if offline else f"exit status {status}"
    tail = "\n".join(lines[-15:])
    return CompatEnvUnavailable(
        f"the framework environment could not be built ({why}): {' '.join(command[:4])} ...; "
        f"full log in {_shown(log)}; last lines:\n{tail}",
        offline=offline,
    )


def _index_answers(python: Path) -> bool:
    """Whether pip's package index answers (asked for pip's own releases, with no local
    wheel folder to answer instead): a failed install with an index that does not is
    the network's fault, not the requirements'."""
    ask = [str(python), "-m", "pip", "index", "versions", "pip", "--disable-pip-version-check"]
    try:
        asked = subprocess.run(
            ask,
            capture_output=True,
            timeout=120,
            env={**os.environ, "PIP_FIND_LINKS": "", "PIP_RETRIES": "1"},
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return asked.returncode == 0


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)
