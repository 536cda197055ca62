"""The training set: which shard sets of which sources a training run reads, and which rows it skips.

`manifest.json` (format `zero-training-set/1`) lists per source its shard set (`folder`, relative to
the manifest's own folder once warmed; `shards_uri` where it was built), data version, categories
and shards; the shared vocabulary (every category name of the chosen sources, ids 1..K in name
order); and `excluded.parquet` names the (source, key) rows training and evaluation skip:
- an exact duplicate (the same sha256) found in several sources is kept in the source whose name
  sorts first and excluded from the others (decided from the validated tables' sha256 column,
  never from image bytes);
- with a cap of images per source, a source's rows beyond it are excluded, keeping the rows whose
  key hashes lowest, so the kept set is stable as the source grows.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from .verified_read import read_verified

FORMAT = "zero-training-set/1"
MANIFEST = "manifest.json"
EXCLUDED = "excluded.parquet"
DUPLICATE_RULE = (
    "an exact duplicate (same sha256) in several sources is kept in the source whose name sorts first, "
    "excluded from the others"
)
EXCLUDED_SCHEMA = pa.schema([("source", pa.string()), ("key", pa.string()), ("reason", pa.string())])


def choose_rows(
    accepted: dict[str, list[tuple[str, str]]], max_images_per_source: int | None
) -> list[tuple[str, str, str]]:
    """The excluded (source, key, reason) rows, given each source's accepted (key, sha256) rows."""
    excluded: list[tuple[str, str, str]] = []
    kept_in: dict[str, str] = {}  # sha256 -> the source that keeps it
    for source in sorted(accepted):
        kept = []
        for key, sha in sorted(accepted[source]):
            owner = kept_in.setdefault(sha, source)
            if owner != source:
                excluded.append((source, key, f"duplicate of an image kept in source {owner}"))
            else:
                kept.append(key)
        if max_images_per_source is not None and len(kept) > max_images_per_source:
            by_hash = sorted(kept, key=lambda key: hashlib.sha256(key.encode()).hexdigest())
            excluded += [
                (source, key, f"over the cap of {max_images_per_source} images per source")
                for key in sorted(by_hash[max_images_per_source:])
            ]
    return excluded


def vocabulary(categories_by_source: Iterable[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    names = sorted({c["name"] for categories in categories_by_source for c in categories})
    return [{"id": index, "name": name} for index, name in enumerate(names, start=1)]


def excluded_parquet(rows: list[tuple[str, str, str]]) -> bytes:
    table = pa.Table.from_pylist([{"source": s, "key": k, "reason": r} for s, k, r in rows], schema=EXCLUDED_SCHEMA)
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def read_training_set(folder: Path) -> dict[str, Any] | None:
    """The training-set manifest in `folder`, or None when `folder` holds a plain shard set."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        return None
    manifest = json.loads(path.read_text())
    return manifest if isinstance(manifest, dict) and manifest.get("format") == FORMAT else None


def excluded_keys(folder: Path) -> dict[str, frozenset[str]]:
    """source -> the keys training and evaluation skip (the table checked against the manifest's sha256)."""
    path = Path(folder) / EXCLUDED
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: the training set names its excluded rows in {EXCLUDED}, which is missing; "
            "warm the training set again"
        )
    by_source: dict[str, set[str]] = {}
    for row in pq.read_table(io.BytesIO(read_verified(path))).to_pylist():
        by_source.setdefault(row["source"], set()).add(row["key"])
    return {source: frozenset(keys) for source, keys in by_source.items()}


def label_map(source_categories: list[dict[str, Any]], shared: list[dict[str, Any]]) -> dict[int, int]:
    """A source's category id -> the shared vocabulary's id for the same name."""
    shared_id = {c["name"]: int(c["id"]) for c in shared}
    return {int(c["id"]): shared_id[c["name"]] for c in source_categories}
