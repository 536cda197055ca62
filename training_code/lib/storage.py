"""One storage layer for local paths and `s3://` URIs: list, read, atomic write, publish a folder.

Every write is atomic: a temporary name then a rename locally, a single PUT (or completed multipart
upload) on S3. `publish_folder` copies a finished job output to its destination with the manifest
last, so a reader that trusts the manifest never sees a half-written set.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

MANIFEST_NAMES = ("manifest.json",)
LISTING_THREADS = 16  # concurrent LIST requests; S3 serves thousands per second per prefix
# What a key may not hold: control characters, backslashes (a separator elsewhere, and the escape
# character of `printable_key`) and lone surrogates (the bytes of a name that is not valid UTF-8, as
# os.listdir hands them over).
_UNSAFE_CHARS = re.compile(r"[\x00-\x1f\x7f\\\ud800-\udfff]")


@dataclass(frozen=True)
class ObjectInfo:
    key: str  # relative to the listed root, "/"-separated
    size: int
    etag: str


def is_s3(uri: str | os.PathLike) -> bool:
    return str(uri).startswith("s3://")


def split_s3(uri: str) -> tuple[str, str]:
    bucket, _, prefix = str(uri)[len("s3://") :].partition("/")
    if not bucket:
        raise ValueError(f"{uri!r} is not an s3://bucket/prefix URI")
    return bucket, prefix.strip("/")


def join(root: str | os.PathLike, relative: str) -> str:
    """Join a checked relative key onto a root URI or path."""
    relative = safe_relative_key(relative)
    return f"{str(root).rstrip('/')}/{relative}" if is_s3(root) else str(Path(root) / relative)


def safe_relative_key(key: str) -> str:
    """`key` itself when it is safe to join onto a root (see `key_problem`), else a ValueError saying why."""
    problem = key_problem(key)
    if problem:
        raise ValueError(f"unsafe object key {printable_key(key)!r}: {problem}")
    return key


def key_problem(key: str) -> str | None:
    """Why `key` cannot name a file under a root, or None when it can.

    A safe key is already in its one canonical form: no `..`, `.` or empty segment, not absolute.
    Keys are never normalised, because on S3 `a/./b`, `a//b` and `a/b` are three different objects:
    normalising would read one's bytes for another. A key that only names a file after
    normalising is refused instead."""
    if not key:
        return "empty"
    if _UNSAFE_CHARS.search(key):
        return "control characters, backslashes or bytes that are not UTF-8"
    if key.startswith("/"):
        return "absolute"
    segments = key.split("/")
    if ".." in segments:
        return "a '..' segment"
    if "." in segments or "" in segments:
        return "a '.' or empty segment (it names another object's file once normalised)"
    return None


def printable_key(key: str) -> str:
    """`key` with backslashes, control characters and undecodable bytes written as escapes (`\\`,
    `\\x0a`, `\\xff`): one line of valid UTF-8 that a table can store, and distinct for distinct keys.
    Safe keys come back unchanged; an escaped one holds a backslash, so it is never a safe key."""
    if not _UNSAFE_CHARS.search(key):
        return key
    out = []
    for char in key:
        code = ord(char)
        if char == "\\":
            out.append("\\\\")
        elif 0xDC80 <= code <= 0xDCFF:  # os.fsdecode's stand-in for the byte code - 0xDC00
            out.append(f"\\x{code - 0xDC00:02x}")
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif 0xD800 <= code <= 0xDFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(char)
    return "".join(out)


def s3_client():
    """The process's shared S3 client (honours ZERO_S3_ENDPOINT_URL), with the policy of `aws_clients`."""
    from .aws_clients import client

    return client("s3", endpoint_url=os.environ.get("ZERO_S3_ENDPOINT_URL") or None)


def s3_call(call, what: str):
    """An idempotent S3 call, retried through throttling, cut bodies and outages up to the retry window;
    past it, an error that names the endpoint and `what` (the operation and the s3:// URI)."""
    from .aws_clients import endpoint_of, retry_call

    return retry_call(call, what=what, endpoint=endpoint_of(s3_client()))


def _get_object_bytes(bucket: str, key: str) -> bytes:
    """The whole object: the GET and the body read are retried together, a cut body starts over.
    A missing object is a FileNotFoundError, as for a local path."""
    from botocore.exceptions import ClientError

    def get() -> bytes:
        try:
            return s3_client().get_object(Bucket=bucket, Key=key)["Body"].read()
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                raise FileNotFoundError(f"s3://{bucket}/{key} does not exist") from error
            raise

    return s3_call(get, f"GET s3://{bucket}/{key}")


def list_objects(root: str | os.PathLike, include_unsafe: bool = False) -> Iterator[ObjectInfo]:
    """Every object under `root`, sorted by key. Local etag is `<mtime_ns>-<size>`.

    Keys that `key_problem` refuses are left out unless `include_unsafe` (change detection keeps them,
    as the raw index does, so each one is reported). S3 folder markers (a key ending in `/`, zero bytes) are never objects.
    Locally, symlinked folders are not descended into, and a symlinked file is listed by its own
    lstat when its target lies outside `root` (so nothing out there is opened; validation refuses it)."""
    if is_s3(root):
        objects = list_s3_parallel(str(root))
    else:
        objects = sorted(_list_local(Path(root)), key=lambda o: o.key)
    for obj in objects:
        if include_unsafe or key_problem(obj.key) is None:
            yield obj


def _list_local(root: Path) -> Iterator[ObjectInfo]:
    if not root.is_dir():
        raise FileNotFoundError(f"raw root {root} does not exist or is not a folder")
    real_root = os.path.realpath(root)
    folders = [root]
    while folders:
        with os.scandir(folders.pop()) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    folders.append(Path(entry.path))
                    continue
                found = local_object_info(entry, Path(entry.path).relative_to(root).as_posix(), real_root)
                if found is not None:
                    yield found


def local_object_info(entry: os.DirEntry, key: str, real_root: str) -> ObjectInfo | None:
    """A non-folder entry of a local raw root as a listed object (etag: mtime-size), or None for what is
    not a file anyone uploaded (FIFOs, sockets, devices) and for symlinks that leave the root."""
    if entry.is_symlink():
        stat = _symlinked_file_stat(entry.path, real_root)
    elif entry.is_file(follow_symlinks=False):
        stat = entry.stat(follow_symlinks=False)
    else:
        return None
    return None if stat is None else ObjectInfo(key, stat.st_size, f"{stat.st_mtime_ns}-{stat.st_size}")


def _symlinked_file_stat(path: str, real_root: str) -> os.stat_result | None:
    """A link to a file inside the root: its target's stat (so an edit shows). A link out of the root,
    or a dangling one: the link's own lstat, target untouched. A link to a folder: None (not followed)."""
    target = os.path.realpath(path)
    if os.path.commonpath([target, real_root]) != real_root:
        return os.lstat(path)
    if os.path.isdir(target):
        return None
    return os.stat(target) if os.path.isfile(target) else os.lstat(path)


def list_s3_parallel(root: str, workers: int = LISTING_THREADS) -> list[ObjectInfo]:
    """List an S3 prefix one folder level down in parallel: the folders under it (with Delimiter="/"),
    then each folder's keys in a thread pool. One paginated listing returns 1,000 keys per round trip;
    a raw root of many sources lists in about the time of its largest source."""
    bucket, prefix = split_s3(root)
    base = f"{prefix}/" if prefix else ""
    paginator = s3_client().get_paginator("list_objects_v2")

    def listed_once(page_prefix: str, delimiter: str) -> tuple[list[ObjectInfo], list[str]]:
        objects, folders = [], []
        for page in paginator.paginate(Bucket=bucket, Prefix=page_prefix, Delimiter=delimiter):
            objects += [
                ObjectInfo(o["Key"][len(base) :], int(o["Size"]), o["ETag"].strip('"'))
                for o in page.get("Contents", [])
                if not (o["Key"].endswith("/") and int(o["Size"]) == 0)  # a folder marker ("raw/"), not an object
            ]
            folders += [p["Prefix"] for p in page.get("CommonPrefixes", [])]
        return objects, folders

    def listed(page_prefix: str, delimiter: str = "") -> tuple[list[ObjectInfo], list[str]]:
        # A failed page starts this folder's listing over: pages are not resumable after an error.
        return s3_call(lambda: listed_once(page_prefix, delimiter), f"LIST s3://{bucket}/{page_prefix}")

    objects, folders = listed(base, delimiter="/")
    with ThreadPoolExecutor(workers) as pool:
        for folder_objects, _ in pool.map(listed, folders):
            objects += folder_objects
    return sorted(objects, key=lambda o: o.key)


def read_bytes(uri: str | os.PathLike) -> bytes:
    if is_s3(uri):
        bucket, key = split_s3(str(uri))
        return _get_object_bytes(bucket, key)
    return Path(uri).read_bytes()


def exists(uri: str | os.PathLike) -> bool:
    if is_s3(uri):
        bucket, key = split_s3(str(uri))
        response = s3_call(
            lambda: s3_client().list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=1), f"LIST s3://{bucket}/{key}"
        )
        return response.get("KeyCount", 0) > 0
    return Path(uri).exists()


def delete_prefix(uri: str | os.PathLike) -> None:
    """Remove a folder (local) or every object under `prefix/` (S3); a sibling `prefix-x/` is untouched.

    Local symlinks are removed, never followed. Refuses a bucket root."""
    if is_s3(uri):
        bucket, prefix = split_s3(str(uri))
        if not prefix:
            raise ValueError(f"refusing to delete the whole bucket {uri!r}; name a prefix inside it")
        # Every key under `prefix/`, folder markers and keys `list_objects` refuses included.
        keys = [o["Key"] for o in _s3_objects_under(bucket, prefix)]
        for start in range(0, len(keys), 1000):  # DeleteObjects takes at most 1,000 keys
            batch = [{"Key": key} for key in keys[start : start + 1000]]
            errors = s3_call(
                lambda batch=batch: s3_client().delete_objects(Bucket=bucket, Delete={"Objects": batch, "Quiet": True}),
                f"DELETE {len(batch)} objects under s3://{bucket}/{prefix}/",
            ).get("Errors", [])
            if errors:
                raise OSError(
                    f"could not delete {len(errors)} objects under {uri}, first {errors[0].get('Key')}: {errors[0].get('Message')}"
                )
        return
    path = Path(uri)
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)  # unlinks symlinks inside; never follows them


def newest_write(uri: str | os.PathLike) -> float | None:
    """Time (epoch seconds) of the latest write under a folder or prefix, None when it holds nothing."""
    if is_s3(uri):
        bucket, prefix = split_s3(str(uri))
        return max((o["LastModified"].timestamp() for o in _s3_objects_under(bucket, prefix)), default=None)
    root = Path(uri)
    if not root.exists() and not root.is_symlink():
        return None
    times = [root.lstat().st_mtime]
    for folder, dirs, files in os.walk(root):  # does not descend into symlinked folders
        times += [os.lstat(os.path.join(folder, name)).st_mtime for name in dirs + files]
    return max(times)


def _s3_objects_under(bucket: str, prefix: str) -> list[dict]:
    """The raw ListObjectsV2 entries under `prefix/` (the whole bucket for an empty prefix)."""

    def listed() -> list[dict]:
        pages = (
            s3_client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/" if prefix else "")
        )
        return [o for page in pages for o in page.get("Contents", [])]

    return s3_call(listed, f"LIST s3://{bucket}/{prefix}/")


def delete_file(uri: str | os.PathLike) -> None:
    """Remove one file or object if it is there (S3: a retried DELETE, which is idempotent)."""
    if is_s3(uri):
        bucket, key = split_s3(str(uri))
        s3_call(lambda: s3_client().delete_object(Bucket=bucket, Key=key), f"DELETE s3://{bucket}/{key}")
        return
    Path(uri).unlink(missing_ok=True)


def write_bytes_atomic(uri: str | os.PathLike, data: bytes) -> None:
    if is_s3(uri):
        bucket, key = split_s3(str(uri))
        # S3 PUTs are all-or-nothing, so a retried PUT is safe.
        s3_call(lambda: s3_client().put_object(Bucket=bucket, Key=key, Body=data), f"PUT s3://{bucket}/{key}")
        return
    path = Path(uri)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Not mkstemp: it creates 0600 whatever the umask. O_EXCL with mode 0666 lets the kernel apply the
    # umask (and default ACLs) as for any other file, and still never reuses another writer's name.
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
        bucket, key = split_s3(str(dest))
        # Multipart uploads complete atomically; a failed one is aborted and started over whole.
        s3_call(lambda: s3_client().upload_file(str(src), bucket, key), f"upload {src} to s3://{bucket}/{key}")
        return
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    try:
        shutil.copyfile(src, tmp)
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
    """Copy an S3 prefix into a local folder (SageMaker's File input mode); with `keys`, only those
    (relative to the prefix: one host's part of an input split by key). Unsafe keys are not listed,
    so no object lands outside `dest` or on another object's file."""
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
        return
    bucket, key = split_s3(uri)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    try:
        s3_call(lambda: s3_client().download_file(bucket, key, str(tmp)), f"download s3://{bucket}/{key}")
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
