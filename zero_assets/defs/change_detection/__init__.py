"""Which sources of the raw root changed since the last tick, without listing the lake.

Each detector (SQS events, S3 Inventory diff, listing digest) returns a `Detection`: changed sources
with a version token each, and a cursor of a few counters; larger state lives in `tick_state`.
"""

from __future__ import annotations

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
