"""Synthetic validated sets, as many accepted rows as a benchmark asks: the selection's input at scale.

Each source is a validated_images output folder (accepted.parquet, verdicts.parquet, categories.json,
manifest.json last) of generated rows: 0-3 boxes of three categories, one split group per lot of 500,
a tenth of the lots in val, random perceptual hashes, and one image in a thousand an exact copy of an
image of the source before it. Made once per (rows, sources) in the benchmark cache.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from training_code.lib.hashing import sha256_file
from training_code.lib.storage import write_bytes_atomic

from .images import CACHE

CATEGORIES = ("bolt", "nut", "gear")
LOT = 500


def accepted_lake(rows: int, sources: int, seed: int = 0) -> list[dict[str, str]]:
    """The validated sets of `sources` sources holding `rows` accepted images in all, made once: each
    source's plan entry (source, validated_uri, data_version)."""
    root = CACHE / f"accepted-{rows}-{sources}-{seed}"
    names = [f"src_{n:04d}" for n in range(sources)]
    if not all((root / name / "manifest.json").is_file() for name in names):
        rng = np.random.default_rng(seed)
        previous = None
        for n, name in enumerate(names):
            previous = _write_source(root / name, name, rows // sources + (n < rows % sources), rng, previous)
    return [{"source": name, "validated_uri": str(root / name), "data_version": name} for name in names]


def accepted_table(source: str, count: int, rng: np.random.Generator, copied: pa.Array | None = None) -> pa.Table:
    """`count` accepted rows of `source`; the first of every thousand copies a sha256 of `copied`."""
    boxes_per_image = rng.integers(0, 4, count)
    offsets = pa.array(np.concatenate([[0], np.cumsum(boxes_per_image)]).astype(np.int32))
    total = int(boxes_per_image.sum())
    corners = rng.random((total, 2)) * 200
    flat = np.concatenate([corners, corners + 1 + rng.random((total, 2)) * 100], axis=1).reshape(-1)
    box = pa.FixedSizeListArray.from_arrays(pa.array(flat), 4).cast(pa.list_(pa.float64()))
    names = np.array(CATEGORIES)[rng.integers(0, len(CATEGORIES), total)]
    keys = np.char.add(f"{source}/lot_", np.char.add((np.arange(count) // LOT).astype(str), "/"))
    keys = np.char.add(keys, np.char.add(np.arange(count).astype(str), ".jpg"))
    digests = rng.integers(0, 2**63, (count, 4), dtype=np.int64).view(np.uint64)
    sha256 = pa.array([f"{a:016x}{b:016x}{c:016x}{d:016x}" for a, b, c, d in digests.tolist()])
    if copied is not None and len(copied):
        at = np.arange(0, count, 1000)
        sha256 = pa.array(np.where(np.isin(np.arange(count), at), _spread(copied, count), sha256.to_numpy(False)))
    lots = np.arange(count) // LOT
    hashes = rng.integers(-(2**63), 2**63 - 1, (count * 3,), dtype=np.int64)
    dhashes = rng.integers(-(2**63), 2**63 - 1, (count * 3,), dtype=np.int64)
    three = pa.array(np.arange(0, count * 3 + 1, 3, dtype=np.int32))
    return pa.table(
        {
            "source": pa.array([source] * count),
            "key": pa.array(keys),
            "sha256": sha256,
            "size": pa.array(rng.integers(5_000, 500_000, count)),
            "format": pa.array(["JPEG"] * count),
            "mode": pa.array(["RGB"] * count),
            "width": pa.array(np.full(count, 640)),
            "height": pa.array(np.full(count, 480)),
            "orientation": pa.array(np.ones(count, dtype=np.int64)),
            "group": pa.array(np.char.add(f"{source}/lot_", lots.astype(str))),
            "split": pa.array(np.where(lots % 10 == 3, "val", "train")),
            "boxes": pa.ListArray.from_arrays(offsets, box),
            "category_names": pa.ListArray.from_arrays(offsets, pa.array(names)),
            "annotation": pa.array(["annotated"] * count),
            "phash": pa.ListArray.from_arrays(three, pa.array(hashes)),
            "dhash": pa.ListArray.from_arrays(three, pa.array(dhashes)),
        }
    )


def _spread(copied: pa.Array, count: int) -> np.ndarray:
    values = copied.to_numpy(False)
    return np.resize(values, count)


def _write_source(folder: Path, source: str, count: int, rng: np.random.Generator, copied: pa.Array | None):
    folder.mkdir(parents=True, exist_ok=True)
    table = accepted_table(source, count, rng, copied)
    pq.write_table(table, folder / "accepted.parquet")
    verdicts = pa.table({"key": table.column("key"), "etag": pa.array(np.arange(count).astype(str))})
    pq.write_table(verdicts, folder / "verdicts.parquet")
    write_bytes_atomic(folder / "categories.json", json.dumps([{"name": n} for n in CATEGORIES]).encode())
    files = {name: sha256_file(folder / name) for name in ("accepted.parquet", "categories.json")}
    write_bytes_atomic(folder / "manifest.json", json.dumps({"format": "zero-validated/1", "files": files}).encode())
    return table.column("sha256").combine_chunks()
