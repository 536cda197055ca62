"""Where a validation run reads the raw objects the index listed: a local root in place (fstat-checked), an
S3 root fetched by key (IfMatch) into scratch. A file not as listed is `RawRootChanged`."""

from __future__ import annotations

import argparse
import logging
import shutil
from pathlib import Path
from types import TracebackType

import pyarrow as pa
import pyarrow.compute as pc

from .annotation_files import annotation_error, load_annotations
from .coco import ANNOTATIONS_FILE, SourceAnnotations
from .contact_sheet import DRAWABLE_REASONS, MAX_ATTEMPTS, Thumbnail, quarantine_thumbnails
from .image_checks import ImageVerdict
from .image_decoding import decode_all
from .indexed_raw import ListedRoot
from .isolated_pool import IsolatedPool
from .raw_fetch import fetch_objects, scratch_folder
from .raw_files import RawRootChanged, Refused
from .read_list import ReadList
from .storage import is_s3, key_problem

log = logging.getLogger("zero.validate")


class RawReader:
    """The raw root of one run: `root` is the local root, or the scratch folder objects are fetched into."""

    def __init__(self, listed: ListedRoot, local_root: Path | None = None) -> None:
        self.listed = listed
        self.local = not is_s3(listed.raw_uri)
        if local_root is not None and not self.local:
            raise ValueError(
                f"--raw {local_root} names a local folder, but the index listed the S3 raw root {listed.raw_uri}: "
                "an S3 root is fetched by key; leave --raw out"
            )
        self.root = (local_root or Path(listed.raw_uri)) if self.local else scratch_folder()
        self.fetched_objects = self.fetched_bytes = 0

    def __enter__(self) -> RawReader:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        if not self.local:
            shutil.rmtree(self.root, ignore_errors=True)

    def fetch(self, rows: list[tuple[str, int, str]]) -> None:
        """S3: fetch (key, size, etag) rows into the scratch root (nothing to do for a local root)."""
        if self.local or not rows:
            return
        _, fetched = fetch_objects(self.listed.raw_uri, rows, self.root)
        self.fetched_objects += fetched.objects
        self.fetched_bytes += fetched.bytes

    def fetch_counts(self) -> dict[str, int]:
        """What this run fetched from an S3 raw root (objects, bytes); nothing for a local root, read in place."""
        return {} if self.local else {"fetched_objects": self.fetched_objects, "fetched_bytes": self.fetched_bytes}

    def decode(self, reads: ReadList, args: argparse.Namespace, pool: IsolatedPool | None) -> dict[str, ImageVerdict]:
        """A verdict per object of `reads`, each read from the object the index listed."""
        rows = reads.rows()
        if self.local:
            etags = {key: etag for key, _, etag in rows}
            return decode_all(self.root, [key for key, _, _ in rows], pool, args.max_image_bytes, etags)
        unread = {
            key: ImageVerdict.unread("too_large", f"{size} bytes, above the limit of {args.max_image_bytes}; not read")
            for key, size, _ in rows
            if size > args.max_image_bytes
        }
        readable = [row for row in rows if row[0] not in unread]
        self.fetch(readable)
        return {**unread, **decode_all(self.root, [key for key, _, _ in readable], pool, args.max_image_bytes)}

    def annotations(
        self, sources: set[str], max_bytes: int
    ) -> tuple[dict[str, SourceAnnotations | None], dict[str, str]]:
        """Each source's parsed annotations.json; on S3 one past `max_bytes` is not fetched."""
        if self.local:
            return load_annotations(self.root, sources, max_bytes, self.listed)
        too_large: dict[str, str] = {}
        rows = []
        for source in sorted(sources):
            key, indexed = f"{source}/{ANNOTATIONS_FILE}", self.listed.annotation_file(source)
            if indexed is None or key_problem(key):
                continue
            if indexed.size > max_bytes:
                refused = Refused("too_large", f"{indexed.size} bytes, above the limit of {max_bytes}; not read")
                too_large[source] = annotation_error(key, refused)
            else:
                rows.append((key, indexed.size, indexed.etag))
        self.fetch(rows)
        parsed, errors = load_annotations(self.root, sources - set(too_large), max_bytes, self.listed)
        return {**parsed, **dict.fromkeys(too_large)}, {**errors, **too_large}

    def thumbnails(self, quarantine: pa.Table, index: pa.Table, args: argparse.Namespace) -> list[Thumbnail]:
        """The contact sheet's thumbnails; on S3 only the files it may draw are fetched."""
        quarantine = quarantine.to_pandas()  # the quarantined rows only
        if not self.local:
            index = index.filter(pc.is_in(index.column("key"), pa.array(quarantine["key"], pa.string()))).to_pandas()
            drawable = quarantine[quarantine["reason"].isin(DRAWABLE_REASONS) & quarantine["sha256"].notna()]
            keys = set(drawable.sort_values("key", kind="stable").head(MAX_ATTEMPTS)["key"])
            listed = index[index["key"].isin(keys) & (index["size"] <= args.max_image_bytes)]
            for row in zip(listed["key"], listed["size"].astype(int), listed["etag"]):
                if not (self.root / row[0]).is_file():
                    try:
                        self.fetch([row])
                    except RawRootChanged as changed:
                        log.warning("not drawn on the contact sheet: %s", changed)
        return quarantine_thumbnails(
            self.root,
            quarantine,
            max_bytes=args.max_image_bytes,
            max_pixels=args.max_pixels,
            timeout_s=args.timeout_s,
            workers=args.workers,
        )
