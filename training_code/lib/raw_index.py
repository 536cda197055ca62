"""Index ONE source of the raw root into `index.parquet`, streamed in record batches, manifest last.

One row per image file (tables.RAW_INDEX), in listing order; images are never read; unsafe keys stay in,
escaped. The manifest records the source's annotations.json that jobs check their reads against."""

from __future__ import annotations

import hashlib
import json
import re
import tempfile
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .annotation_files import AnnotationCounts, count_source_annotations
from .coco import ANNOTATIONS_FILE, DEFAULT_MAX_ANNOTATION_BYTES
from .hashing import sha256_file
from .heap_freeze import heap_frozen
from .indexed_raw import ANNOTATION_FILES
from .raw_index_listing import GroupCounts, check_source, group_hash, group_of, list_source
from .storage import ObjectInfo, copy_file_atomic, delete_file, join, key_problem, printable_key, write_bytes_atomic
from .tables import RAW_INDEX, checked

INDEX_FILE = "index.parquet"
MANIFEST = "manifest.json"
MANIFEST_FORMAT = "zero-raw-index/3"  # 3: annotation_files (what the jobs check their reads against)
BATCH_ROWS = 50_000  # rows per record batch (and Parquet row group)
EXAMPLES = 20  # keys kept per kind of reported entry; the counts are complete
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".gif", ".webp", ".bmp", ".tif", ".tiff", ".mpo")
HASH_COLUMN = "group_hash"  # only in the scratch copy the rehearsal sample is cut from
# Every key `key_problem` refuses matches this once escaped by printable_key; most safe keys do not.
MAYBE_UNSAFE = r"\\|(?:^|/)\.\.?(?:/|$)|^/|//|/$|^$"
_json_string = json.encoder.encode_basestring_ascii  # what json.dumps writes for a str
_PLAIN_JSON = r"^[ !#-\[\]-~]*$"  # printable ASCII but '"' and '\\': json.dumps writes such text as is, quoted
_ESCAPED = r"[\x00-\x1f\x7f\\]"  # what printable_key escapes (besides lone surrogates)
_IMAGE_SUFFIX = "(" + "|".join(re.escape(suffix) for suffix in IMAGE_SUFFIXES) + ")$"


@heap_frozen()
def write_source_index(
    raw_uri: str,
    source: str,
    out_dir_or_uri: str | Path,
    *,
    group_pattern: str = "",
    max_annotation_bytes: int = DEFAULT_MAX_ANNOTATION_BYTES,
    inventory_manifest_uri: str | None = None,
    sample_images: int | None = None,
) -> dict[str, Any]:
    """Write `<out>/index.parquet`, then `<out>/manifest.json`; `sample_images` keeps whole groups."""
    check_source(source)
    pattern = re.compile(group_pattern) if group_pattern else None
    delete_file(join(out_dir_or_uri, MANIFEST))  # it must not vouch for an index this run fails to finish
    annotations = count_source_annotations(raw_uri, source, max_annotation_bytes)
    listing = _ListingPass(source, pattern, annotations)
    with tempfile.TemporaryDirectory(prefix="zero-index-") as scratch:
        final = Path(scratch) / INDEX_FILE
        batches = listing.batches(list_source(raw_uri, source, inventory_manifest_uri))
        if sample_images:
            full = Path(scratch) / "all.parquet"
            batches = _read_back(full, _write_all_with_hashes(batches, full).sample_limit(sample_images))
        with _IndexWriter(final) as writer:
            for frame, hashes in batches:
                writer.write(frame, hashes)
        copy_file_atomic(final, join(out_dir_or_uri, INDEX_FILE))
        files = {INDEX_FILE: {"bytes": final.stat().st_size, "sha256": sha256_file(final)}}
    missing = listing.missing_annotated()
    manifest = {
        "format": MANIFEST_FORMAT,
        "source": source,
        "raw_uri": str(raw_uri),
        "listing_fingerprint": listing.fingerprint(),
        "group_pattern": group_pattern,
        "sample_images": sample_images or None,
        "listed_images": listing.images,  # before the sample
        **writer.counts(),
        "annotations_without_image": len(missing),
        "ignored_files": listing.ignored,
        "annotation_entries_rejected": annotations.rejected_entries,
        "annotation_error": annotations.error,
        "has_annotations": annotations.identity is not None,
        # What jobs check their read of the annotations file against (indexed_raw).
        ANNOTATION_FILES: {source: None if annotations.file is None else annotations.file.as_json()},
        "examples": {
            "unsafe_keys": writer.unsafe_examples,
            "ignored_files": listing.ignored_examples,
            "annotations_without_image": missing[:EXAMPLES],
        },
        "files": files,
    }
    write_bytes_atomic(join(out_dir_or_uri, MANIFEST), json.dumps(manifest, indent=1, sort_keys=True).encode())
    return {**manifest, "uri": str(out_dir_or_uri)}


@heap_frozen()
def source_listing_fingerprint(
    raw_uri: str,
    source: str,
    *,
    max_annotation_bytes: int = DEFAULT_MAX_ANNOTATION_BYTES,
    inventory_manifest_uri: str | None = None,
) -> str:
    """The `listing_fingerprint` write_source_index would record, writing nothing."""
    check_source(source)
    listing = _ListingPass(source, None, count_source_annotations(raw_uri, source, max_annotation_bytes))
    for _ in listing.batches(list_source(raw_uri, source, inventory_manifest_uri)):
        pass
    return listing.fingerprint()


def whole_root_manifest(
    raw_uri: str, sources: list[str], max_annotation_bytes: int = DEFAULT_MAX_ANNOTATION_BYTES
) -> dict[str, Any]:
    """The index-manifest fields jobs read, for an index of several sources (benchmarks, tests)."""
    files = {}
    for source in sorted(set(sources)):
        if key_problem(f"{source}/{ANNOTATIONS_FILE}") is None:
            found = count_source_annotations(raw_uri, source, max_annotation_bytes).file
            files[source] = None if found is None else found.as_json()
    return {"format": MANIFEST_FORMAT, "raw_uri": str(raw_uri), ANNOTATION_FILES: files}


class _ListingPass:
    """Turns the listing into row batches, keeping the fingerprint (sha256 of the JSON list of [key, size,
    etag] in listing order, annotations.json last as parsed) and the listing's own counts."""

    def __init__(self, source: str, pattern: re.Pattern[str] | None, annotations: AnnotationCounts) -> None:
        self.source, self.pattern, self.annotations = source, pattern, annotations
        self._annotated = pa.array(list(annotations.per_file), pa.string())
        self._counts = np.fromiter(annotations.per_file.values(), dtype=np.int64, count=len(annotations.per_file))
        self._claimed = np.zeros(len(self._counts), dtype=bool)
        self.images = self.ignored = 0
        self.ignored_examples: list[str] = []
        self._hash, self._first = hashlib.sha256(b"["), True

    def _hash_entries(self, keys: pa.Array, sizes: pa.Array, etags: pa.Array) -> None:
        """Feed `[key,size,etag]` entries to the fingerprint as json.dumps writes them."""
        if not len(keys):
            return
        if (
            pc.all(pc.match_substring_regex(keys, _PLAIN_JSON)).as_py()
            and pc.all(pc.match_substring_regex(etags, _PLAIN_JSON)).as_py()
        ):
            entries = pc.binary_join_element_wise('["', keys, '",', pc.cast(sizes, pa.string()), ',"', etags, '"]', "")
            text = ",".join(entries.to_pylist())
        else:
            text = ",".join(
                f"[{_json_string(k)},{int(n)},{_json_string(e)}]"
                for k, n, e in zip(keys.to_pylist(), sizes.to_pylist(), etags.to_pylist())
            )
        self._hash.update(("" if self._first else ",").encode() + text.encode())
        self._first = False

    def fingerprint(self) -> str:
        final = self._hash.copy()
        if self.annotations.identity is not None:
            size, etag = self.annotations.identity
            final.update(
                (b"" if self._first else b",")
                + json.dumps([f"{self.source}/{ANNOTATIONS_FILE}", size, etag], separators=(",", ":")).encode()
            )
        final.update(b"]")
        return final.hexdigest()

    def missing_annotated(self) -> list[str]:
        """Keys of image entries with annotations whose file was not listed (after the whole listing)."""
        missing = self._annotated.filter(pa.array(~self._claimed & (self._counts > 0))).to_pylist()
        return [f"{self.source}/{name}" for name in sorted(missing)]

    def batches(self, listing: Iterator[ObjectInfo]) -> Iterator[tuple[pa.Table, np.ndarray]]:
        """The index rows of the listing, by columns, a chunk of BATCH_ROWS listed objects at a time."""
        while chunk := list(islice(listing, BATCH_ROWS)):
            rows, hashes = self._rows(chunk)
            if rows.num_rows:
                yield rows, hashes

    def _rows(self, chunk: list[ObjectInfo]) -> tuple[pa.Table, np.ndarray]:
        keys = _printable_keys([obj.key for obj in chunk])
        sizes = pa.array([obj.size for obj in chunk], pa.int64())
        etags = pa.array([obj.etag for obj in chunk], pa.string())
        listed = pc.not_equal(keys, f"{self.source}/{ANNOTATIONS_FILE}")  # that one is hashed from what was parsed
        keys, sizes, etags = keys.filter(listed), sizes.filter(listed), etags.filter(listed)
        self._hash_entries(keys, sizes, etags)
        image = pc.match_substring_regex(pc.utf8_lower(keys), _IMAGE_SUFFIX)
        others = keys.filter(pc.invert(image))
        self.ignored += len(others)
        self.ignored_examples += others[: max(EXAMPLES - len(self.ignored_examples), 0)].to_pylist()
        keys, sizes, etags = keys.filter(image), sizes.filter(image), etags.filter(image)
        groups = self._groups(keys)
        distinct = pc.unique(groups)
        group_hashes = np.array([group_hash(group) for group in distinct.to_pylist()], dtype=np.uint64)
        where = pc.index_in(pc.utf8_slice_codeunits(keys, len(self.source) + 1), value_set=self._annotated)
        found = where.drop_null().to_numpy()
        self._claimed[found] = True
        counts = np.zeros(len(keys), dtype=np.int64)
        counts[pc.is_valid(where).to_numpy(zero_copy_only=False)] = self._counts[found]
        self.images += len(keys)
        rows = pa.table(
            [pa.array([self.source] * len(keys), pa.string()), keys, sizes, etags, groups, counts],
            schema=RAW_INDEX.arrow,
        )
        return rows, group_hashes[pc.index_in(groups, value_set=distinct).to_numpy()]

    def _groups(self, keys: pa.Array) -> pa.Array:
        """Each key's split group: its folder (group_of's, by columns for canonical keys), or the pattern's."""
        if self.pattern is not None:
            return pa.array(
                [group_of(key, None if key_problem(key) else self.pattern) for key in keys.to_pylist()], pa.string()
            )
        folders = pc.replace_substring_regex(keys, r"/[^/]*$", "")
        maybe_unsafe = pc.match_substring_regex(keys, MAYBE_UNSAFE)
        if not pc.any(maybe_unsafe).as_py():
            return folders
        return pa.array(
            [
                group_of(key) if unsafe and key_problem(key) else folder
                for key, folder, unsafe in zip(keys.to_pylist(), folders.to_pylist(), maybe_unsafe.to_pylist())
            ],
            pa.string(),
        )


def _printable_keys(keys: list[str]) -> pa.Array:
    """`printable_key` of each key, by columns where no key needs escaping."""
    try:
        column = pa.array(keys, pa.string())
    except (UnicodeEncodeError, pa.ArrowInvalid):  # a lone surrogate: a name that is not valid UTF-8
        return pa.array([printable_key(key) for key in keys], pa.string())
    if not pc.any(pc.match_substring_regex(column, _ESCAPED)).as_py():
        return column
    return pa.array([printable_key(key) for key in keys], pa.string())


class _IndexWriter:
    """index.parquet one validated batch at a time, with the counts of what it wrote."""

    def __init__(self, path: Path) -> None:
        self._writer = pq.ParquetWriter(path, RAW_INDEX.arrow)
        self.images = self.bytes = self.without_annotation = self.unsafe = 0
        self.unsafe_examples: list[str] = []
        self.groups = GroupCounts()

    def __enter__(self) -> _IndexWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._writer.close()

    def write(self, table: pa.Table, hashes: np.ndarray) -> None:
        self._writer.write_table(checked(table, RAW_INDEX))
        self.images += table.num_rows
        self.bytes += pc.sum(table.column("size")).as_py() or 0
        self.without_annotation += pc.sum(pc.equal(table.column("annotation_count"), 0)).as_py() or 0
        keys = table.column("key")  # key_problem itself only where it may say yes
        unsafe = [
            key for key in keys.filter(pc.match_substring_regex(keys, MAYBE_UNSAFE)).to_pylist() if key_problem(key)
        ]
        self.unsafe += len(unsafe)
        self.unsafe_examples += unsafe[: EXAMPLES - len(self.unsafe_examples)]
        self.groups.add(hashes)

    def counts(self) -> dict[str, int]:
        return {
            "images": self.images,
            "bytes": self.bytes,
            "groups": len(self.groups),
            "images_without_annotation": self.without_annotation,
            "unsafe_keys": self.unsafe,
        }


def _write_all_with_hashes(batches: Iterator[tuple[pa.Table, np.ndarray]], path: Path) -> GroupCounts:
    """The whole index to scratch with each row's group hash, counting images per group for the sample."""
    groups = GroupCounts()
    with pq.ParquetWriter(path, RAW_INDEX.arrow.append(pa.field(HASH_COLUMN, pa.uint64()))) as writer:
        for table, hashes in batches:
            writer.write_table(table.append_column(HASH_COLUMN, pa.array(hashes, pa.uint64())))
            groups.add(hashes)
    return groups


def _read_back(path: Path, limit: int | None) -> Iterator[tuple[pa.Table, np.ndarray]]:
    """The scratch index a batch at a time, only the rows of groups hashed up to `limit` (all if None)."""
    for batch in pq.ParquetFile(path).iter_batches(batch_size=BATCH_ROWS):
        hashes = batch.column(HASH_COLUMN).to_numpy()
        keep = np.ones(len(hashes), dtype=bool) if limit is None else hashes <= np.uint64(limit)
        if keep.any():
            rows = pa.Table.from_batches([batch.drop_columns([HASH_COLUMN])]).filter(pa.array(keep))
            yield rows, hashes[keep]
