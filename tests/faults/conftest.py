"""The fault matrix's own Postgres and Kafka, started once for the package.

They listen on free ports under ``<cache>/test/faults`` and are stopped at the end, so a
scenario may kill, pause and restart them without touching the services the other tests
use.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from tests.conftest import _cache_dir
from tests.faults._harness import FaultStack


@pytest.fixture(scope="package")
def fault_stack() -> Iterator[FaultStack]:
    if shutil.which("java") is None:
        pytest.skip("no Java runtime: the fault matrix needs a Kafka broker it controls")
    stack = FaultStack(_cache_dir() / "faults")
    try:
        stack.start()
        yield stack
    finally:
        stack.stop()
