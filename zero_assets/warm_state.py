"""Make a shard set warm on the file system the trainer reads, and prove every shard is complete.

Locally the "FSx mount" is a folder: shards are copied in, each verified against the manifest
(size, sha256, row count), and the manifest is copied last, so a trainer that finds the manifest
finds every shard whole. Shards already there and intact are not copied again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from training_code.lib.shard_format import MANIFEST, ShardIntegrityError, verify_shard
from training_code.lib.storage import fetch_file, join, read_bytes, write_bytes_atomic


@dataclass
class WarmResult:
    path: Path
    shards: int
    bytes: int
    copied: int
    already_warm: int


def warm_shards(shards_uri: str, mount: Path, key: str) -> WarmResult:
    manifest_bytes = read_bytes(join(shards_uri, MANIFEST))
    manifest = json.loads(manifest_bytes)
    target = mount / key
    target.mkdir(parents=True, exist_ok=True)
    copied = already_warm = 0
    for entry in manifest["shards"]:
        try:
            verify_shard(target, entry)
            already_warm += 1
            continue
        except ShardIntegrityError:
            pass  # missing or damaged on the mount: copy it (again)
        fetch_file(join(shards_uri, entry["file"]), target / entry["file"])
        verify_shard(target, entry)
        copied += 1
    write_bytes_atomic(target / MANIFEST, manifest_bytes)
    return WarmResult(target, len(manifest["shards"]), sum(e["bytes"] for e in manifest["shards"]), copied, already_warm)
