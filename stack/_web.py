"""The run console (``blackbox web``) as a service of the local stack, so the demo can
leave it running for the reader and ``stack down`` stops it with the rest."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from rich.console import Console

from agent_blackbox.schemas import safe_console
from agent_blackbox.stack._process import ChildService, PidFile, require_free_port


class LocalWeb(ChildService):
    """``blackbox web`` on loopback (no token: this machine's clients only), reading the
    stack's database and topic.

    Args:
        cache_dir: The stack's cache folder; the console's pid file and log live in
            ``<cache_dir>/console``.
        port: Loopback port of the console.
        console: Where progress messages go (stderr by default).
    """

    name = "console"
    label = "the run console"

    def __init__(
        self,
        cache_dir: Path,
        port: int = 28765,
        *,
        console: Console | None = None,
        start_timeout: float = 30.0,
        stop_timeout: float = 10.0,
    ) -> None:
        self._root = cache_dir.resolve() / "console"
        self._port = port
        self._console = console or safe_console(stderr=True, soft_wrap=True)
        self._start_timeout = start_timeout
        self._stop_timeout = stop_timeout
        self._child: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Where a browser opens it."""
        return f"http://127.0.0.1:{self._port}/runs"

    @property
    def address(self) -> str:
        return self.url

    @property
    def data_dir(self) -> Path:
        return self._root

    @property
    def log_path(self) -> Path:
        return self._root / "console.out"

    def start(self, *, database_url: str, kafka_bootstrap: str) -> str:
        """Start the console on the stack's database and topic (a no-op when it runs);
        its URL.

        Raises:
            ServiceError: it exited or did not answer in time, or its port is taken.
        """
        pid = self.pid()
        if pid is not None:
            self._console.print(f"console: already running (pid {pid}) at {self.url}")
            return self.url
        self._remove_stale_pid_file()
        require_free_port(self._port, service="the run console", option="--console-port")
        self._root.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "BLACKBOX_DATABASE_URL": database_url,
            "BLACKBOX_KAFKA_BOOTSTRAP": kafka_bootstrap,
        }
        env.pop("BLACKBOX_CONSOLE_TOKEN_FILE", None)  # the stack's console is local-only
        argv = [sys.executable, "-m", "agent_blackbox.cli", *self._marker().split()[1:]]
        began = time.monotonic()
        self._launch_child(argv, out=self.log_path, answers=self._answers, env=env)
        self._console.print(
            f"console: started (pid {self.pid()}) at {self.url} in {time.monotonic() - began:.1f}s"
        )
        return self.url

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self._port}/static/console.css", timeout=2
            ) as answer:
                return bool(answer.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def _pid_file(self) -> PidFile:
        return PidFile(self._root / "console.pid", marker=self._marker())

    def _marker(self) -> str:
        return f"agent_blackbox.cli web --host 127.0.0.1 --port {self._port}"

    def _logs(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-3000:]
        except OSError:
            return "(no console log)"
