"""What gc judges by, and what shard sets keep alive: the units of the lake (`unit_of`), earlier arrow_shards
folders an output lists shards in (one level only), and a warm mount's sets (kept while a materialization names
them) and shards (kept while a set that stays lists them).
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from training_code.lib.shard_format import SHARDS
from training_code.lib.storage import join, read_bytes
from training_code.lib.warm_verdicts import VERDICTS
from zero_assets.backends.local.warm_state import SETS
from zero_assets.core.job_request import RUNS_FOLDER
from zero_assets.core.settings import JOBS_FOLDER

SHARD_ASSET = "arrow_shards"
WARM_ASSET = "fsx_warm_state"
WARM_MOUNT_KEY = "warm_mount"  # what fsx_warm_state records its mount as
WARM_SET, WARM_SHARD, WARM_LEFTOVER = "warm set", "warm shard", "warm leftover"


@dataclass(frozen=True)
class Folder:
    """One collectable unit of the lake, with what the listing says about it."""

    key: str  # relative to the lake
    # "output", "run" (one run's job folder), "jobs" (an output's lease and checkpoints, or an older job
    # folder), or on the warm mount "warm set", "warm shard", "warm leftover"
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


_FINGERPRINT = re.compile(r"[0-9a-f]{16}")  # also a warm set's key


def unit_of(key: str, assets: set[str]) -> tuple[str, str] | None:
    """(unit key, kind) that a listed file belongs to, None for files gc never touches."""
    parts = key.split("/")
    if parts[0] in assets and len(parts) >= 3:
        # A per-source asset's outputs sit one folder deeper, under the source's folder.
        depth = 2 if _FINGERPRINT.fullmatch(parts[1]) else 3
        return ("/".join(parts[:depth]), "output") if len(parts) > depth else None
    if parts[0] != JOBS_FOLDER or len(parts) < 3:
        return None  # anything else in the lake is not ours to judge
    if parts[1] not in assets:
        return "/".join(parts[:2]), "jobs"  # the older one-folder-per-job layout
    if len(parts) >= 6 and parts[3] == RUNS_FOLDER:
        return "/".join(parts[:5]), "run"
    return ("/".join(parts[:3]), "jobs") if len(parts) >= 4 else None


def age(epoch_s: float) -> str:
    seconds = max(0.0, time.time() - epoch_s)
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds:.0f} s"


def unreferenced_on_mounts(
    mounts: list[str], names_path: Callable[[str], bool], cutoff: float, recent: str
) -> list[Verdict]:
    """Warm-mount units nothing keeps: unnamed sets, then shards no kept set lists."""
    verdicts = []
    for mount in mounts:
        listed: set[str] = set()
        for key, kind, files in mount_units(mount):
            uri = os.path.join(mount, key)
            if kind == WARM_SET:
                named, written = names_path(uri), _newest(uri)
                if named or written >= cutoff:
                    listed |= {posixpath.basename(path) for path in shard_paths(join(uri, "manifest.json"))}
                if named:
                    continue
                why, size, files = "warm set: no stored materialization names it", _folder_bytes(uri), []
            elif kind == WARM_SHARD and key.rpartition("/")[2] in listed:
                continue
            else:
                why = (
                    "warm shard: no set kept on the mount lists it"
                    if kind == WARM_SHARD
                    else "warm leftover: a verdict without its shard, or a temporary copy a fetch left"
                )
                size = sum(os.lstat(path).st_size for path in files)
                written = max(os.lstat(path).st_mtime for path in files)
            kept = f"last {recent}, {age(written)} ago" if written >= cutoff else None
            verdicts.append(Verdict(Folder(key, kind, uri, size, tuple(files)), why, kept))
    return verdicts


def shard_paths(manifest_uri: str) -> list[str]:
    """The `path` of every shard a shard-set manifest lists; none for another layout or a missing manifest."""
    try:
        manifest = json.loads(read_bytes(manifest_uri))
    except FileNotFoundError:
        return []
    shards = manifest.get("shards") if isinstance(manifest, dict) else None
    return [entry["path"] for entry in shards or [] if isinstance(entry, dict) and isinstance(entry.get("path"), str)]


def kept_for_their_shards(
    outputs: Iterable[tuple[str, str]],
    stays: Callable[[str], bool],
    assets: set[str],
) -> set[str]:
    """The keys of arrow_shards outputs holding a shard listed by another of `outputs` (key, uri) that `stays`."""
    kept = set()
    for key, uri in outputs:
        if not stays(uri):
            continue
        for path in shard_paths(join(uri, "manifest.json")):
            if path.startswith("/"):
                continue  # not in the lake: the warm step and the readers refuse it
            listed = posixpath.normpath(posixpath.join(key, path))
            unit = None if listed.startswith("../") else unit_of(listed, assets)
            if unit is not None and unit[1] == "output" and unit[0] != key:
                kept.add(unit[0])
    return kept


def mount_units(mount: str) -> list[tuple[str, str, list[str]]]:
    """(key, kind, files) of each set, shard (with verdict) and leftover on a warm mount."""
    root = Path(mount)
    units: list[tuple[str, str, list[str]]] = []
    sets = sorted((root / SETS).iterdir()) if (root / SETS).is_dir() else []
    earlier = [p for p in sorted(root.iterdir()) if _FINGERPRINT.fullmatch(p.name)] if root.is_dir() else []
    units += [(str(p.relative_to(root)), WARM_SET, [str(p)]) for p in [*sets, *earlier] if p.is_dir()]
    shards, verdicts = root / SHARDS, root / SHARDS / VERDICTS
    names = sorted(p.name for p in shards.iterdir() if p.is_file()) if shards.is_dir() else []
    for name in names:
        verdict = verdicts / f"{name}.json"
        kind = WARM_LEFTOVER if name.startswith(".") else WARM_SHARD
        files = [str(shards / name), *([str(verdict)] if verdict.is_file() and kind == WARM_SHARD else [])]
        units.append((f"{SHARDS}/{name}", kind, files))
    alone = sorted(p for p in verdicts.iterdir() if p.is_file()) if verdicts.is_dir() else []
    units += [
        (f"{SHARDS}/{VERDICTS}/{p.name}", WARM_LEFTOVER, [str(p)])
        for p in alone
        if p.name.removesuffix(".json") not in names
    ]
    return units


def _newest(path: str) -> float:
    return max(
        [os.lstat(path).st_mtime]
        + [os.lstat(os.path.join(folder, n)).st_mtime for folder, dirs, names in os.walk(path) for n in dirs + names]
    )


def _folder_bytes(path: str) -> int:
    return sum(os.lstat(os.path.join(folder, name)).st_size for folder, _, names in os.walk(path) for name in names)
