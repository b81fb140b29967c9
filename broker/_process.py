"""The heap of a long-running stream process, set aside once it has started."""

from __future__ import annotations

import gc


def freeze_startup_heap() -> None:
    """Collect once, then exempt every object alive now from future collections.

    A relay's or consumer's process starts with about 100,000 tracked objects (its
    imports, schemas, engine and clients) that live as long as it does. Python's
    cyclic collector scans all of them at every full collection, 40-80 ms each at
    a few per 100,000 events: a pause in the loop that commit-to-visible latency
    pays, and about a tenth of a view consumer's CPU. After :func:`gc.freeze` the
    collector looks only at what the loop itself allocates. Reference counting still
    frees everything, frozen or not; only a reference cycle among objects frozen here
    would outlive its use, which is why the collection comes first.

    Called by the ``blackbox`` commands that run until stopped, right before their
    loop; a bench that drives the same classes in its own process calls it too, so
    that its own data (the rows it produced) is not scanned on the consumer's time.
    """
    gc.collect()
    gc.freeze()
