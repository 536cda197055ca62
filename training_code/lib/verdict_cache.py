"""Reuse image verdicts from an earlier validation run for unchanged files (key, listed etag and size, and
decode settings all match), by an Arrow join. Never reused: NEVER_REUSED (it may read now, or was not read)."""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from .image_checks import ImageVerdict
from .storage import exists, join, read_bytes
from .tables import VERDICTS, read_table
from .validated_files import VERDICTS_FILE

log = logging.getLogger("zero.validate")

NEVER_REUSED = frozenset({"unreadable", "unsafe_key", "outside_root"})
# Of those, not the file's fault: an output holding any is never reused, and the next run decodes these again.
RETRIED_REASONS = frozenset({"unreadable"})


def verdict_table(listed: pa.Table, verdicts: dict[str, ImageVerdict]) -> pa.Table:
    """VERDICTS rows for the index rows `listed`, no nulls: a missing sha256 or reason is empty, hashes []."""
    keys = listed.column("key").to_pylist()
    rows = [verdicts[key] for key in keys]
    columns: dict[str, Any] = {name: [getattr(verdict, name) for verdict in rows] for name in ImageVerdict._fields}
    columns.update(
        sha256=[value or "" for value in columns["sha256"]],
        reason=[value or "" for value in columns["reason"]],
        phash=[list(value or ()) for value in columns["phash"]],
        dhash=[list(value or ()) for value in columns["dhash"]],
    )
    columns |= {"key": keys, "etag": listed.column("etag"), "listed_size": listed.column("size")}
    return pa.table({name: columns[name] for name in VERDICTS.arrow.names}, schema=VERDICTS.arrow)


def reusable_verdicts(previous: str | os.PathLike, decode_settings: dict[str, Any]) -> pa.Table | None:
    """The previous run's VERDICTS rows this run may reuse, or None when none may be."""
    manifest_uri = join(previous, "manifest.json")
    if not exists(manifest_uri):
        log.warning("--previous %s has no manifest.json (an unfinished run): every image is decoded", previous)
        return None
    manifest = json.loads(read_bytes(manifest_uri))
    earlier = manifest.get("decode_settings")
    if earlier != decode_settings:
        log.info(
            "decode settings changed since %s (%s -> %s): every image is decoded", previous, earlier, decode_settings
        )
        return None
    verdicts = read_table(join(previous, VERDICTS_FILE), VERDICTS)
    return verdicts.filter(pc.invert(pc.is_in(verdicts.column("reason"), pa.array(sorted(NEVER_REUSED)))))


def split_reused(listed: pa.Table, reusable: pa.Table | None) -> tuple[pa.Table, list[str]]:
    """The reusable verdicts of `listed`, and the keys to decode (new or changed), in key order."""
    if reusable is None or not reusable.num_rows:
        return VERDICTS.empty(), sorted(listed.column("key").to_pylist())
    identity = listed.select(["key", "etag", "size"]).rename_columns(["key", "etag", "listed_size"])
    # Joined on the identity and a row number only: Arrow's join carries no list column (the hashes).
    numbered = reusable.select(["key", "etag", "listed_size"]).append_column("row", pa.array(range(reusable.num_rows)))
    matched = numbered.join(identity, keys=["key", "etag", "listed_size"], join_type="inner")
    reused = reusable.take(matched.column("row")).sort_by("key")
    to_decode = identity.join(matched.select(["key"]), keys="key", join_type="left anti")
    return reused, sorted(to_decode.column("key").to_pylist())
