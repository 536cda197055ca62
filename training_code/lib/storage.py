"""One storage layer for local paths and `s3://` URIs: list, read, atomic write, publish a folder (manifests
last). The S3 half is `s3_storage`, the key rules `object_keys`; callers use them through here."""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

from . import s3_storage
from .object_keys import ObjectInfo, key_problem, local_etag, printable_key, safe_relative_key  # noqa: F401
from .s3_storage import ObjectChanged, read_bytes_if_match, s3_call, s3_client, split_s3  # noqa: F401

MANIFEST_NAMES = ("manifest.json",)


def is_s3(uri: str | os.PathLike) -> bool:
    return str(uri).startswith("s3://")


def join(root: str | os.PathLike, relative: str) -> str:
    """Join a checked relative key onto a root URI or path."""
    relative = safe_relative_key(relative)
    return f"{str(root).rstrip('/')}/{relative}" if is_s3(root) else str(Path(root) / relative)


def list_objects(root: str | os.PathLike, include_unsafe: bool = False) -> Iterator[ObjectInfo]:
    """Every object under `root` sorted by key, unsafe keys left out unless `include_unsafe`."""
    if is_s3(root):
        objects = s3_storage.list_objects(str(root))
    else:
        if not Path(root).is_dir():
            raise FileNotFoundError(f"raw root {root} does not exist or is not a folder")
        objects = walk_local(Path(root))
    for obj in objects:
        if include_unsafe or key_problem(obj.key) is None:
            yield obj


def walk_local(root: Path, under: str = "") -> Iterator[ObjectInfo]:
    """Every file under `root` (or its folder `under`) in key order, holding one folder's entries at a time."""
    real_root = os.path.realpath(root)
    stack = [iter(_sorted_entries(os.path.join(root, under), f"{under}/" if under else ""))]
    while stack:
        item = next(stack[-1], None)
        if item is None:
            stack.pop()
        elif item[0].is_dir(follow_symlinks=False):
            stack.append(iter(_sorted_entries(item[0].path, f"{item[1]}/")))
        elif (found := _local_object_info(*item, real_root)) is not None:
            yield found


def _sorted_entries(folder: str, prefix: str) -> list[tuple[os.DirEntry, str]]:
    """A folder's (entry, key), in the order of full keys (a folder sorts as its name and a '/')."""
    with os.scandir(folder) as entries:
        listed = [(entry, prefix + entry.name) for entry in entries]
    return sorted(listed, key=lambda item: item[1] + "/" if item[0].is_dir(follow_symlinks=False) else item[1])


def _local_object_info(entry: os.DirEntry, key: str, real_root: str) -> ObjectInfo | None:
    """A local entry as a listed object; None for FIFOs, sockets, devices and links out of the root."""
    if entry.is_symlink():
        stat = _symlinked_file_stat(entry.path, real_root)
    elif entry.is_file(follow_symlinks=False):
        stat = entry.stat(follow_symlinks=False)
    else:
        return None
    return None if stat is None else ObjectInfo(key, stat.st_size, local_etag(stat))


def _symlinked_file_stat(path: str, real_root: str) -> os.stat_result | None:
    """A link into the root: its target's stat; out of it or dangling: its own; to a folder: None."""
    target = os.path.realpath(path)
    if os.path.commonpath([target, real_root]) != real_root:
        return os.lstat(path)
    if os.path.isdir(target):
        return None
    return os.stat(target) if os.path.isfile(target) else os.lstat(path)


def read_bytes(uri: str | os.PathLike) -> bytes:
    if is_s3(uri):
        return s3_storage.read_bytes(str(uri))
    return Path(uri).read_bytes()


def version(uri: str | os.PathLike) -> str:
    """What changes when the file at `uri` does: its S3 ETag, or a local file's `<mtime_ns>-<size>`."""
    if is_s3(uri):
        return s3_storage.etag(str(uri))
    return local_etag(os.stat(uri))


def exists(uri: str | os.PathLike) -> bool:
    """Whether there is a file (or, locally, a folder) at exactly `uri`; on S3 a HEAD of that key."""
    if is_s3(uri):
        return s3_storage.exists(str(uri))
    return Path(uri).exists()


def delete_prefix(uri: str | os.PathLike) -> None:
    """Remove a folder (never following links) or every object under `prefix/` (S3)."""
    if is_s3(uri):
        s3_storage.delete_prefix(str(uri))
        return
    path = Path(uri)
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)  # unlinks symlinks inside; never follows them


def newest_write(uri: str | os.PathLike) -> float | None:
    """Time (epoch seconds) of the latest write under a folder or prefix, None when it holds nothing."""
    if is_s3(uri):
        return s3_storage.newest_write(str(uri))
    root = Path(uri)
    if not root.exists() and not root.is_symlink():
        return None
    times = [root.lstat().st_mtime]
    for folder, dirs, files in os.walk(root):  # does not descend into symlinked folders
        times += [os.lstat(os.path.join(folder, name)).st_mtime for name in dirs + files]
    return max(times)


def delete_file(uri: str | os.PathLike) -> None:
    """Remove one file or object if it is there (S3: a retried DELETE, which is idempotent)."""
    if is_s3(uri):
        s3_storage.delete_file(str(uri))
        return
    Path(uri).unlink(missing_ok=True)


def write_bytes_atomic(uri: str | os.PathLike, data: bytes) -> None:
    if is_s3(uri):
        s3_storage.write_bytes(str(uri), data)
        return
    path = Path(uri)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Not mkstemp (always 0600): O_EXCL with 0666 lets the umask and default ACLs apply as for any file.
    tmp = path.parent / f".{path.name}.{secrets.token_hex(8)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def copy_file_atomic(src: Path, dest: str | os.PathLike) -> None:
    if is_s3(dest):
        s3_storage.upload_file(src, str(dest))
    else:
        write_atomically(Path(dest), lambda tmp: shutil.copyfile(src, tmp))


def write_atomically(dest: Path, write: Callable[[Path], object]) -> None:
    """`write` a temporary file beside `dest`, then rename it into place (removed on failure)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def publish_folder(src: Path, dest: str | os.PathLike) -> list[str]:
    """Copy every file of `src` to `dest`, manifests last; returns the relative keys written."""
    files = sorted(p for p in Path(src).rglob("*") if p.is_file())
    files.sort(key=lambda p: p.name in MANIFEST_NAMES)  # stable: manifests move to the end
    written = []
    for path in files:
        relative = path.relative_to(src).as_posix()
        copy_file_atomic(path, join(dest, relative))
        written.append(relative)
    return written


def download_prefix(uri: str, dest: Path, keys: list[str] | None = None) -> Path:
    """Copy an S3 prefix (or only `keys`) into a local folder; unsafe keys are not listed."""
    bucket, prefix = split_s3(uri)
    for key in [obj.key for obj in list_objects(uri)] if keys is None else keys:
        target = dest / safe_relative_key(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        fetch_file(f"s3://{bucket}/{prefix}/{key}" if prefix else f"s3://{bucket}/{key}", target)
    return dest


def fetch_file(uri: str, dest: Path) -> None:
    """Copy one object (local path or s3:// URI) to a local file atomically."""
    if not is_s3(uri):
        copy_file_atomic(Path(uri), dest)
    else:
        write_atomically(dest, lambda tmp: s3_storage.download_file(uri, tmp))
