"""Read a file its folder's `manifest.json` vouches for, checked against the size and sha256 it records;
a file it does not name, or a folder without one, is read as is; an unreadable manifest is an error."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .hashing import sha256_bytes, sha256_file
from .output_manifest import MANIFEST, named_files
from .storage import fetch_file, is_s3, join, read_bytes


class FileIntegrityError(RuntimeError):
    """A file differs from what its folder's manifest says of it."""


def read_verified(uri: str | os.PathLike) -> bytes:
    """The bytes at `uri`, verified against its folder's manifest when it names them."""
    folder, name = split_folder(uri)
    expected = manifest_entry(folder, name)
    data = read_bytes(uri)
    if expected is not None:
        _verify(uri, folder, expected, len(data), lambda: sha256_bytes(data))
    return data


def local_verified_copy(uri: str | os.PathLike, dest: Path) -> Path:
    """A local verified file of `uri` (hashed as a stream): `uri` itself, or fetched to `dest`."""
    folder, name = split_folder(uri)
    expected = manifest_entry(folder, name)
    path = dest if is_s3(uri) else Path(uri)
    if is_s3(uri):
        fetch_file(str(uri), dest)
    if expected is not None:
        _verify(uri, folder, expected, path.stat().st_size, lambda: sha256_file(path))
    return path


def _verify(
    uri: str | os.PathLike, folder: str, expected: dict[str, Any], size: int, digest: Callable[[], str]
) -> None:
    manifest_uri = join(folder, MANIFEST)
    advice = f"the file changed after the job that wrote {folder} finished; rematerialize the asset that wrote it"
    if "bytes" in expected and size != expected["bytes"]:
        raise FileIntegrityError(f"{uri}: {size} bytes, {manifest_uri} says {expected['bytes']}: {advice}")
    if "sha256" in expected and (found := digest()) != expected["sha256"]:
        raise FileIntegrityError(f"{uri}: sha256 {found}, {manifest_uri} says {expected['sha256']}: {advice}")


def manifest_entry(folder: str, name: str) -> dict[str, Any] | None:
    """What `folder/manifest.json` says of `name`, or None without a manifest or an entry."""
    manifest_uri = join(folder, MANIFEST)
    try:
        manifest_bytes = read_bytes(manifest_uri)
    except FileNotFoundError:  # storage reports S3's "no such key" as FileNotFoundError
        return None
    try:
        manifest = json.loads(manifest_bytes)
    except ValueError as error:
        raise FileIntegrityError(f"{manifest_uri} is not readable JSON ({error}); rematerialize its asset") from error
    return named_files(manifest, manifest_uri).get(name)


def split_folder(uri: str | os.PathLike) -> tuple[str, str]:
    """(folder, file name) of a local path or s3:// URI."""
    if is_s3(uri):
        folder, _, name = str(uri).rstrip("/").rpartition("/")
        return folder, name
    path = Path(uri)
    return str(path.parent), path.name
