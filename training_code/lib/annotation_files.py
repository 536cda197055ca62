"""Find and read each source's `annotations.json` under a raw root without leaving it.

The index records each file's size, etag and sha256 (`count_source_annotations`); the validation pass
must read those same bytes (`load_annotations`), else `RawRootChanged` fails the run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .coco import ANNOTATIONS_FILE, INDEX_FIELDS, AnnotationError, SourceAnnotations, parse_annotations
from .hashing import sha256_bytes
from .indexed_raw import IndexedFile, ListedRoot, proven_copy_bytes
from .raw_files import RawChanged, RawRootChanged, Refused, locate, read_limited, read_with_stat
from .s3_storage import is_missing
from .storage import is_s3, join, key_problem, local_etag, s3_call, s3_client, split_s3


def load_annotations(
    raw: Path, sources: set[str], max_bytes: int, listed: ListedRoot
) -> tuple[dict[str, SourceAnnotations | None], dict[str, str]]:
    """Each source's parsed COCO file (None without a usable one), and the error naming each file that exists but
    cannot be used. Sources with unsafe names are skipped. `raw`: the local raw root or the job's fetch of it."""
    parsed: dict[str, SourceAnnotations | None] = {}
    errors: dict[str, str] = {}
    for source in sorted(sources):
        key = f"{source}/{ANNOTATIONS_FILE}"
        parsed[source] = None
        if key_problem(key):
            continue
        try:
            data = read_checked_annotations(raw, source, max_bytes, listed)
            if data is None:
                continue
            parsed[source] = parse_annotations(source, data, key, max_bytes)
        except (AnnotationError, Refused, OSError) as error:
            errors[source] = annotation_error(key, error)
    return parsed, errors


def read_checked_annotations(raw: Path, source: str, max_bytes: int, listed: ListedRoot) -> bytes | None:
    """The bytes of `<raw>/<source>/annotations.json`, proven to be the file the index recorded (None: neither has
    one); else `RawRootChanged`, or Refused/OSError when it cannot be used, as the index found too."""
    key = f"{source}/{ANNOTATIONS_FILE}"
    indexed = listed.annotation_file(source)
    if not os.path.lexists(raw / key):
        if indexed is not None:
            raise RawRootChanged(key, "listed by the index, but gone")
        return None
    if indexed is None:
        raise RawRootChanged(key, "there now, but not when the index was built")
    try:
        data = read_limited(locate(raw, key), max_bytes, indexed.etag if listed.local else None)
    except RawChanged as changed:
        raise RawRootChanged(key, changed.detail) from None
    except (Refused, OSError) as error:
        # Past this job's own limit is no change; anything else the index did not meet is one.
        if indexed.sha256 is not None and not (isinstance(error, Refused) and error.reason == "too_large"):
            raise RawRootChanged(key, f"the index read it, now {annotation_error(key, error)}") from None
        raise
    if not listed.local:
        return proven_copy_bytes(listed, key, data, indexed)
    if indexed.sha256 is not None and sha256_bytes(data) != indexed.sha256:
        raise RawRootChanged(key, "its bytes are not those the index read (sha256 differs)")
    return data


def annotation_error(key: str, error: Exception) -> str:
    if isinstance(error, AnnotationError):
        return str(error)
    if isinstance(error, Refused):
        return f"{key}: {error.reason}: {error.detail}"
    return f"{key}: unreadable: {type(error).__name__}: {error.strerror or error}"


@dataclass
class AnnotationCounts:
    """What the raw index needs of one source's annotations.json."""

    per_file: dict[str, int]  # file_name -> annotations pointing at it: one entry per image entry of the file
    rejected_entries: int  # entries validation will reject (see coco.parse_annotations)
    error: str | None  # why the file cannot be used; None when it was used or there is none
    file: IndexedFile | None  # what was read (or refused); None when there is no file

    @property
    def identity(self) -> tuple[int, str] | None:
        """(size, etag): what the listing fingerprint takes of the file."""
        return None if self.file is None else (self.file.size, self.file.etag)


def count_source_annotations(raw_uri: str, source: str, max_bytes: int) -> AnnotationCounts:
    """Parse `<raw_uri>/<source>/annotations.json` once, keeping only what counting needs; a file past
    `max_bytes` is refused by its size, unread."""
    key = f"{source}/{ANNOTATIONS_FILE}"
    where = join(raw_uri, key)
    file, raw = (
        _read_s3_annotations(raw_uri, key, max_bytes)
        if is_s3(raw_uri)
        else _read_local_annotations(Path(raw_uri), key, max_bytes)
    )
    if file is None:
        return AnnotationCounts({}, 0, None, None)
    if isinstance(raw, Refused):
        return AnnotationCounts({}, 0, f"{where}: {raw.reason}: {raw.detail}", file)
    if raw is None:
        return AnnotationCounts(
            {},
            0,
            f"{where}: {file.size} bytes, above the annotation file limit of {max_bytes}; "
            "raise the limit or split the source",
            file,
        )
    try:
        parsed = parse_annotations(source, raw, where, max_bytes, keep=INDEX_FIELDS)
    except AnnotationError as error:
        return AnnotationCounts({}, 0, str(error), file)
    del raw
    return AnnotationCounts(
        {name: len(anns) for name, anns in parsed.by_file.items()}, len(parsed.rejected), None, file
    )


def _read_local_annotations(raw: Path, key: str, max_bytes: int) -> tuple[IndexedFile | None, bytes | Refused | None]:
    """(what was read, its bytes): bytes None past `max_bytes`, a Refused for a file out of the root or
    not regular; (None, None) for no file."""
    if not os.path.lexists(raw / key):
        return None, None
    try:
        located = locate(raw, key)
    except Refused as refused:
        info = os.lstat(raw / key)
        return IndexedFile(info.st_size, local_etag(info)), refused
    try:
        data, info = read_with_stat(located, max_bytes)
    except Refused as refused:
        info = os.lstat(located)
        return IndexedFile(info.st_size, local_etag(info)), None if refused.reason == "too_large" else refused
    return IndexedFile(info.st_size, local_etag(info), sha256_bytes(data)), data


def _read_s3_annotations(raw_uri: str, key: str, max_bytes: int) -> tuple[IndexedFile | None, bytes | None]:
    """(size, ETag and sha256, bytes) from one GET; the body is not read past `max_bytes` (bytes None)."""
    from botocore.exceptions import ClientError

    bucket, prefix = split_s3(raw_uri)
    object_key = f"{prefix}/{key}" if prefix else key
    client = s3_client()

    def get() -> tuple[IndexedFile | None, bytes | None]:
        try:
            response = client.get_object(Bucket=bucket, Key=object_key)
        except ClientError as error:
            if is_missing(error):
                return None, None
            raise
        size, etag = int(response["ContentLength"]), response["ETag"].strip('"')
        if size > max_bytes:
            response["Body"].close()
            return IndexedFile(size, etag), None
        data = response["Body"].read()
        return IndexedFile(size, etag, sha256_bytes(data)), data

    return s3_call(get, f"GET s3://{bucket}/{key}")
