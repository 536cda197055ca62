"""Recorded verdicts of warm shards: `<shards folder>/.verified/<shard name>.json` records the entry checked
and the file's size, mtime_ns, ctime_ns and inode; the shard is not read again while both match."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .shard_format import ShardIntegrityError, verify_shard_file
from .storage import write_bytes_atomic

VERDICTS = ".verified"  # hidden: never a shard, never an output file
FORMAT = "zero-warm-verdict/1"
CHECKED = ("bytes", "sha256", "rows")  # the manifest entry's fields a verification proves


def verdict_path(shard: Path) -> Path:
    """Where the verdict of the shard at `shard` is kept: `.verified/<name>.json` beside it."""
    return shard.parent / VERDICTS / f"{shard.name}.json"


def file_state(path: Path) -> dict[str, int]:
    """What a verdict remembers of the file: any write to it, or a replacement, changes one of these."""
    facts = os.stat(path)
    return {"bytes": facts.st_size, "mtime_ns": facts.st_mtime_ns, "ctime_ns": facts.st_ctime_ns, "inode": facts.st_ino}


def checked_facts(entry: dict[str, Any]) -> dict[str, Any]:
    """The fields of a manifest entry a verification proves of a shard."""
    missing = [name for name in CHECKED if name not in entry]
    if missing:
        raise ValueError(f"shard entry {entry.get('path') or entry.get('file')!r} has no {missing[0]!r}")
    return {name: entry[name] for name in CHECKED}


def verdict_holds(shard: Path, entry: dict[str, Any]) -> bool:
    """Whether a recorded verdict says the file at `shard` is `entry`'s shard, unchanged since (one stat)."""
    try:
        recorded = json.loads(verdict_path(shard).read_bytes())
        state = file_state(shard)
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return False
    return (
        isinstance(recorded, dict)
        and recorded.get("format") == FORMAT
        and recorded.get("checked") == checked_facts(entry)
        and recorded.get("state") == state
    )


def record_verdict(shard: Path, entry: dict[str, Any], state: dict[str, int] | None = None) -> None:
    """Record that `shard` was verified as `entry`'s shard, in `state` (default: its state now)."""
    verdict = {
        "format": FORMAT,
        "name": shard.name,
        "checked": checked_facts(entry),
        "state": state or file_state(shard),
    }
    write_bytes_atomic(verdict_path(shard), json.dumps(verdict, sort_keys=True).encode())


def verify_and_record(shard: Path, entry: dict[str, Any]) -> None:
    """Verify `shard` against `entry` in full and record it; `ShardIntegrityError` if not."""
    forget_verdict(shard)
    before = file_state(shard) if shard.is_file() else None
    verify_shard_file(shard, entry)  # missing, wrong size, sha256 or rows: ShardIntegrityError
    if file_state(shard) != before:
        raise ShardIntegrityError(f"{shard}: changed while it was being verified; warm again")
    record_verdict(shard, entry, before)


def note_reuse(shard: Path) -> None:
    """Touch the verdict, so `zero-assets gc` counts the shard as written by the warm relying on it."""
    os.utime(verdict_path(shard))


def forget_verdict(shard: Path) -> None:
    """Drop the verdict of `shard`: before its file is replaced or removed, nothing may vouch for it."""
    verdict_path(shard).unlink(missing_ok=True)
