"""A validated set over the cached benchmark photos, in the layout the shard job reads."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from training_code.lib.hashing import sha256_bytes
from training_code.lib.tables import ACCEPTED, write_table
from training_code.lib.validation_pass import MANIFEST_FORMAT


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
    """`rows` (ACCEPTED columns, every box a "part") as a validated folder under `out`; returns `out`."""
    write_table(pd.DataFrame(rows), ACCEPTED, out / "accepted.parquet")
    (out / "categories.json").write_text(json.dumps([{"id": 1, "name": "part"}]))
    (out / "manifest.json").write_text(json.dumps({"format": MANIFEST_FORMAT}))
    return out
