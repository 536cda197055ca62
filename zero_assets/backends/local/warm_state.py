"""Make a training set's shard sets warm on the file system the trainer reads, and prove every shard is complete.

Locally the "FSx mount" is a folder. A shard already there and intact (size, sha256, row count against
the manifest) is not copied again. Any other is fetched to a temporary name, verified there, and only
then renamed into place: a damaged copy on the mount is removed before the fetch, and a fetch that
fails or brings damaged bytes leaves nothing under the shard's name. Before the mount changes, the
training-set manifest a previous warm left there is withdrawn; the excluded rows (checked against the
manifest's sha256) and the manifest are written last, so a trainer that finds the manifest finds every
shard whole.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training_code.lib import training_set as ts
from training_code.lib.shard_format import ShardIntegrityError, verify_shard, verify_shard_file
from training_code.lib.storage import fetch_file, join, read_bytes, write_bytes_atomic
from training_code.lib.verified_read import read_verified


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
    that finds the manifest finds every listed shard whole. Raises `ShardIntegrityError` naming the
    lake's shard when its bytes do not match the manifest (nothing of it is left on the mount)."""
    manifest_bytes = read_bytes(join(training_set_uri, ts.MANIFEST))
    manifest = json.loads(manifest_bytes)
    excluded = read_verified(join(training_set_uri, ts.EXCLUDED))
    target = mount / key
    shards = rows = total = copied = already_warm = 0
    for source in manifest["sources"]:
        folder = target / source["folder"]
        folder.mkdir(parents=True, exist_ok=True)
        for entry in source["shards"]:
            try:
                verify_shard(folder, entry)
                already_warm += 1
            except ShardIntegrityError:  # missing or damaged on the mount: nothing may vouch for it, then copy it
                (target / ts.MANIFEST).unlink(missing_ok=True)
                (folder / entry["file"]).unlink(missing_ok=True)
                fetch_verified(source, entry, folder)
                copied += 1
            shards += 1
            rows += entry["rows"]
            total += entry["bytes"]
    write_bytes_atomic(target / ts.EXCLUDED, excluded)
    write_bytes_atomic(target / ts.MANIFEST, manifest_bytes)
    return WarmResult(target, shards, rows, total + len(excluded) + len(manifest_bytes), copied, already_warm)


def fetch_verified(source: dict[str, Any], entry: dict[str, Any], folder: Path) -> None:
    """Fetch one shard of `source` to a temporary name in `folder`, verify it against its manifest
    entry, then rename it into place; on any failure the temporary copy is removed."""
    uri = join(source["shards_uri"], entry["file"])
    fetched = folder / f".{entry['file']}.{secrets.token_hex(8)}.tmp"
    try:
        fetch_file(uri, fetched)
        verify_shard_file(fetched, entry)
        fetched.replace(folder / entry["file"])
    except ShardIntegrityError as error:
        raise ShardIntegrityError(
            f"{uri}, shard {entry['file']} of source {source['source']} in the lake, does not match its manifest "
            f"({error}); nothing of it was left on the mount under {folder}. The shard set is damaged where it was "
            f"built: delete {source['shards_uri']} and rematerialize arrow_shards for {source['source']} (a miss "
            "that rebuilds it), then training_set and fsx_warm_state"
        ) from error
    finally:
        fetched.unlink(missing_ok=True)
