"""The heap of a long-running stream process, settled once it has started."""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 50_000
"""Net new container objects between two young-generation collections (Python's default
is 700)."""


def settle_heap() -> None:
    """Collect once, exempt every object alive now from future collections, and collect
    the young generation less often.

    A relay's or consumer's process starts with about 100,000 tracked objects (its
    imports, schemas, engine and clients) that live as long as it does. Python's cyclic
    collector scans all of them at every full collection, 40-80 ms each at a few per
    100,000 events: a pause in the loop that commit-to-visible latency pays. After
    :func:`gc.freeze` the collector looks only at what the loop itself allocates.
    Reference counting still frees everything, frozen or not; only a reference cycle
    among objects frozen here would outlive its use, which is why the collection comes
    first.

    The loop allocates in batches: a view consumer's batch of 2,000 events is about
    60,000 objects that all live until the batch commits, so at the default threshold the
    collector scans each of them once or twice for nothing (about 3.6 s of CPU per
    million events). At :data:`YOUNG_THRESHOLD` a batch is mostly freed before a
    collection looks at it; cyclic garbage waits for at most that many objects.

    Called by the ``blackbox`` commands that run until stopped, right before their
    loop; a bench that drives the same classes in its own process calls it too, so
    that its own data (the rows it produced) is not scanned on the consumer's time.
    """
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
