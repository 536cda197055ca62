"""What a detector keeps between ticks beside its cursor: committed exactly when the cursor is.

Dagster stores a sensor's cursor again with every tick it records, so the cursor holds only counters;
anything larger (a digest per source, the receipts of the messages a tick read) lives in the
instance's key-value store, in two slots by the parity of the tick's number. Tick n+1 reads slot
n % 2, valid only when it says n (the number in the cursor Dagster committed), and writes slot
(n + 1) % 2. A tick whose result was lost wrote only the slot that its retry writes again, so the
committed state is never overwritten by an uncommitted one.
"""

from __future__ import annotations

import hashlib
import json


class TickState:
    def __init__(self, store, name: str) -> None:
        """`store`: the instance's run storage (`get_cursor_values` / `set_cursor_values`)."""
        self._store = store
        self._name = f"zero_assets/{hashlib.sha256(name.encode()).hexdigest()[:16]}"

    def _slot(self, tick: int) -> str:
        return f"{self._name}/{tick % 2}"

    def read(self, tick: int):
        """What tick number `tick` wrote, or None when that tick wrote nothing (or was not committed)."""
        slot = self._slot(tick)
        value = self._store.get_cursor_values({slot}).get(slot)
        found = json.loads(value) if value else {}
        return found.get("value") if found.get("tick") == tick else None

    def write(self, tick: int, value) -> None:
        self._store.set_cursor_values({self._slot(tick): json.dumps({"tick": tick, "value": value})})
