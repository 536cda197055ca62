"""What goes into one shard row: the image bytes (as stored, or resized and re-encoded) and its labels.

Labels are a pure function of the selected row and the encoding (a resized size is computed), so whether
an earlier shard's row still stands is a `label_digest` comparison. `sha256` is always the raw file's.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from .hashing import sha256_json
from .image_encoding import Encoding, resized_size

# The selected row's columns a shard row's labels are made of (the encoding is fixed per shard set).
LABEL_SOURCES = ("format", "width", "height", "orientation", "boxes", "category_names")


def label_digests(selected: pa.Table) -> list[str]:
    """`label_digest` of each row of a selection table, in its order."""
    columns = selected.select(list(LABEL_SOURCES)).to_pydict()
    return [sha256_json(values)[:16] for values in zip(*columns.values())]


def shard_labels(row: dict[str, Any], category_id: dict[str, int], encoding: Encoding) -> dict[str, Any]:
    """Every shard column but `image` for one selected row (training_set.SELECTION_SCHEMA as a dict)."""
    width, height = int(row["width"]), int(row["height"])
    boxes = [[float(v) for v in box] for box in row["boxes"]]
    image_format = row["format"]
    if encoding.mode == "resize":
        new_width, new_height = resized_size(width, height, encoding.max_side)
        sx, sy = new_width / width, new_height / height
        boxes = [[x1 * sx, y1 * sy, x2 * sx, y2 * sy] for x1, y1, x2, y2 in boxes]
        width, height, image_format = new_width, new_height, "JPEG"
    return {
        "image_format": image_format,
        "width": width,
        "height": height,
        "boxes": boxes,
        "category_ids": [category_id[name] for name in row["category_names"]],
        "category_names": list(row["category_names"]),
        "source": row["source"],
        "key": row["key"],
        "sha256": row["sha256"],
    }
