"""Make a training set's shard sets warm on the file system the trainer reads, and prove every shard is complete.

Locally the "FSx mount" is a folder: shards are copied in, each verified against the manifest
(size, sha256, row count), and the manifest is copied last, so a trainer that finds the manifest
finds every shard whole. Shards already there and intact are not copied again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from training_code.lib import training_set as ts
from training_code.lib.shard_format import ShardIntegrityError, verify_shard
from training_code.lib.storage import fetch_file, join, read_bytes, write_bytes_atomic


@dataclass
class WarmResult:
    path: Path
    shards: int
    rows: int
    bytes: int  # every file warmed: the shards, the excluded rows and the manifest
    copied: int
    already_warm: int


def warm_training_set(training_set_uri: str, mount: Path, key: str) -> WarmResult:
    """Warm every source's shard set of a training set under `mount/key/<source>/`, each shard
    verified there; the excluded rows and the training-set manifest are written last, so a trainer
    that finds the manifest finds every listed shard whole."""
    manifest_bytes = read_bytes(join(training_set_uri, ts.MANIFEST))
    manifest = json.loads(manifest_bytes)
    target = mount / key
    shards = rows = total = copied = already_warm = 0
    for source in manifest["sources"]:
        folder = target / source["folder"]
        folder.mkdir(parents=True, exist_ok=True)
        for entry in source["shards"]:
            try:
                verify_shard(folder, entry)
                already_warm += 1
            except ShardIntegrityError:  # missing or damaged on the mount: copy it (again)
                fetch_file(join(source["shards_uri"], entry["file"]), folder / entry["file"])
                verify_shard(folder, entry)
                copied += 1
            shards += 1
            rows += entry["rows"]
            total += entry["bytes"]
    excluded = read_bytes(join(training_set_uri, ts.EXCLUDED))
    write_bytes_atomic(target / ts.EXCLUDED, excluded)
    write_bytes_atomic(target / ts.MANIFEST, manifest_bytes)
    return WarmResult(target, shards, rows, total + len(excluded) + len(manifest_bytes), copied, already_warm)
