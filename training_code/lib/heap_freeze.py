"""Keep Python's cyclic garbage collector off the long-lived objects a pass starts with (its libraries'
modules), which full collections would walk in vain; newer objects are collected as before.
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
