"""Training-set folders (the selection, `zero-selection/1`) written for tests of what reads them: the
shard job and its incremental rules, without running validation and the selection in Dagster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from training_code.lib import training_set as ts


def write_selection(folder: Path, rows: list[dict[str, Any]], categories: list[str]) -> Path:
    """`rows` (accepted-table rows: source, key, sha256, size, format, mode, width, height, orientation,
    group, split, boxes, category_names; an `etag` is added where missing) as the training set at
    `folder`, with `categories` as its selected category names; returns `folder`."""
    table = pa.Table.from_pylist([{"etag": "test", **row} for row in rows], schema=ts.SELECTION_SCHEMA)
    excluded = pa.Table.from_pylist([], schema=ts.EXCLUDED_SCHEMA)
    fields = {"sources": sorted({row["source"] for row in rows}), "policy": {}, "categories": sorted(categories)}
    ts.write_training_set(str(folder), table.sort_by([("source", "ascending"), ("key", "ascending")]), excluded, fields)
    return Path(folder)
