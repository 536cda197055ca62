"""The whole-root, one-frame raw index: an independent reference the tests (and the validate bench)
compare the streamed per-source index (training_code/lib/raw_index.py) with, and that indexes hostile
roots whose keys name no source, such as `/absolute.jpg`. Never call it on a lake: it holds the listing.

One row per image file: source, key, size, etag, group and how many COCO annotations point at it,
from a listing (or an S3 Inventory report), never from image bytes. Hostile entries stay in the index
escaped by `printable_key`; an unusable annotations.json is reported by source, not raised.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from training_code.lib.coco import (
    ANNOTATIONS_FILE,
    DEFAULT_MAX_ANNOTATION_BYTES,
    INDEX_FIELDS,
    AnnotationError,
    parse_annotations,
)
from training_code.lib.hashing import sha256_json
from training_code.lib.raw_files import Refused, locate, read_limited
from training_code.lib.raw_index import IMAGE_SUFFIXES
from training_code.lib.raw_index_inventory import inventory_objects
from training_code.lib.raw_index_listing import group_of
from training_code.lib.storage import ObjectInfo, is_s3, join, key_problem, list_objects, printable_key, read_bytes


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
    raw_uri: str,
    inventory_manifest_uri: str = "",
    group_pattern: str = "",
    max_annotation_bytes: int = DEFAULT_MAX_ANNOTATION_BYTES,
) -> RawIndex:
    """Index all of `raw_uri` from a listing or, when given, an S3 Inventory report."""
    pattern = re.compile(group_pattern) if group_pattern else None
    if inventory_manifest_uri:
        listing = list(inventory_objects(inventory_manifest_uri, raw_uri))
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
    results = {source: _count(raw_uri, source, obj, max_annotation_bytes) for source, obj in annotation_files.items()}
    counts_by_source = {source: result for source, result in results.items() if isinstance(result, AnnotationCounts)}
    rows, missing = [], []
    for source in sorted(set(images) | set(annotation_files)):
        listed = {obj.key.partition("/")[2]: obj for obj in images.get(source, [])}
        counts = counts_by_source.get(source)
        if counts is not None:
            missing += [
                f"{source}/{name}" for name, count in sorted(counts.per_file.items()) if count and name not in listed
            ]
        for name, obj in sorted(listed.items()):
            rows.append(
                {
                    "source": source,
                    "key": obj.key,
                    "size": obj.size,
                    "etag": obj.etag,
                    "group": group_of(obj.key, None if key_problem(obj.key) else pattern),
                    "annotation_count": counts.per_file.get(name, 0) if counts else 0,
                }
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
        annotation_errors={source: result for source, result in results.items() if isinstance(result, str)},
        unsafe_keys=unsafe,
        annotation_entries_rejected=sum(counts.rejected_entries for counts in counts_by_source.values()),
    )


def _count(raw_uri: str, source: str, obj: ObjectInfo, max_bytes: int) -> AnnotationCounts | str:
    """One source's annotation counts, or the error naming its unusable file."""
    key = f"{source}/{ANNOTATIONS_FILE}"
    where = join(raw_uri, key)
    if obj.size > max_bytes:  # decided from the listing, before a byte is fetched
        return (
            f"{where}: {obj.size} bytes, above the annotation file limit of {max_bytes}; "
            "raise the limit or split the source"
        )
    try:
        # Locally the file is read only if it lies inside the root (a symlink out of it is refused).
        data = read_bytes(where) if is_s3(raw_uri) else read_limited(locate(Path(raw_uri), key), max_bytes)
        parsed = parse_annotations(source, data, where, max_bytes, keep=INDEX_FIELDS)
    except AnnotationError as error:
        return str(error)
    except Refused as refused:
        return f"{where}: {refused.reason}: {refused.detail}"
    return AnnotationCounts({name: len(anns) for name, anns in parsed.by_file.items()}, len(parsed.rejected))
