"""Which sources of the raw root changed since the last tick, without listing the lake.

Three detectors, one per kind of raw root, each a module: S3 Event Notifications read from an SQS
queue (`sqs_detector`), S3 Inventory reports diffed per source (`inventory_diff`), and a per-source
listing digest for local roots (`listing_digest`). Each returns a `Detection`: the changed sources
with a cheap version token each, and a cursor of a few counters: what is larger (a digest per
source, the receipts of messages read) waits beside it in the instance (`tick_state`), never a line
per key.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Detection:
    changed: dict[str, str]  # source -> version token of this change (a data version for `raw_data`)
    cursor: dict  # the detector's next cursor (JSON, a few counters); holds its "kind" and tick number
    summary: str  # what was looked at, for the tick's log and skip reason
    problems: list[str] = field(default_factory=list)  # malformed messages, keys that name no source
    change_number: int = (
        0  # counts ticks that found changes: part of run keys, so a return to an earlier state still runs
    )
    # No digests of an earlier tick to compare with (the sensor's first tick, or its state was lost):
    # every source counts as changed, and the sensor drops those its latest index already covers.
    baseline: bool = False
