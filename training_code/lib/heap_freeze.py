"""Keep Python's cyclic garbage collector off the objects a pass starts with.

A full collection walks every object the collector tracks. A job's pass starts with hundreds of
thousands of them that live until it ends (the modules of pandas, pyarrow, pandera and Pillow, and a
caller's own), so each full collection its allocations trigger cost ~0.1 s of an incremental
validation's ~1 s, and found nothing to free. `gc.freeze` moves what is tracked now out of the
collector's sight; objects made afterwards are collected as before, and `gc.unfreeze` hands the
frozen ones back when the pass ends (a caller that runs many passes, such as a test, still frees them).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def heap_frozen() -> Iterator[None]:
    """`with heap_frozen():`, or `@heap_frozen()` on a function: what exists on entry is not collected inside."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
