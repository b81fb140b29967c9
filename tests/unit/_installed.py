"""A library installed for a test the way distributions are: a module in a
``site-packages`` folder, so that the call-site code counts its frames as a library's."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest


def installed(
    name: str, source: str, *, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[ModuleType]:
    """Install the module ``name`` holding ``source`` under ``tmp_path`` and yield it,
    imported; it is forgotten after (``yield from`` it in a fixture)."""
    folder = tmp_path / "env" / "lib" / "python3" / "site-packages"
    folder.mkdir(parents=True)
    (folder / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(folder))
    yield importlib.import_module(name)
    sys.modules.pop(name, None)


def marked_line(source: str, marker: str) -> int:
    """The number of the line of ``source`` that ends with ``# mark:<marker>``."""
    lines = source.splitlines()
    return next(n for n, text in enumerate(lines, 1) if text.endswith(f"# mark:{marker}"))
