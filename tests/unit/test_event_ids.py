"""Event ids: random version-4 UUIDs in canonical form, from a per-thread pool of random
bytes that a forked child never shares with its parent."""

from __future__ import annotations

import os
import threading
import uuid

import pytest

from agent_blackbox.outbox._writer import new_event_id


def test_an_event_id_is_a_canonical_version_4_uuid() -> None:
    for _ in range(1_000):  # more than one pool's worth
        text = new_event_id()
        parsed = uuid.UUID(text)
        assert str(parsed) == text
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122


def test_event_ids_do_not_repeat_within_or_across_threads() -> None:
    found: list[list[str]] = []

    def draw() -> None:
        found.append([new_event_id() for _ in range(2_000)])

    threads = [threading.Thread(target=draw) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [i for ids in found for i in ids]
    assert len(set(every)) == len(every) == 8_000


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_does_not_hand_out_its_parents_next_ids() -> None:
    new_event_id()  # the parent's pool is filled: the child inherits its bytes
    reading, writing = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child's side
        os.write(writing, ",".join(new_event_id() for _ in range(5)).encode())
        os._exit(0)
    os.close(writing)
    with os.fdopen(reading) as pipe:
        from_child = pipe.read().split(",")
    os.waitpid(child, 0)
    from_parent = [new_event_id() for _ in range(5)]
    assert len(from_child) == 5
    assert not set(from_child) & set(from_parent)
