"""Which sources of the raw root changed since the last tick, without listing the lake: each detector (SQS
events, S3 Inventory diff, listing digest) returns a `Detection`; state larger than its cursor is a `TickState`."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field


@dataclass
class Detection:
    changed: dict[str, str]  # source -> version token of this change (a data version for `raw_data`)
    cursor: dict  # the detector's next cursor (JSON, a few counters); holds its "kind" and tick number
    summary: str  # what was looked at, for the tick's log and skip reason
    problems: list[str] = field(default_factory=list)  # malformed messages, keys that name no source
    # Counts ticks that found changes: part of run keys, so a return to an earlier state still runs.
    change_number: int = 0
    # No earlier digests to compare with: every source counts as changed (the sensor drops indexed ones).
    baseline: bool = False


class TickState:
    """What a detector keeps beside its cursor, committed exactly when the cursor is: in the instance's key-value
    store (`store`: its run storage), two slots by tick parity; a lost tick only wrote the slot its retry rewrites."""

    def __init__(self, store, name: str) -> None:
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
