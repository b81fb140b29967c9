"""A real headless Chromium (Debian's chromium and chromium-driver) for the console's
browser tests, and the console itself as a child process."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from agent_blackbox.schemas import Settings
from tests.integration._wait import eventually

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "tests" / "output" / "console"
"""Where the browser tests leave their screenshots (ignored by git)."""


def ensure_chromium() -> None:
    """Install Debian's chromium and chromium-driver when they are missing and this
    runs as root (as the stack installs PostgreSQL); otherwise fail saying what to do."""
    if CHROMIUM.exists() and CHROMEDRIVER.exists():
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.fail(
            "the console's browser tests need Debian's chromium and chromium-driver: "
            "`sudo apt-get install chromium chromium-driver`"
        )
    for argv in (
        ["apt-get", "update"],
        ["apt-get", "install", "-y", "chromium", "chromium-driver"],
    ):
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=900)
        if done.returncode != 0 and argv[1] == "install":
            pytest.fail(f"apt-get could not install chromium: {done.stderr[-2000:]}")


@contextmanager
def chromium() -> Iterator[webdriver.Chrome]:
    """A headless Chromium driven through chromedriver, closed at the end."""
    ensure_chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in (
        "--headless=new",
        "--no-sandbox",  # root in a container has no user namespace for the sandbox
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1000",
        "--no-first-run",
        "--disable-extensions",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def outside_address() -> str | None:
    """An address of this machine that is not loopback (the route out), if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("192.0.2.1", 9))  # no packet is sent: this only picks a route
        except OSError:
            return None
        address = str(sock.getsockname()[0])
    return None if address.startswith("127.") else address


def fetch(url: str, *, headers: dict[str, str] | None = None) -> tuple[int, str]:
    """(status, text) of a GET, whatever the status."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode("utf-8")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8")


@contextmanager
def console(
    settings: Settings,
    database_url: str,
    log: Path,
    *,
    host: str = "127.0.0.1",
    args: tuple[str, ...] = (),
) -> Iterator[str]:
    """``blackbox web`` on a free port as a child process; yields its base URL once it
    answers, and stops it at the end."""
    port = free_port()
    env = {
        **os.environ,
        "BLACKBOX_DATABASE_URL": database_url,
        "BLACKBOX_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "BLACKBOX_TOPIC": settings.topic,
        "PYTHONPATH": str(ROOT),
    }
    for name in ("BLACKBOX_KEK", "BLACKBOX_KEK_FILE", "BLACKBOX_CONSOLE_TOKEN_FILE"):
        env.pop(name, None)
    command = [sys.executable, "-m", "cli", "web", "--host", host, "--port", str(port), *args]
    with log.open("wb") as out:
        child = subprocess.Popen(command, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    base = (
        f"http://127.0.0.1:{port}" if host in ("127.0.0.1", "0.0.0.0") else f"http://{host}:{port}"
    )

    def up() -> bool:
        if child.poll() is not None:
            raise AssertionError(f"blackbox web exited: {log.read_text()[-3000:]}")
        try:
            with socket.create_connection(("127.0.0.1" if host == "0.0.0.0" else host, port), 0.5):
                return True
        except OSError:
            return False

    try:
        eventually(up, timeout=30, what="the console answering")
        yield base
    finally:
        child.terminate()
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


_WORDS_CUT = """
const cut = [];
for (const element of document.querySelectorAll(arguments[0])) {
  const texts = document.createTreeWalker(element, NodeFilter.SHOW_TEXT);
  for (let node = texts.nextNode(); node; node = texts.nextNode()) {
    for (const word of node.textContent.matchAll(/\\S+/g)) {
      const span = document.createRange();
      span.setStart(node, word.index);
      span.setEnd(node, word.index + word[0].length);
      const tops = new Set(Array.from(span.getClientRects(), r => Math.round(r.top)));
      if (tops.size > 1) cut.push(word[0]);
    }
  }
}
return cut;
"""


def words_cut(driver: webdriver.Chrome, selector: str) -> list[str]:
    """The words under the elements ``selector`` finds that the layout spreads over more
    than one line: a word cut in the middle (the console's pages must have none)."""
    found = driver.execute_script(_WORDS_CUT, selector)
    assert isinstance(found, list)
    return [str(word) for word in found]
