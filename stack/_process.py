"""Processes the launcher owns: pid files, liveness, readiness waits, start and stop.

A pid alone does not identify a service: after a crash or a reboot the number may belong to
another program. Every check therefore also reads ``/proc/<pid>/cmdline`` and looks for a
marker only our process carries (its data directory or its config file path).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

from rich.console import Console

from agent_blackbox.schemas import BlackboxError

POLL_INTERVAL = 0.05
"""Seconds between two checks of a condition inside a deadline loop."""

ServiceState = Literal["running", "stopped", "external"]


class StackError(BlackboxError):
    """The local stack could not do what was asked; the message says what to do next."""


class MissingPrerequisiteError(StackError):
    """A program the stack needs (PostgreSQL, Java, Maven) is not installed."""


class ServiceError(StackError):
    """A service failed to start, to become ready, or to stop."""


@dataclass(frozen=True)
class ServiceStatus:
    """What ``status`` reports about one service.

    Attributes:
        name: ``"postgres"``, ``"kafka"`` or ``"s3"``.
        state: ``"running"``, ``"stopped"`` or ``"external"`` (not managed here).
        pid: The process id when running locally.
        address: The database URL, bootstrap address or S3 endpoint clients should use.
        data_dir: Where the service keeps its data; ``None`` for external services.
        role: ``"primary"`` or ``"standby"`` for a PostgreSQL with a standby; ``None``
            otherwise.
    """

    name: str
    state: ServiceState
    pid: int | None
    address: str
    data_dir: Path | None
    role: str | None = None


@dataclass(frozen=True)
class PidFile:
    """A pid file plus the marker that proves the pid still belongs to our process.

    The first line of the file is the pid, so PostgreSQL's own ``postmaster.pid`` can be
    read with this class as well as the files the launcher writes itself.
    """

    path: Path
    marker: str

    def read(self) -> int | None:
        """The pid recorded in the file, or ``None`` when there is no readable pid."""
        try:
            first_line = self.path.read_text().split("\n", 1)[0].strip()
        except (FileNotFoundError, NotADirectoryError):
            return None
        return int(first_line) if first_line.isdigit() else None

    def write(self, pid: int) -> None:
        """Record ``pid``, replacing the file atomically."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(self.path.name + ".tmp")
        partial.write_text(f"{pid}\n")
        partial.replace(self.path)

    def remove(self) -> None:
        """Delete the file if it exists."""
        self.path.unlink(missing_ok=True)

    def running_pid(self) -> int | None:
        """The recorded pid if that process is alive and still ours, else ``None``."""
        pid = self.read()
        if pid is not None and process_matches(pid, self.marker):
            return pid
        return None

    def is_stale(self) -> bool:
        """True when the file exists but its process is gone or is another program."""
        return self.path.exists() and self.running_pid() is None


def process_matches(pid: int, marker: str) -> bool:
    """True when process ``pid`` is alive and its command line contains ``marker``.

    A zombie has an empty command line, so an exited child that was not reaped yet
    counts as gone.
    """
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    return marker in raw.replace(b"\0", b" ").decode(errors="replace")


def wait_for(condition: Callable[[], bool], *, timeout: float) -> bool:
    """Poll ``condition`` until it holds or ``timeout`` seconds have passed.

    Returns:
        Whether the condition held before the deadline. ``condition`` may raise to
        abandon the wait early (for example when the process it waits for has died).
    """
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_INTERVAL)


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """True when something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=0.25):
            return True
    except OSError:
        return False


def require_free_port(port: int, *, service: str, option: str) -> None:
    """Raise when another program already listens on ``port``.

    Raises:
        ServiceError: naming the port and how to choose another one.
    """
    if port_open(port):
        raise ServiceError(
            f"Cannot start {service}: port 127.0.0.1:{port} is already in use by another "
            f"program. Stop that program or pick another port with {option}."
        )


def find_java(*, service: str, alternative: str) -> str:
    """The ``java`` program on the ``PATH``.

    Args:
        service: What needs it, for the message (``"Kafka"``).
        alternative: What to do instead of installing Java, ending the message.

    Raises:
        MissingPrerequisiteError: there is no ``java``.
    """
    java = shutil.which("java")
    if java is None:
        raise MissingPrerequisiteError(
            f"Java 17 or newer is needed to run {service}: "
            f"`apt-get install openjdk-17-jre-headless`, or {alternative}."
        )
    return java


def start_detached(
    argv: Sequence[str], *, log_path: Path, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in its own session with stdout and stderr appended to ``log_path``.

    Its own session keeps a Ctrl-C in the launching terminal (or a test runner's
    signal handling) from reaching the service.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        return subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def terminate(
    pid: int,
    *,
    marker: str,
    timeout: float,
    child: subprocess.Popen[bytes] | None = None,
) -> None:
    """Stop process ``pid``: SIGTERM, wait up to ``timeout`` seconds, then SIGKILL.

    Args:
        pid: The process to stop.
        marker: Its command-line marker; a pid that no longer matches counts as gone.
        timeout: Seconds to wait for a clean shutdown before killing.
        child: The ``Popen`` handle when this process started it, so it is reaped.

    Raises:
        ServiceError: when the process survives even SIGKILL.
    """
    _send(pid, signal.SIGTERM)
    if _wait_gone(pid, marker, child, timeout):
        return
    kill(pid, marker=marker, child=child)


def kill(pid: int, *, marker: str, child: subprocess.Popen[bytes] | None = None) -> None:
    """SIGKILL process ``pid`` and wait until it is gone.

    Raises:
        ServiceError: when the process is still there after the kill.
    """
    _send(pid, signal.SIGKILL)
    if not _wait_gone(pid, marker, child, timeout=10.0):
        raise ServiceError(
            f"Process {pid} survived SIGKILL. Check it with `ps -o pid,stat,cmd -p {pid}`."
        )


def _send(pid: int, signum: signal.Signals) -> None:
    # A process that is already gone is fine: the wait that follows returns at once.
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def _wait_gone(
    pid: int, marker: str, child: subprocess.Popen[bytes] | None, timeout: float
) -> bool:
    if child is not None:
        return wait_for(lambda: child.poll() is not None, timeout=timeout)
    return wait_for(lambda: not process_matches(pid, marker), timeout=timeout)


def run_checked(
    argv: Sequence[str],
    *,
    what: str,
    hint: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> str:
    """Run a short command to completion and return its combined output.

    Raises:
        MissingPrerequisiteError: when the program does not exist.
        ServiceError: when it exits non-zero; the message quotes the output's tail.
    """
    try:
        done = subprocess.run(
            list(argv),
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            check=False,
        )
    except FileNotFoundError as exc:
        raise MissingPrerequisiteError(
            f"{what} failed: {argv[0]} is not installed. {hint}"
        ) from exc
    if done.returncode != 0:
        raise ServiceError(
            f"{what} failed (exit code {done.returncode}). {hint}\n"
            f"Last output:\n{last_lines(done.stdout)}"
        )
    return done.stdout


def as_user(argv: Sequence[str], user: str | None) -> list[str]:
    """``argv`` run as OS user ``user`` via ``runuser``, or unchanged for ``None``."""
    return ["runuser", "-u", user, "--", *argv] if user else list(argv)


def last_lines(text: str, count: int = 20) -> str:
    """The last ``count`` non-empty lines of ``text``, indented for quoting."""
    lines = [line for line in text.splitlines() if line.strip()][-count:]
    return "\n".join(f"    {line}" for line in lines) or "    (no output)"


def tail_file(path: Path, count: int = 20, *, since: int = 0) -> str:
    """The last ``count`` lines of the file at ``path``, or a note that it is missing.

    Args:
        path: The log file.
        count: How many lines to quote.
        since: Ignore what was written before this byte offset (an earlier run's lines);
            a file now shorter than that was rotated and is read from its start.
    """
    try:
        with path.open("rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            start = since if since <= size else 0
            handle.seek(max(start, size - 64 * 1024))
            text = handle.read().decode(errors="replace")
    except FileNotFoundError:
        return f"    ({path} does not exist)"
    return last_lines(text, count)


def file_size(path: Path) -> int:
    """The size of ``path`` in bytes, 0 when it does not exist."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def stream_lines(process: subprocess.Popen[bytes]) -> IO[bytes]:
    """The stdout of a process started with ``stdout=PIPE``, to iterate line by line."""
    if process.stdout is None:
        raise ValueError("the process was not started with stdout=subprocess.PIPE")
    return process.stdout


class PidService(ABC):
    """A server process this stack starts, known by its pid file."""

    name: str = "service"

    @property
    @abstractmethod
    def address(self) -> str:
        """Where clients connect."""

    @property
    @abstractmethod
    def data_dir(self) -> Path:
        """Where the server keeps its data."""

    @abstractmethod
    def _pid_file(self) -> PidFile: ...

    def pid(self) -> int | None:
        """The server's pid when it is running, else ``None``."""
        return self._pid_file().running_pid()

    def is_running(self) -> bool:
        """Whether the server process is alive (it may still be starting)."""
        return self.pid() is not None

    def status(self) -> ServiceStatus:
        """A snapshot for ``stack status``."""
        pid = self.pid()
        state: ServiceState = "running" if pid is not None else "stopped"
        return ServiceStatus(self.name, state, pid, self.address, self.data_dir)


class ChildService(PidService):
    """A server this stack launches as a child process (a JVM), stopped by signal.

    Subclasses set ``_root``, ``_port``, ``_console``, the timeouts and ``_child`` (the
    process when this object launched it), and say how to recognise their process
    (``_marker``) and what of their logs to show when it fails (``_logs``).
    """

    label: str = "the service"
    """Its name in messages (``Kafka``, ``S3Proxy``)."""
    _root: Path
    _port: int
    _console: Console
    _start_timeout: float
    _stop_timeout: float
    _child: subprocess.Popen[bytes] | None

    @abstractmethod
    def _marker(self) -> str:
        """A string of the server's command line that tells it from other processes."""

    @abstractmethod
    def _logs(self) -> str:
        """The end of the server's logs, for an error message."""

    def _launch_child(
        self,
        argv: Sequence[str],
        *,
        out: Path,
        answers: Callable[[], bool],
        env: dict[str, str] | None = None,
    ) -> None:
        """Start ``argv`` detached, its output in ``out`` (the previous launch's kept as
        ``<out>.1``), and wait until its port is open and ``answers()``.

        Raises:
            ServiceError: it exited, or did not answer within the start timeout (it is
                killed then); the message quotes the end of its logs.
        """
        if out.exists():
            out.replace(out.with_name(out.name + ".1"))
        child = start_detached(argv, log_path=out, cwd=self._root, env=env)
        self._child = child
        self._pid_file().write(child.pid)

        def ready() -> bool:
            if child.poll() is not None:
                raise ServiceError(
                    f"{self.label} exited with code {child.returncode} while starting.\n"
                    f"{self._logs()}"
                )
            return port_open(self._port) and answers()

        try:
            if not wait_for(ready, timeout=self._start_timeout):
                raise ServiceError(
                    f"{self.label} did not answer on {self.address} within "
                    f"{self._start_timeout:g}s. Check the logs below; a slow machine may need "
                    f"a longer start_timeout.\n{self._logs()}"
                )
        except BaseException:
            kill(child.pid, marker=self._marker(), child=child)
            self._forget()
            raise

    def stop(self) -> None:
        """Shut the server down cleanly (SIGTERM), killing it after ``stop_timeout``.

        A no-op when it is not running. Its data is kept: a later ``start()`` serves it
        again.
        """
        pid = self.pid()
        if pid is None:
            self._remove_stale_pid_file()
            self._console.print(f"{self.name}: not running")
            return
        terminate(pid, marker=self._marker(), timeout=self._stop_timeout, child=self._own(pid))
        self._forget()
        self._console.print(f"{self.name}: stopped")

    def kill(self) -> None:
        """SIGKILL the server, as a crash would; for outage tests."""
        pid = self.pid()
        if pid is not None:
            kill(pid, marker=self._marker(), child=self._own(pid))
        self._forget()

    def _own(self, pid: int) -> subprocess.Popen[bytes] | None:
        return self._child if self._child is not None and self._child.pid == pid else None

    def _forget(self) -> None:
        self._pid_file().remove()
        self._child = None

    def _remove_stale_pid_file(self) -> None:
        if self._pid_file().is_stale():
            self._console.print(f"{self.name}: removing a stale pid file (its process is gone)")
            self._pid_file().remove()
