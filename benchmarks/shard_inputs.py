"""A training set (the selection) over the cached benchmark photos, in the layout the shard job reads."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from training_code.lib import training_set as ts
from training_code.lib.hashing import sha256_bytes


def validated_folder(photos: list[tuple[Path, int, int]], raw: Path, out: Path) -> Path:
    rows = []
    for n, (path, width, height) in enumerate(photos):
        key = path.relative_to(raw).as_posix()
        data = path.read_bytes()
        rows.append(
            {
                "source": key.split("/")[0],
                "key": key,
                "sha256": sha256_bytes(data),
                "size": len(data),
                "format": "JPEG",
                "mode": "RGB",
                "width": width,
                "height": height,
                "orientation": 1,
                "group": key.split("/")[0],
                "split": "val" if n % 5 == 0 else "train",
                "boxes": [[10.0, 20.0, 110.0, 90.0]],
                "category_names": ["part"],
            }
        )
    return write_validated(rows, out)


def write_validated(rows: list[dict], out: Path) -> Path:
    """`rows` (accepted-table columns, every box a "part") as a training set selecting all of them, under
    `out`; returns `out`."""
    table = pa.Table.from_pylist([{"etag": "bench", **row} for row in rows], schema=ts.SELECTION_SCHEMA)
    excluded = pa.Table.from_pylist([], schema=ts.EXCLUDED_SCHEMA)
    fields = {"sources": sorted({row["source"] for row in rows}), "policy": {}, "categories": ["part"]}
    ts.write_training_set(str(out), table.sort_by([("source", "ascending"), ("key", "ascending")]), excluded, fields)
    return out
