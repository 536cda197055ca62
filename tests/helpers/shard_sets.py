"""arrow_shards outputs in the `zero-shards/4` layout, written for tests and benchmarks of what reads them.

`<lake>/arrow_shards/<fp16>/shards/<split>-<sha256[:16]>.arrow` (real Arrow IPC shards, written with
`ShardWriter`, then named by their content), `masked.parquet` (path, key) and `manifest.json` last,
each shard listed by `path` relative to the manifest's folder: `shards/<name>` for the ones this
output packed, `../<fp16>/shards/<name>` for those it keeps from an earlier one.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from training_code.lib.hashing import sha256_bytes
from training_code.lib.shard_format import FORMAT
from training_code.lib.shard_writer import ShardWriter
from training_code.lib.storage import join, write_bytes_atomic

CATEGORIES = [{"id": 1, "name": "widget"}]
MASKED = "masked.parquet"


def image_row(source: str, index: int, image_bytes: int) -> dict[str, Any]:
    """One shard row of `source` with `image_bytes` of random image data."""
    key = f"{source}/lot_{index // 100:03d}/img_{index:06d}.jpg"
    return {
        "image": os.urandom(image_bytes),
        "image_format": "JPEG",
        "width": 64,
        "height": 48,
        "boxes": [[1.0, 2.0, 30.0, 40.0]],
        "category_ids": [1],
        "category_names": ["widget"],
        "source": source,
        "key": key,
        "sha256": sha256_bytes(key.encode()),
    }


def pack(lake: str, fingerprint: str, split: str, rows: list[dict[str, Any]], target_bytes: int) -> list[dict]:
    """Pack `rows` into shards of about `target_bytes` in `<lake>/arrow_shards/<fingerprint>/shards/`,
    named by their content (the shard writer's names); returns their manifest entries."""
    with tempfile.TemporaryDirectory(prefix="pack-") as tmp:
        with ShardWriter(Path(tmp), split, target_bytes, categories=CATEGORIES) as writer:
            for row in rows:
                writer.write(row)
        for entry in writer.entries:
            write_bytes_atomic(
                join(lake, f"arrow_shards/{fingerprint}/{entry['path']}"), (Path(tmp) / entry["path"]).read_bytes()
            )
    return writer.entries


def kept(entries: list[dict], packed_in: str) -> list[dict]:
    """The entries of shards packed in output `packed_in`, as a later output lists them: `../<fp>/shards/...`."""
    return [{**e, "path": f"../{packed_in}/{e['path']}"} if e["path"].startswith("shards/") else e for e in entries]


def write_manifest(lake: str, fingerprint: str, entries: list[dict], masked: dict[str, list[str]] | None = None) -> str:
    """`masked.parquet` (shard path, key of every masked row) and `manifest.json` last; returns the output's uri."""
    uri = join(lake, f"arrow_shards/{fingerprint}")
    masked = masked or {}
    table = pa.table(
        {
            "path": pa.array([path for path, keys in masked.items() for _ in keys], pa.string()),
            "key": pa.array([key for keys in masked.values() for key in keys], pa.string()),
        }
    )
    sink = io.BytesIO()
    pq.write_table(table, sink)
    masked_bytes = sink.getvalue()
    write_bytes_atomic(join(uri, MASKED), masked_bytes)
    listed = [{**e, "masked": len(masked.get(e["path"], []))} for e in entries]
    rows = {split: sum(e["rows"] - e["masked"] for e in listed if e["split"] == split) for split in ("train", "val")}
    manifest = {
        "format": FORMAT,
        "categories": CATEGORIES,
        "shards": listed,
        "rows": rows,
        "masked_rows": sum(e["masked"] for e in listed),
        "selection": {"uri": join(lake, "training_set/0123456789abcdef"), "data_version": "s" * 64},
        "config": {"target_shard_bytes": 1 << 20, "image_encoding": "original"},
        "files": {MASKED: {"bytes": len(masked_bytes), "sha256": sha256_bytes(masked_bytes)}},
    }
    write_bytes_atomic(join(uri, "manifest.json"), json.dumps(manifest, indent=1).encode())
    return uri
