"""What shard sets keep alive for `zero-assets gc`: earlier arrow_shards folders, and the warm mount.

An earlier shard folder stays while an output that stays on its own lists a shard in it (one level only).
On a warm mount a set stays while a materialization names it, and a shard while a set that stays lists it.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from training_code.lib.shard_format import SHARDS
from training_code.lib.storage import join, read_bytes
from training_code.lib.warm_verdicts import VERDICTS
from zero_assets.backends.local.warm_state import SETS

SHARD_ASSET = "arrow_shards"
WARM_ASSET = "fsx_warm_state"
WARM_MOUNT_KEY = "warm_mount"  # what fsx_warm_state records its mount as
WARM_SET, WARM_SHARD, WARM_LEFTOVER = "warm set", "warm shard", "warm leftover"
_KEY = re.compile(r"[0-9a-f]{16}")


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
    unit_of: Callable[[str, set[str]], tuple[str, str] | None],
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
    """(key relative to the mount, kind, files) of every unit on a warm mount: sets (their folder), shards
    (the shard and its verdict), verdicts without a shard and temporary files."""
    root = Path(mount)
    units: list[tuple[str, str, list[str]]] = []
    sets = sorted((root / SETS).iterdir()) if (root / SETS).is_dir() else []
    earlier = [p for p in sorted(root.iterdir()) if _KEY.fullmatch(p.name)] if root.is_dir() else []
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


def set_shard_names(set_uri: str) -> set[str]:
    """The mount shards a warm set's manifest lists (`../../shards/<name>`)."""
    return {posixpath.basename(path) for path in shard_paths(join(set_uri, "manifest.json"))}


@dataclass(frozen=True)
class Candidate:
    """A unit on a warm mount nothing keeps, with what gc reports and judges it by."""

    key: str  # relative to the mount
    kind: str
    uri: str
    bytes: int
    files: tuple[str, ...]  # a shard unit's files (the shard, then its verdict); empty for a set's folder
    why: str
    written: float  # its newest write, epoch seconds: a unit written since the cutoff stays


def unreferenced_on_mount(mount: str, names_path: Callable[[str], bool], cutoff: float) -> list[Candidate]:
    """The units of a warm mount nothing keeps: sets no materialization names (`names_path`), then shards no
    set that stays lists (a set written since `cutoff` stays)."""
    candidates, listed = [], set()
    for key, kind, files in mount_units(mount):
        uri = os.path.join(mount, key)
        if kind == WARM_SET:
            named, written = names_path(uri), _newest(uri)
            if named or written >= cutoff:
                listed |= set_shard_names(uri)
            if not named:
                why = "warm set: no stored materialization names it"
                candidates.append(Candidate(key, kind, uri, _folder_bytes(uri), (), why, written))
            continue
        if kind == WARM_SHARD and key.rpartition("/")[2] in listed:
            continue
        why = (
            "warm shard: no set kept on the mount lists it"
            if kind == WARM_SHARD
            else "warm leftover: a verdict without its shard, or a temporary copy a fetch left"
        )
        size = sum(os.lstat(path).st_size for path in files)
        written = max(os.lstat(path).st_mtime for path in files)
        candidates.append(Candidate(key, kind, uri, size, tuple(files), why, written))
    return candidates


def _newest(path: str) -> float:
    return max(
        [os.lstat(path).st_mtime]
        + [os.lstat(os.path.join(folder, n)).st_mtime for folder, dirs, names in os.walk(path) for n in dirs + names]
    )


def _folder_bytes(path: str) -> int:
    return sum(os.lstat(os.path.join(folder, name)).st_size for folder, _, names in os.walk(path) for name in names)
