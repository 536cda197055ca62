"""The Dagster side of the raw image index: `write_source_index` (training_code/lib/raw_index.py) indexes
one source, streamed into Parquet, in this process or as the job training_code/index.py, and
`source_listing_fingerprint` gives its listing fingerprint first when a job is to build it.

`build_raw_index` below is NOT used by the asset: it is the earlier whole-root, one-frame index, kept as
an independent reference that tests compare the streamed index with (and that index hostile roots whose
keys name no source, such as `/absolute.jpg`). Never call it on a lake. What follows describes it.

Build the raw image index from a listing of the raw root, never from image bytes.

One row per image file: source, key, size, etag (or mtime-size), group (the folder it sits in) and
how many COCO annotations point at it. Annotation files are read; images are not.

Hostile entries stay in the index, so validation gives each one its verdict: a key that is unsafe
(`..`, `./`, `//`, control characters, bytes that are not UTF-8) is stored escaped by `printable_key`
and never read. An annotations file that cannot be used is reported by source, not raised: the other
sources are indexed. Annotation files are parsed keeping only the fields the counts need, and a
bounded number of their bytes at a time, so the Dagster process's memory does not grow with them.
"""

from __future__ import annotations

import re
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from training_code.lib.coco import (
    ANNOTATIONS_FILE, DEFAULT_MAX_ANNOTATION_BYTES, INDEX_FIELDS, AnnotationError, parse_annotations,
)
from training_code.lib.hashing import sha256_json
from training_code.lib.raw_files import Refused, locate, read_limited
from training_code.lib.annotation_files import count_source_annotations
from training_code.lib.raw_index import IMAGE_SUFFIXES, _ListingPass, write_source_index
from training_code.lib.raw_index_listing import check_source, list_source
from training_code.lib.raw_index_groups import group_of
from training_code.lib.storage import ObjectInfo, is_s3, join, key_problem, list_objects, printable_key, read_bytes

from .s3_inventory import list_from_inventory

__all__ = ["IMAGE_SUFFIXES", "RawIndex", "build_raw_index", "group_of", "source_listing_fingerprint", "write_source_index"]


def source_listing_fingerprint(raw_uri: str, source: str, *, max_annotation_bytes: int = DEFAULT_MAX_ANNOTATION_BYTES,
                               inventory_manifest_uri: str | None = None) -> str:
    """The `listing_fingerprint` write_source_index would record for `<raw_uri>/<source>/`, from one
    streamed pass over that source's listing (nothing written, no list of keys kept): what the asset
    needs before it decides whether a job must build the index at all."""
    check_source(source)
    listing = _ListingPass(source, None, count_source_annotations(raw_uri, source, max_annotation_bytes))
    for _ in listing.batches(list_source(raw_uri, source, inventory_manifest_uri)):
        pass
    return listing.fingerprint()

ANNOTATION_READERS = 16  # concurrent GETs: on S3 the round trips overlap
# Annotation file bytes being parsed at once (a larger file runs alone); parsed with INDEX_FIELDS,
# the tree is a few times this, not the ~8x of a full parse.
ANNOTATION_BYTES_IN_FLIGHT = 128 << 20


@dataclass
class RawIndex:
    frame: pd.DataFrame
    listing_fingerprint: str
    ignored_files: list[str] = field(default_factory=list)
    sources_without_annotations: list[str] = field(default_factory=list)
    annotations_without_image: list[str] = field(default_factory=list)
    annotation_errors: dict[str, str] = field(default_factory=dict)  # source -> why its annotations.json is unusable
    unsafe_keys: list[str] = field(default_factory=list)  # escaped; validation quarantines each as unsafe_key
    annotation_entries_rejected: int = 0  # entries of usable annotation files that validation will reject


@dataclass
class AnnotationCounts:
    per_file: dict[str, int]  # file_name -> annotations pointing at it
    rejected_entries: int  # entries of the file validation will reject (see coco.parse_annotations)


def build_raw_index(
    raw_uri: str, inventory_manifest_uri: str = "", group_pattern: str = "", max_annotation_bytes: int = DEFAULT_MAX_ANNOTATION_BYTES,
    source: str = "",
) -> RawIndex:
    """Index `raw_uri` (only its folder `source` when given) from a listing (S3: in parallel by source
    folder) or, when given, an S3 Inventory report."""
    pattern = re.compile(group_pattern) if group_pattern else None
    if inventory_manifest_uri:
        listing = [obj for obj in list_from_inventory(inventory_manifest_uri, raw_uri, f"{source}/" if source else "") if not _folder_marker(obj)]
        listing = [obj for obj in listing if not source or obj.key.startswith(f"{source}/")]
    elif source:  # one source: list its folder only, keys kept relative to the raw root
        listing = [ObjectInfo(f"{source}/{obj.key}", obj.size, obj.etag) for obj in list_objects(join(raw_uri, source), include_unsafe=True)]
    else:
        listing = list(list_objects(raw_uri, include_unsafe=True))
    images: dict[str, list[ObjectInfo]] = {}
    annotation_files: dict[str, ObjectInfo] = {}
    ignored, unsafe = [], []
    for obj in listing:
        key = printable_key(obj.key)
        source, _, rest = key.partition("/")
        if not rest:
            ignored.append(key)  # files at the top level belong to no source
        elif rest == ANNOTATIONS_FILE and key_problem(key) is None:
            annotation_files[source] = obj
        elif rest.lower().endswith(IMAGE_SUFFIXES):
            images.setdefault(source, []).append(ObjectInfo(key, obj.size, obj.etag))
            if key_problem(key):
                unsafe.append(key)
        else:
            ignored.append(key)
    counts_by_source, errors = _count_annotations(raw_uri, annotation_files, max_annotation_bytes)
    rows, missing = [], []
    for source in sorted(set(images) | set(annotation_files)):
        listed = {obj.key.partition("/")[2]: obj for obj in images.get(source, [])}
        counts = counts_by_source.get(source)
        if counts is not None:
            missing += [f"{source}/{name}" for name, count in sorted(counts.per_file.items()) if count and name not in listed]
        for name, obj in sorted(listed.items()):
            rows.append(
                {"source": source, "key": obj.key, "size": obj.size, "etag": obj.etag,
                 "group": group_of(obj.key, None if key_problem(obj.key) else pattern),
                 "annotation_count": counts.per_file.get(name, 0) if counts else 0}
            )
    frame = pd.DataFrame(rows, columns=["source", "key", "size", "etag", "group", "annotation_count"])
    frame = frame.astype({"size": "int64", "annotation_count": "int64"})
    fingerprint = sha256_json([(printable_key(obj.key), obj.size, obj.etag) for obj in listing])
    return RawIndex(
        frame=frame,
        listing_fingerprint=fingerprint,
        ignored_files=ignored,
        sources_without_annotations=sorted(set(images) - set(annotation_files)),
        annotations_without_image=missing,
        annotation_errors=errors,
        unsafe_keys=unsafe,
        annotation_entries_rejected=sum(counts.rejected_entries for counts in counts_by_source.values()),
    )


def _folder_marker(obj: ObjectInfo) -> bool:
    return obj.key.endswith("/") and obj.size == 0


class _ByteBudget:
    """Lets work start while the bytes in flight stay under `limit`; one item larger than it runs alone."""

    def __init__(self, limit: int) -> None:
        self.limit, self.in_flight = limit, 0
        self._changed = threading.Condition()

    @contextmanager
    def held(self, size: int):
        with self._changed:
            self._changed.wait_for(lambda: self.in_flight == 0 or self.in_flight + size <= self.limit)
            self.in_flight += size
        try:
            yield
        finally:
            with self._changed:
                self.in_flight -= size
                self._changed.notify_all()


def _count_annotations(
    raw_uri: str, files: dict[str, ObjectInfo], max_bytes: int
) -> tuple[dict[str, AnnotationCounts], dict[str, str]]:
    """Each source's annotation counts, and for each unusable file the error naming it."""
    budget = _ByteBudget(ANNOTATION_BYTES_IN_FLIGHT)

    def count(source: str) -> AnnotationCounts | str:
        obj, key = files[source], f"{source}/{ANNOTATIONS_FILE}"
        where = join(raw_uri, key)
        if obj.size > max_bytes:  # decided from the listing, before a byte is fetched
            return f"{where}: {obj.size} bytes, above the annotation file limit of {max_bytes}; raise the limit or split the source"
        with budget.held(obj.size):
            try:
                parsed = parse_annotations(source, _read_annotation_file(raw_uri, key, max_bytes), where, max_bytes, keep=INDEX_FIELDS)
            except AnnotationError as error:
                return str(error)
            except Refused as refused:
                return f"{where}: {refused.reason}: {refused.detail}"
            return AnnotationCounts({name: len(anns) for name, anns in parsed.by_file.items()}, len(parsed.rejected))

    with ThreadPoolExecutor(ANNOTATION_READERS) as pool:
        results = dict(zip(files, pool.map(count, files)))
    counts = {source: result for source, result in results.items() if isinstance(result, AnnotationCounts)}
    return counts, {source: result for source, result in results.items() if isinstance(result, str)}


def _read_annotation_file(raw_uri: str, key: str, max_bytes: int) -> bytes:
    """Locally, the file is read only if it lies inside the root (a symlink out of it is refused)."""
    if is_s3(raw_uri):
        return read_bytes(join(raw_uri, key))
    return read_limited(locate(Path(raw_uri), key), max_bytes)
