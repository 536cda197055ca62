"""The files a job's `manifest.json` vouches for, whatever job wrote it: `files` as name -> sha256 or
name -> {"bytes", "sha256"}, and `shards` entries (those outside the folder: `outside_files`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .hashing import sha256_file
from .relative_paths import split_relative
from .storage import safe_relative_key, write_bytes_atomic

MANIFEST = "manifest.json"
# Set by an output holding results that were not their input's fault ({"count", "why"}): never reused.
RETRY_NEXT_TIME = "retry_next_time"


def named_files(manifest: dict[str, Any], where: str) -> dict[str, dict[str, Any]]:
    """File name -> what the manifest says of it (`bytes`, `sha256`); a shape it cannot read is an error."""
    if not isinstance(manifest, dict):
        raise ValueError(f"{where}: the manifest is a {type(manifest).__name__}, not a JSON object")
    named: dict[str, dict[str, Any]] = {}
    files = manifest.get("files", {})
    if isinstance(files, list):
        files = {name: {} for name in files}
    if not isinstance(files, dict):
        raise ValueError(f"{where}: `files` must be an object or a list, not {type(files).__name__}")
    for name, facts in files.items():
        named[safe_relative_key(name)] = {"sha256": facts} if isinstance(facts, str) else dict(facts or {})
    for name, entry in _shard_entries(manifest, where):
        ups, key = split_relative(name)
        if not ups:  # a shard kept in another folder is named by `outside_files`
            named[key] = {k: entry[k] for k in ("bytes", "sha256") if k in entry}
    for name, facts in named.items():
        if not isinstance(facts.get("bytes", 0), int) or not isinstance(facts.get("sha256", ""), str):
            raise ValueError(
                f"{where}: entry {name!r} has a `bytes` that is not an integer or a `sha256` that is not a string"
            )
    return named


def outside_files(manifest: dict[str, Any], where: str) -> dict[str, dict[str, Any]]:
    """Files the manifest names outside its folder (`../<folder>/shards/<name>`) -> `bytes` and `sha256`."""
    return {
        name: {k: entry[k] for k in ("bytes", "sha256") if k in entry}
        for name, entry in _shard_entries(manifest, where)
        if split_relative(name)[0]
    }


def _shard_entries(manifest: dict[str, Any], where: str) -> list[tuple[str, dict[str, Any]]]:
    """(path, entry) of each `shards` entry: by `path` (zero-shards/3), or by `file` in the folder (earlier)."""
    shards = manifest.get("shards", []) if isinstance(manifest, dict) else []
    if not isinstance(shards, list) or not all(isinstance(e, dict) and ("path" in e or "file" in e) for e in shards):
        raise ValueError(f"{where}: `shards` must be a list of objects with a `path` (or `file`) field")
    return [(str(entry.get("path", entry.get("file"))), entry) for entry in shards]


def write_output_manifest(folder: Path, files: list[str], **fields: Any) -> bytes:
    """Write `folder/manifest.json` (last): each of `files` with size and sha256, plus `fields`."""
    folder = Path(folder)
    listed = {
        name: {"bytes": (folder / name).stat().st_size, "sha256": sha256_file(folder / name)} for name in sorted(files)
    }
    data = json.dumps({**fields, "files": listed}, indent=1, sort_keys=True).encode()
    write_bytes_atomic(folder / MANIFEST, data)
    return data
