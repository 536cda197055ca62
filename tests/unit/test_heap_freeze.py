"""heap_frozen: what exists on entry is out of the collector's sight inside, and handed back on exit."""

from __future__ import annotations

import gc
import weakref

from training_code.lib.heap_freeze import heap_frozen


class Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


def test_objects_from_before_are_frozen_inside_and_freed_after_while_new_garbage_is_collected_inside():
    before = Node()
    dropped_before = weakref.ref(before)
    with heap_frozen():
        assert gc.get_freeze_count() > 0
        del before
        gc.collect()
        assert dropped_before() is not None  # frozen: even a full collection leaves it
        made_inside = weakref.ref(Node())
        gc.collect()
        assert made_inside() is None  # made after the freeze: collected as usual
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert dropped_before() is None
