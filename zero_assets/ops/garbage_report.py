"""What `zero-assets gc` judges and prints: the lake's collectable units, each one's verdict, and the
report (path, bytes, why), what stays anyway, a total."""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Folder:
    """One collectable unit of the lake, with what the listing says about it."""

    key: str  # relative to the lake
    # "output", "run" (one run's job folder), "jobs" (an output's lease and checkpoints, or an older job
    # folder), or on the warm mount "warm set", "warm shard", "warm leftover" (garbage_shards)
    kind: str
    uri: str
    bytes: int  # of the files that belong to this unit alone (a "jobs" folder's runs are units of their own)
    files: tuple[str, ...] = ()  # a unit of single files (a warm shard and its verdict), deleted one by one, last first

    @property
    def parts(self) -> list[str]:
        return self.key.split("/")


@dataclass(frozen=True)
class Verdict:
    folder: Folder
    why: str  # why it is unreferenced
    kept_because: str | None  # set when it is unreferenced but must stay (a run may still be writing it)


def age(epoch_s: float) -> str:
    seconds = max(0.0, time.time() - epoch_s)
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds:.0f} s"


def report_lines(verdicts: list[Verdict], deleted: list[Folder] | None) -> list[str]:
    """The table (path, bytes, why unreferenced), then what stays anyway, then a total."""
    collectable = [v for v in verdicts if v.kept_because is None]
    width = max([len(v.folder.uri) for v in collectable] + [4])
    lines = [f"{'path':<{width}}  {'bytes':>14}  why unreferenced"]
    lines += [f"{v.folder.uri:<{width}}  {v.folder.bytes:>14,}  {v.why}" for v in collectable]
    kept = [v for v in verdicts if v.kept_because is not None]
    if kept:
        lines.append("")
        lines += [f"kept: {v.folder.uri} ({v.folder.bytes:,} bytes): {v.why}; {v.kept_because}" for v in kept]
    total = sum(v.folder.bytes for v in collectable)
    lines.append("")
    if deleted is None:
        lines.append(
            f"total: {len(collectable)} unreferenced folders, {total:,} bytes "
            "(dry run: nothing deleted; --delete removes them)"
        )
    else:
        lines.append(
            f"total: deleted {len(deleted)} unreferenced folders, {sum(f.bytes for f in deleted):,} bytes freed"
        )
    return lines
