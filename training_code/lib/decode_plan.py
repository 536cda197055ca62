"""Which images a validation run must decode, worked out from tables alone: its read list.

The verdict cache's rule: an image is decoded unless the previous output has a reusable verdict for its
(key, etag, listed size) under the same decode settings; unsafe keys are left out. Runs before launch
on the index and previous verdicts only, never an image.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from .indexed_raw import INDEX_MANIFEST
from .parquet_bytes import read_parquet_bytes
from .read_list import SCHEMA as ROWS
from .read_list import ReadList, read_list_of
from .storage import join, key_problem, read_bytes
from .verdict_cache import NEVER_REUSED, VERDICTS_FILE

INDEX_TABLE = "index.parquet"
PREVIOUS_MANIFEST = "manifest.json"


def images_to_decode(index_uri: str, previous_uri: str | None, decode_settings: dict[str, Any]) -> ReadList:
    """The read list of a validation run over the index at `index_uri` (a raw_image_index output),
    reusing verdicts of the validated output at `previous_uri` where the rule allows."""
    manifest = json.loads(read_bytes(join(index_uri, INDEX_MANIFEST)))
    if "raw_uri" not in manifest:
        raise ValueError(f"{join(index_uri, INDEX_MANIFEST)} names no raw_uri; rematerialize raw_image_index")
    index = read_parquet_bytes(read_bytes(join(index_uri, INDEX_TABLE)), ROWS.names).cast(ROWS)
    reusable = _reusable_verdicts(previous_uri, decode_settings)
    if reusable is not None:
        index = index.join(reusable, keys=["key", "etag", "size"], join_type="left anti")
    safe = pa.array([key_problem(key) is None for key in index.column("key").to_pylist()], pa.bool_())
    raw_uri, limit = str(manifest["raw_uri"]), int(decode_settings["max_image_bytes"])
    return read_list_of(raw_uri, index.filter(safe), limit, decode_settings)


def _reusable_verdicts(previous_uri: str | None, decode_settings: dict[str, Any]) -> pa.Table | None:
    """(key, etag, size) of the previous verdicts a run may reuse; None when none may be."""
    if previous_uri is None:
        return None
    try:
        previous = json.loads(read_bytes(join(previous_uri, PREVIOUS_MANIFEST)))
    except FileNotFoundError:
        return None  # an unfinished run: every image is decoded, as the job decides too
    if previous.get("decode_settings") != decode_settings:
        return None
    verdicts = read_parquet_bytes(
        read_bytes(join(previous_uri, VERDICTS_FILE)), ["key", "etag", "listed_size", "reason"]
    )
    kept = verdicts.filter(pc.invert(pc.is_in(pc.fill_null(verdicts.column("reason"), ""), pa.array(NEVER_REUSED))))
    return (
        kept.select(["key", "etag", "listed_size"])
        .rename_columns(["key", "etag", "size"])
        .cast(pa.schema([("key", pa.string()), ("etag", pa.string()), ("size", pa.int64())]))
    )
