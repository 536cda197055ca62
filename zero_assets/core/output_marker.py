"""The output marker, `_output.json`: the proof that an output is complete, written last.

Derived from the job's `manifest.json`: every named file with its size, and the sha256 of tables and of
files up to `SMALL_FILE_BYTES`; files kept in other folders (`../<folder>/...`) are vouched for by size.
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from typing import Any

from training_code.lib.hashing import sha256_bytes, sha256_file
from training_code.lib.output_manifest import MANIFEST, named_files, outside_files
from training_code.lib.relative_paths import resolve, split_relative
from training_code.lib.storage import delete_file, is_s3, join, list_objects, read_bytes, write_bytes_atomic

OUTPUT_MARKER = "_output.json"  # written last, after the job's own manifest
MARKER_FORMAT = "zero-output/2"
SMALL_FILE_BYTES = 16 << 20  # other files up to this size are hashed when marked and when checked
# Hashed at any size: their readers read them whole anyway. Shards are left to their readers' checks.
TABLE_SUFFIXES = (".parquet", ".json")


class OutputNotComplete(ValueError):
    """An output cannot be marked complete: no readable manifest, nothing in it, or files that disagree with it."""


def is_temporary(key: str) -> bool:
    """Whether `key` is an atomic writer's temporary name or a hidden file: never an output."""
    return any(part.startswith(".") for part in PurePosixPath(key).parts) or key.endswith((".tmp", ".partial"))


def mark_output_complete(
    uri: str,
    fingerprint: str,
    data_version: str | None = None,
    row_count: int | None = None,
    size_bytes: int | None = None,
) -> dict[str, Any]:
    """Prove the output at `uri` complete from its manifest and write the marker; returns the marker.

    Raises `OutputNotComplete` (naming `uri`) when the manifest is missing or unreadable, nothing else is
    there, or a named file is missing or differs. An earlier marker over the same files keeps its
    fingerprints, so materializations sharing one output do not unmark each other."""
    try:
        present = {o.key: o.size for o in list_objects(uri) if o.key != OUTPUT_MARKER and not is_temporary(o.key)}
    except FileNotFoundError:
        present = {}
    if MANIFEST not in present:
        raise OutputNotComplete(
            f"output {uri} has no {MANIFEST}: the job did not finish writing it, so it cannot be marked complete"
        )
    try:
        manifest_bytes = read_bytes(join(uri, MANIFEST))
        named = named_files(json.loads(manifest_bytes), f"{uri}/{MANIFEST}")
    except ValueError as error:
        raise OutputNotComplete(f"output {uri}: its {MANIFEST} is unreadable ({error}); rebuild it") from error
    if len(present) < 2 and not named:
        raise OutputNotComplete(
            f"output {uri} holds only its {MANIFEST}, which names no files: an empty output is never complete"
        )
    files = _outside_facts(uri, json.loads(manifest_bytes))
    for name in sorted(set(present) | set(named)):
        size, expected = present.get(name), named.get(name, {})
        if size is None:
            raise OutputNotComplete(f"output {uri}: {name} is named by {MANIFEST} but missing")
        if "bytes" in expected and expected["bytes"] != size:
            raise OutputNotComplete(f"output {uri}: {name} has {size} bytes, {MANIFEST} says {expected['bytes']}")
        facts: dict[str, Any] = {"bytes": size}
        if is_hashed(name, size):
            facts["sha256"] = digest = sha256_bytes(manifest_bytes) if name == MANIFEST else _sha256_of(join(uri, name))
            if expected.get("sha256", digest) != digest:
                raise OutputNotComplete(
                    f"output {uri}: {name} has sha256 {digest}, {MANIFEST} says {expected['sha256']}"
                )
        files[name] = facts
    versions = {fingerprint: data_version}
    earlier = _read_marker(uri)
    if earlier is not None and earlier.get("files") == files:
        versions = {**earlier.get("data_versions", {}), **versions}
    marker = {
        "format": MARKER_FORMAT,
        "fingerprint": fingerprint,
        "data_versions": versions,
        "manifest": MANIFEST,
        "files": files,
        **({"row_count": row_count} if row_count is not None else {}),
        **({"size_bytes": size_bytes} if size_bytes is not None else {}),
    }
    write_bytes_atomic(join(uri, OUTPUT_MARKER), json.dumps(marker, indent=1, sort_keys=True).encode())
    return marker


def is_hashed(name: str, size: int) -> bool:
    """Whether the marker records, and a hit checks, a file's sha256."""
    return name.endswith(TABLE_SUFFIXES) or size <= SMALL_FILE_BYTES


def retract_output_marker(uri: str) -> None:
    """Withdraw an output's marker before it is rebuilt, so nothing vouches for a half-replaced set."""
    if output_is_checkable(uri):
        delete_file(join(uri, OUTPUT_MARKER))


def output_is_checkable(uri: str) -> bool:
    """Local paths and s3:// are; fsx:// locations are not visible from the Dagster process."""
    return "://" not in uri or is_s3(uri)


def output_is_complete(uri: str, fingerprint: str) -> bool:
    """Whether the marker at `uri` vouches for `fingerprint` and the output still matches it. Reads no shard."""
    return complete_marker(uri, fingerprint) is not None


def complete_marker(uri: str, fingerprint: str) -> dict[str, Any] | None:
    """The marker at `uri` when it vouches for `fingerprint` and the output still matches it, else None."""
    if not output_is_checkable(uri):
        return None  # rebuild rather than trust what cannot be checked
    marker = _read_marker(uri)
    if marker is None or marker.get("format") != MARKER_FORMAT or fingerprint not in marker.get("data_versions", {}):
        return None
    files = marker.get("files")
    if not isinstance(files, dict) or MANIFEST not in files:
        return None
    present = {o.key: o.size for o in list_objects(uri)}
    outside = _outside_sizes(uri, [name for name in files if split_relative(name)[0]])
    for name, facts in files.items():
        if name in outside or split_relative(name)[0]:  # kept in another folder: vouched for by size
            if outside.get(name) != facts.get("bytes"):
                return None
            continue
        size = present.get(name)
        if size is None or size != facts.get("bytes"):
            return None
        if is_hashed(name, size) and "sha256" not in facts:
            return None  # a marker from before tables were hashed at any size: it vouches for too little
        if "sha256" in facts and _sha256_of(join(uri, name)) != facts["sha256"]:
            return None
    return marker


def _outside_facts(uri: str, manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """`{name: {"bytes": size}}` of the files named outside `uri`; `OutputNotComplete` if one is off."""
    named = outside_files(manifest, f"{uri}/{MANIFEST}")
    try:
        sizes = _outside_sizes(uri, list(named))
    except ValueError as error:
        raise OutputNotComplete(f"output {uri}: {error}") from error
    for name, expected in named.items():
        if sizes.get(name) is None:
            raise OutputNotComplete(f"output {uri}: {name} is named by {MANIFEST} but missing ({resolve(uri, name)})")
        if "bytes" in expected and sizes[name] != expected["bytes"]:
            raise OutputNotComplete(
                f"output {uri}: {name} has {sizes[name]} bytes, {MANIFEST} says {expected['bytes']}"
            )
    return {name: {"bytes": sizes[name]} for name in named}


def _outside_sizes(uri: str, names: list[str]) -> dict[str, int]:
    """Path relative to `uri` -> its size, for files in other folders: one listing per folder."""
    folders: dict[str, dict[str, str]] = {}  # folder uri -> {file name in it: the relative path}
    for name in names:
        folder, _, file_name = resolve(uri, name).rpartition("/")
        folders.setdefault(folder, {})[file_name] = name
    sizes = {}
    for folder, wanted in folders.items():
        try:
            listed = {o.key: o.size for o in list_objects(folder)}
        except FileNotFoundError:
            continue
        sizes |= {name: listed[file_name] for file_name, name in wanted.items() if file_name in listed}
    return sizes


def _sha256_of(uri: str) -> str:
    """A local file hashed as it is read (a large table is never held whole), an S3 object read whole."""
    return sha256_bytes(read_bytes(uri)) if is_s3(uri) else sha256_file(Path(uri))


def _read_marker(uri: str) -> dict[str, Any] | None:
    try:
        marker = json.loads(read_bytes(join(uri, OUTPUT_MARKER)))
    except (FileNotFoundError, ValueError):  # storage reports S3's "no such key" as FileNotFoundError
        return None
    return marker if isinstance(marker, dict) else None
