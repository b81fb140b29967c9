"""Jars a service runs from, copied by Maven once into the stack's cache folder.

Each service that runs on the JVM ships a pom listing what it needs. The first start runs
``mvn dependency:copy-dependencies`` on it; a marker file holding the pom's digest then
says the copy is complete, so later starts need neither Maven nor the network, and a
changed pom (a new version) triggers a fresh copy.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from collections import deque
from pathlib import Path

from rich.console import Console

from agent_blackbox.stack._process import (
    MissingPrerequisiteError,
    ServiceError,
    last_lines,
    stream_lines,
)

_DOWNLOADED = re.compile(r"Downloaded from [^:]+: (\S+)")
_DOWNLOADING = re.compile(r"Downloading from [^:]+: (\S+)")


def downloaded_artifact(maven_line: str) -> str | None:
    """The file name in a Maven ``Downloaded from`` line, else ``None``."""
    return _file_name(_DOWNLOADED.search(maven_line))


def downloading_artifact(maven_line: str) -> str | None:
    """The file name in a Maven ``Downloading from`` line, else ``None``."""
    return _file_name(_DOWNLOADING.search(maven_line))


def _file_name(match: re.Match[str] | None) -> str | None:
    return match.group(1).rsplit("/", 1)[-1] if match else None


class MavenJars:
    """The jars ``pom`` resolves, copied into ``jar_dir`` once per version of the pom.

    Args:
        jar_dir: Where the jars go; it is emptied before a fresh copy.
        pom: The pom whose dependencies are copied.
        service: The service's name, prefixed to progress messages (``"kafka"``).
        what: What is fetched, for messages (``"the Kafka jars"``).
        alternative: What to do instead of installing Maven, ending the error message
            (``"set BLACKBOX_KAFKA_BOOTSTRAP to use a broker you already run"``).
        console: Where progress messages go.
    """

    def __init__(
        self,
        jar_dir: Path,
        *,
        pom: Path,
        service: str,
        what: str,
        alternative: str,
        console: Console,
    ) -> None:
        self._jar_dir = jar_dir
        self._pom = pom
        self._service = service
        self._what = what
        self._alternative = alternative
        self._console = console
        self._marker = jar_dir / ".complete"

    @property
    def classpath(self) -> str:
        """The ``-cp`` value; the JVM expands the wildcard itself."""
        return f"{self._jar_dir}/*"

    def is_complete(self) -> bool:
        """Whether the jars of the current pom are all present."""
        return self._marker.exists() and self._marker.read_text().strip() == self._pom_digest()

    def ensure(self) -> None:
        """Copy the jars unless a complete copy exists.

        Raises:
            MissingPrerequisiteError: Maven is not installed.
            ServiceError: Maven could not resolve the jars (quoting its last lines).
        """
        if self.is_complete():
            return
        if self._jar_dir.exists():
            shutil.rmtree(self._jar_dir)
        self._console.print(f"{self._service}: fetching {self._what} with Maven (first start only)")
        self._run_maven()
        self._marker.write_text(self._pom_digest() + "\n")

    def _pom_digest(self) -> str:
        return hashlib.sha256(self._pom.read_bytes()).hexdigest()

    def _run_maven(self) -> None:
        argv = ["mvn", "-B", "-f", str(self._pom), "dependency:copy-dependencies"]
        argv += [f"-DoutputDirectory={self._jar_dir}", "-DincludeScope=runtime"]
        try:
            process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )
        except FileNotFoundError as exc:
            raise MissingPrerequisiteError(
                f"Maven is needed once to fetch {self._what}: `apt-get install maven`, "
                f"or {self._alternative}."
            ) from exc
        output = "\n".join(self._follow(process))
        if process.returncode != 0:
            raise ServiceError(
                f"Maven could not fetch {self._what} (exit code {process.returncode}). "
                f"Check network access to the Maven repository, then retry.\n"
                f"Last output:\n{last_lines(output)}"
            )

    def _follow(self, process: subprocess.Popen[bytes]) -> deque[str]:
        """Show Maven's downloads as they happen; keep its last lines for errors."""
        recent: deque[str] = deque(maxlen=25)
        count = 0
        with process, self._console.status(f"{self._service}: resolving jars with Maven") as status:
            for raw in stream_lines(process):
                line = raw.decode(errors="replace").rstrip()
                recent.append(line)
                # Maven in batch mode shows no transfer progress: naming the file being
                # fetched at least says what a long wait (a jar of 40 MB) is spent on.
                pending = downloading_artifact(line)
                if pending is not None:
                    status.update(f"{self._service}: downloading {pending}")
                artifact = downloaded_artifact(line)
                if artifact is None:
                    continue
                count += 1
                status.update(f"{self._service}: downloaded {count} files, latest {artifact}")
                if not self._console.is_terminal and artifact.endswith(".jar"):
                    self._console.print(f"  downloaded {artifact}")
        return recent
