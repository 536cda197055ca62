"""`warm_refresh`: the bytes fsx_warm_state copies and verifies after 1% new images, against a full warm.

A selection of 10,000 images over ten sources is packed by the project's own shard job (about 50
shards), and warmed into an empty mount (the full warm: every shard copied and verified). Then 1% new
images join the selection; the shard job packs them with the first set as --previous (the earlier
shards kept by reference), and the same mount is warmed again. Both warms are the local backend's
(`backends/local/warm_state.py`), counted as the materialization reports them: copied_bytes +
verified_bytes. Goal: at most a tenth of the full warm's.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pyarrow as pa

from training_code.lib import training_set as ts
from training_code.lib.hashing import sha256_bytes
from training_code.lib.object_keys import local_etag
from training_code.shard import build_shards
from zero_assets.backends.local.warm_state import warm_shard_set

from .images import photo_jpeg, unique_copy
from .report import BenchResult

IMAGES, SOURCES, ADDED_FRACTION, SHARDS = 10_000, 10, 0.01, 50
FIRST, SECOND = "1111111111111111", "2222222222222222"


def _write_images(raw: Path, base: bytes, start: int, count: int) -> list[dict]:
    """`count` distinct JPEGs from image `start` on, spread over the sources; their selection rows."""
    rows = []
    for n in range(start, start + count):
        source = f"src_{n % SOURCES}"
        key = f"{source}/lot_{n // 500:03d}/img_{n:06d}.jpg"
        data = unique_copy(base, f"image {n}")
        path = raw / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        group = key.rpartition("/")[0]
        rows.append(
            {
                "source": source,
                "key": key,
                "sha256": sha256_bytes(data),
                "size": len(data),
                "etag": local_etag(path.stat()),
                "format": "JPEG",
                "mode": "RGB",
                "width": 160,
                "height": 120,
                "orientation": 1,
                "group": group,
                "split": "val" if (n // 500) % 5 == 4 else "train",
                "boxes": [[10.0, 10.0, 60.0, 50.0]],
                "category_names": ["part"],
            }
        )
    return rows


def _selection(folder: Path, rows: list[dict]) -> Path:
    """A training_set output selecting `rows`, sorted by (source, key) as the asset writes it."""
    rows = sorted(rows, key=lambda row: (row["source"], row["key"]))
    selected = pa.Table.from_pylist(rows, schema=ts.SELECTION_SCHEMA)
    sources = sorted({row["source"] for row in rows})
    fields = {"sources": [{"source": s} for s in sources], "policy": {}, "categories": ["part"]}
    ts.write_training_set(str(folder), selected, ts.EXCLUDED_SCHEMA.empty_table(), fields)
    return folder


def _warm(shards: Path, mount: Path, key: str) -> tuple[float, object]:
    started = time.perf_counter()
    result = warm_shard_set(str(shards), mount, key)
    return time.perf_counter() - started, result


def run() -> list[BenchResult]:
    base = photo_jpeg(seed=3, megapixels=0.02)  # small photos keep the set quick to make; bytes are what counts
    with tempfile.TemporaryDirectory(prefix="bench-warm-refresh-") as tmp:
        work, raw, mount = Path(tmp), Path(tmp) / "raw", Path(tmp) / "fsx"
        rows = _write_images(raw, base, 0, IMAGES)
        target = sum(row["size"] for row in rows) // SHARDS
        first = work / "lake" / "arrow_shards" / FIRST
        build_shards(_selection(work / "selection-1", rows), raw, first, target, workers=2)
        full_s, full = _warm(first, mount, FIRST)

        added = int(IMAGES * ADDED_FRACTION)
        rows += _write_images(raw, base, IMAGES, added)
        second = work / "lake" / "arrow_shards" / SECOND
        manifest, _ = build_shards(
            _selection(work / "selection-2", rows), raw, second, target, workers=2, previous=first, previous_name=FIRST
        )
        refresh_s, refresh = _warm(second, mount, SECOND)
    packed = [entry for entry in manifest["shards"] if entry["path"].startswith("shards/")]
    if refresh.copied != len(packed) or refresh.reused_verdicts != refresh.shards - len(packed):
        raise AssertionError(
            f"the refresh warm copied {refresh.copied} shards and trusted {refresh.reused_verdicts} on their verdicts; "
            f"the shard job packed {len(packed)} new ones of {refresh.shards}"
        )
    full_bytes = full.copied_bytes + full.verified_bytes
    refresh_bytes = refresh.copied_bytes + refresh.verified_bytes
    return [
        BenchResult(
            "warm_refresh",
            refresh_bytes / full_bytes,
            "<=0.1",
            {
                "full_bytes": full_bytes,
                "refresh_bytes": refresh_bytes,
                "shards": refresh.shards,
                "new_shards": len(packed),
                "reused_verdicts": refresh.reused_verdicts,
                "full_s": full_s,
                "refresh_s": refresh_s,
                "images": IMAGES,
                "added": added,
            },
        )
    ]
