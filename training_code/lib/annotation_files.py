"""Find and read each source's `annotations.json` under a raw root without leaving it.

The validation pass reads them here (on one host, or in the reduce stage from what the map hosts
passed on); the raw index counts one source's annotations per file here (`count_source_annotations`).
A file that cannot be used costs its source its labels, with an error naming the file; the other
sources go on.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from .coco import ANNOTATIONS_FILE, INDEX_FIELDS, AnnotationError, SourceAnnotations, parse_annotations
from .raw_files import Refused, locate, read_limited
from .storage import is_s3, join, key_problem, s3_call, s3_client, split_s3, write_bytes_atomic

log = logging.getLogger("zero.validate")

REFUSED_ANNOTATIONS = (
    "refused.txt"  # beside a passed-on file: why a map host did not read that source's annotations.json
)


def load_annotations(
    raw: Path, sources: set[str], max_bytes: int, via_links: bool = False
) -> tuple[dict[str, SourceAnnotations | None], dict[str, str]]:
    """Each source's parsed COCO file, None for a source without a usable one (its images are all
    unmatched); and for each source whose file exists but cannot be used, the error naming it.

    Sources are those in the index (one source, for a per-source validation; another source's file
    under `raw` is not this output's business). A source folder whose name is not a safe key is
    skipped: its images are unsafe_key verdicts anyway.
    """
    with_file = {path.parent.name for path in raw.glob(f"*/{ANNOTATIONS_FILE}")} & sources
    refused = {path.parent.name: path.read_text() for path in raw.glob(f"*/{REFUSED_ANNOTATIONS}")}  # from map hosts
    parsed: dict[str, SourceAnnotations | None] = {}
    errors = dict(refused)
    for source in sorted(sources | with_file | set(refused)):
        key = f"{source}/{ANNOTATIONS_FILE}"
        parsed[source] = None
        if source in refused or key_problem(key):
            continue
        if source not in with_file:
            log.warning("source %r has no %s: all its images are reported as image_without_annotation", source, key)
            continue
        try:
            parsed[source] = parse_annotations(
                source, read_limited(locate(raw, key, via_links), max_bytes), key, max_bytes
            )
        except (AnnotationError, Refused, OSError) as error:
            errors[source] = annotation_error(key, error)
    for _source, error in sorted(errors.items()):
        log.error("%s; its images are reported as image_without_annotation, the other sources go on", error)
    return parsed, errors


def annotation_error(key: str, error: Exception) -> str:
    if isinstance(error, AnnotationError):
        return str(error)
    if isinstance(error, Refused):
        return f"{key}: {error.reason}: {error.detail}"
    return f"{key}: unreadable: {type(error).__name__}: {error.strerror or error}"


def copy_annotation_files(raw: Path, dest: Path, max_bytes: int) -> int:
    """The map stage: pass on each annotations.json this host received (read inside the root, up to
    `max_bytes`), or why it was not read, for the reduce stage. Returns how many sources were seen."""
    sources = sorted({path.parent.name for path in raw.glob(f"*/{ANNOTATIONS_FILE}")})
    for source in sources:
        key = f"{source}/{ANNOTATIONS_FILE}"
        if key_problem(key):
            continue  # its images are unsafe_key verdicts; nothing may be written under that name
        try:
            write_bytes_atomic(
                dest / source / ANNOTATIONS_FILE, read_limited(locate(raw, key, via_links=True), max_bytes)
            )
        except (Refused, OSError) as error:
            write_bytes_atomic(dest / source / REFUSED_ANNOTATIONS, annotation_error(key, error).encode())
    return len(sources)


@dataclass
class AnnotationCounts:
    """What the raw index needs of one source's annotations.json."""

    per_file: dict[str, int]  # file_name -> annotations pointing at it: one entry per image entry of the file
    rejected_entries: int  # entries validation will reject (see coco.parse_annotations)
    error: str | None  # why the file cannot be used; None when it was used or there is none
    identity: tuple[int, str] | None  # (size, etag) of the bytes read (or refused), None when there is no file


def count_source_annotations(raw_uri: str, source: str, max_bytes: int) -> AnnotationCounts:
    """Parse `<raw_uri>/<source>/annotations.json` once, keeping only what counting needs. A file past
    `max_bytes` is refused from its size before a byte of it is read; a local one is read only inside
    the root. The counts dict grows with the source's annotated images (about 100-150 bytes each)."""
    key = f"{source}/{ANNOTATIONS_FILE}"
    where = join(raw_uri, key)
    size, etag, raw = (
        _read_s3_annotations(raw_uri, key, max_bytes)
        if is_s3(raw_uri)
        else _read_local_annotations(Path(raw_uri), key, max_bytes)
    )
    if size is None:
        return AnnotationCounts({}, 0, None, None)
    identity = (size, etag)
    if isinstance(raw, Refused):
        return AnnotationCounts({}, 0, f"{where}: {raw.reason}: {raw.detail}", identity)
    if raw is None:
        return AnnotationCounts(
            {},
            0,
            f"{where}: {size} bytes, above the annotation file limit of {max_bytes}; "
            "raise the limit or split the source",
            identity,
        )
    try:
        parsed = parse_annotations(source, raw, where, max_bytes, keep=INDEX_FIELDS)
    except AnnotationError as error:
        return AnnotationCounts({}, 0, str(error), identity)
    del raw
    return AnnotationCounts(
        {name: len(anns) for name, anns in parsed.by_file.items()}, len(parsed.rejected), None, identity
    )


def _read_local_annotations(raw: Path, key: str, max_bytes: int) -> tuple[int | None, str, bytes | Refused | None]:
    """(size, etag as a listing gives it, bytes), bytes None past `max_bytes` and a Refused for a file
    out of the root or not regular; size None when there is no file."""
    if not os.path.lexists(raw / key):
        return None, "", None
    try:
        located = locate(raw, key)
        info = os.stat(located)
    except Refused as refused:
        info = os.lstat(raw / key)
        return info.st_size, f"{info.st_mtime_ns}-{info.st_size}", refused
    etag = f"{info.st_mtime_ns}-{info.st_size}"
    if info.st_size > max_bytes:
        return info.st_size, etag, None
    try:
        return info.st_size, etag, read_limited(located, max_bytes)
    except Refused as refused:
        return info.st_size, etag, refused


def _read_s3_annotations(raw_uri: str, key: str, max_bytes: int) -> tuple[int | None, str, bytes | None]:
    """(size, ETag, bytes) from one GET: the body is not read past `max_bytes` (bytes None)."""
    from botocore.exceptions import ClientError

    bucket, prefix = split_s3(raw_uri)
    object_key = f"{prefix}/{key}" if prefix else key
    client = s3_client()

    def get() -> tuple[int | None, str, bytes | None]:
        try:
            response = client.get_object(Bucket=bucket, Key=object_key)
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                return None, "", None
            raise
        size, etag = int(response["ContentLength"]), response["ETag"].strip('"')
        if size > max_bytes:
            response["Body"].close()
            return size, etag, None
        return size, etag, response["Body"].read()

    return s3_call(get, f"GET s3://{bucket}/{object_key}")
