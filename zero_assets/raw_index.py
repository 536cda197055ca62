"""Build the raw image index from a listing of the raw root, never from image bytes.

One row per image file: source, key, size, etag (or mtime-size), group (the folder it sits in) and
how many COCO annotations point at it. Annotation files are read (they are small); images are not.
"""

from __future__ import annotations

import hashlib
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import PurePosixPath

import pandas as pd

from training_code.lib.coco import ANNOTATIONS_FILE, SourceAnnotations, annotated_files_without_image, parse_annotations
from training_code.lib.hashing import sha256_json
from training_code.lib.storage import ObjectInfo, join, list_objects, read_bytes

from .s3_inventory import list_from_inventory

ANNOTATION_READERS = 16
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".gif", ".webp", ".bmp", ".tif", ".tiff", ".mpo")


@dataclass
class RawIndex:
    frame: pd.DataFrame
    listing_fingerprint: str
    ignored_files: list[str] = field(default_factory=list)
    sources_without_annotations: list[str] = field(default_factory=list)
    annotations_without_image: list[str] = field(default_factory=list)


def group_of(key: str, pattern: re.Pattern[str] | None = None) -> str:
    """The split group of an image: by default the folder it sits in (`source/lot_003` for
    `source/lot_003/part_1.jpg`); with `pattern`, the text its first match covers (group 1 if it has one)."""
    if pattern is None:
        return str(PurePosixPath(key).parent)
    match = pattern.search(key)
    if match is None:
        raise ValueError(f"group pattern {pattern.pattern!r} does not match key {key!r}; fix the pattern or the key")
    return match.group(1) if pattern.groups else match.group(0)


def build_raw_index(raw_uri: str, inventory_manifest_uri: str = "", group_pattern: str = "") -> RawIndex:
    """Index `raw_uri` from a listing (S3: in parallel by source folder) or, when given, an S3 Inventory report."""
    pattern = re.compile(group_pattern) if group_pattern else None
    if inventory_manifest_uri:
        listing = list(list_from_inventory(inventory_manifest_uri, raw_uri))
    else:
        listing = list(list_objects(raw_uri))
    images: dict[str, list[ObjectInfo]] = {}
    annotation_files, ignored = [], []
    for obj in listing:
        source, _, rest = obj.key.partition("/")
        if not rest:
            ignored.append(obj.key)  # files at the top level belong to no source
        elif rest == ANNOTATIONS_FILE:
            annotation_files.append(source)
        elif rest.lower().endswith(IMAGE_SUFFIXES):
            images.setdefault(source, []).append(obj)
        else:
            ignored.append(obj.key)
    rows, missing = [], []
    with ThreadPoolExecutor(ANNOTATION_READERS) as pool:  # one GET each: on S3 the round trips overlap
        parsed_by_source = dict(zip(annotation_files, pool.map(partial(_read_annotations, raw_uri), annotation_files)))
    for source in sorted(set(images) | set(annotation_files)):
        listed = {obj.key.partition("/")[2]: obj for obj in images.get(source, [])}
        counts: dict[str, int] = {}
        if source in annotation_files:
            parsed = parsed_by_source[source]
            counts = {name: len(parsed.annotations_for(name)) for name in listed}
            missing += [f"{source}/{name}" for name in annotated_files_without_image(parsed, set(listed))]
        for name, obj in sorted(listed.items()):
            rows.append(
                {"source": source, "key": obj.key, "size": obj.size, "etag": obj.etag,
                 "group": group_of(obj.key, pattern), "annotation_count": counts.get(name, 0)}
            )
    frame = pd.DataFrame(rows, columns=["source", "key", "size", "etag", "group", "annotation_count"])
    frame = frame.astype({"size": "int64", "annotation_count": "int64"})
    fingerprint = sha256_json([(obj.key, obj.size, obj.etag) for obj in listing])
    return RawIndex(
        frame=frame,
        listing_fingerprint=fingerprint,
        ignored_files=ignored,
        sources_without_annotations=sorted(set(images) - set(annotation_files)),
        annotations_without_image=missing,
    )


def _read_annotations(raw_uri: str, source: str) -> SourceAnnotations:
    where = join(raw_uri, f"{source}/{ANNOTATIONS_FILE}")
    return parse_annotations(source, read_bytes(where), where)


def sample_by_group(frame: pd.DataFrame, images: int) -> pd.DataFrame:
    """A deterministic sample of about `images` rows that keeps whole groups (so splits stay honest).

    Groups are taken in the order of a hash of their name, so the sample is stable as data grows:
    a rehearsal run sees the same images again plus, at most, some from new groups.
    """
    if len(frame) <= images:
        return frame
    order = sorted(frame["group"].unique(), key=lambda group: hashlib.sha256(group.encode()).hexdigest())
    sizes = frame.groupby("group").size()
    chosen, total = [], 0
    for group in order:
        if total >= images:
            break
        chosen.append(group)
        total += int(sizes[group])
    return frame[frame["group"].isin(chosen)].reset_index(drop=True)
