"""What a detector keeps between ticks beside its cursor: committed exactly when the cursor is.

Dagster stores the cursor with every tick, so larger state goes to the instance's key-value store in
two slots by tick parity; a lost tick only wrote the slot its retry rewrites, never the committed one.
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
