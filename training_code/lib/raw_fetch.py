"""Fetch raw objects by key, exactly the ones a job reads: parallel GETs, each with IfMatch on the listed ETag,
so an object replaced or deleted since the index (even mid-fetch) is `RawRootChanged`. Objects land at
`<dest>/<key>`, renamed once complete; an unsafe key is never fetched."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from . import job_env
from .raw_files import RawRootChanged
from .s3_storage import is_missing, precondition_failed, s3_call, s3_client, split_s3
from .storage import is_s3, key_problem

log = logging.getLogger("zero.fetch")

PART_BYTES = 16 << 20  # above this an object is fetched as ranged GETs in parallel
FETCH_THREADS = 32  # concurrent GETs: the S3 client's connection pool (aws_clients.S3_POOL)
PARTIAL = ".fetching"  # suffix of an object still being fetched


@dataclass(frozen=True)
class Fetched:
    """What one fetch read: objects and bytes, and how long it took."""

    objects: int
    bytes: int
    seconds: float


@dataclass(frozen=True)
class _Range:
    key: str
    etag: str
    path: Path  # the partial file, created at its full size before any range is written
    start: int
    end: int  # exclusive
    ranged: bool  # one of several ranges of a large object (else the whole object in one GET)


def fetch_objects(
    raw_uri: str, rows: Iterable[tuple[str, int, str]], dest: Path, workers: int = FETCH_THREADS
) -> tuple[dict[str, Path], Fetched]:
    """Fetch (key, size, etag) `rows` from the S3 raw root to `<dest>/<key>`: key -> local path, and what was read."""
    started = time.monotonic()
    bucket, prefix = split_s3(raw_uri)
    ranges, paths = [], {}
    for key, size, etag in rows:
        if problem := key_problem(key):
            raise ValueError(f"{key!r} is not a key to fetch: it has {problem}")
        path = Path(dest) / key
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + PARTIAL)
        with open(partial, "wb") as handle:
            handle.truncate(int(size))
        paths[key] = (partial, path)
        starts = range(0, max(int(size), 1), PART_BYTES)
        ranged = int(size) > PART_BYTES
        ranges += [_Range(key, etag, partial, start, min(start + PART_BYTES, int(size)), ranged) for start in starts]

    def fetch(part: _Range) -> int:
        data = _get_range(bucket, f"{prefix}/{part.key}" if prefix else part.key, part)
        with open(part.path, "r+b") as handle:
            handle.seek(part.start)
            handle.write(data)
        return len(data)

    with ThreadPoolExecutor(max(1, min(workers, len(ranges) or 1))) as pool:  # reads release the GIL
        total = sum(pool.map(fetch, ranges))
    for partial, path in paths.values():
        os.replace(partial, path)
    fetched = Fetched(len(paths), total, round(time.monotonic() - started, 3))
    if paths:
        log.info("fetched %d objects, %d bytes, in %.1f s with IfMatch on their listed ETags", *vars(fetched).values())
    return {key: path for key, (_, path) in paths.items()}, fetched


def _get_range(bucket: str, key: str, part: _Range) -> bytes:
    """The bytes [start, end) of the object while its ETag is the listed one (a cut body is retried)."""
    from botocore.exceptions import ClientError

    condition = {"IfMatch": f'"{part.etag}"'}
    if part.ranged:
        condition["Range"] = f"bytes={part.start}-{part.end - 1}"

    def get() -> bytes:
        try:
            response = s3_client().get_object(Bucket=bucket, Key=key, **condition)
        except ClientError as error:
            if is_missing(error):
                raise RawRootChanged(part.key, "listed by the index, but gone") from None
            if precondition_failed(error):
                raise RawRootChanged(part.key, f"its ETag is no longer {part.etag}: replaced since the index") from None
            raise
        if response["ETag"].strip('"') != part.etag:  # a server that ignored the condition
            raise RawRootChanged(
                part.key, f"its ETag is {response['ETag'].strip(chr(34))}, the index listed {part.etag}"
            )
        data = response["Body"].read()
        if len(data) != part.end - part.start:
            raise RawRootChanged(
                part.key, f"{len(data)} bytes where the listed size gives {part.end - part.start} (at {part.start})"
            )
        return data

    return s3_call(get, f"GET s3://{bucket}/{key} (IfMatch {part.etag}, bytes {part.start}-{part.end})")


def scratch_folder() -> Path:
    """Where a job fetches to: SageMaker's ML storage volume (`/opt/ml/processing`), else a temporary folder."""
    volume = job_env.opt_ml() / "processing"
    base = volume if volume.is_dir() and os.access(volume, os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix="zero-fetched-", dir=base))


@contextmanager
def readable_root(raw_uri: str, rows: list[tuple[str, int, str]]) -> Iterator[tuple[Path, Fetched | None]]:
    """A local folder holding `rows` at their keys: a local raw root as is, or a scratch folder fetched from S3."""
    if not is_s3(raw_uri):
        yield Path(raw_uri), None
        return
    scratch = scratch_folder()
    try:
        _, fetched = fetch_objects(raw_uri, rows, scratch)
        yield scratch, fetched
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
