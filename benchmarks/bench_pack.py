"""`pack`: the shard job (original bytes, sha256 re-checked) against a plain pyarrow IPC write of the same bytes.

The runs interleave (baseline, project, ...) after one baseline warms the page cache; the best of each counts.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pyarrow as pa

from training_code.shard import build_shards

from .images import best_of_interleaved, photo_set
from .report import BenchResult
from .shard_inputs import validated_folder

IMAGES, COPIES, RUNS = 96, 4, 5


def linked_copies(photos: list[tuple[Path, int, int]], raw: Path, into: Path) -> list[tuple[Path, int, int]]:
    """Each photo under COPIES names (hard links): a few hundred MB to pack, for the cost of making 96 photos."""
    linked = []
    for copy in range(COPIES):
        for path, width, height in photos:
            target = into / f"copy_{copy}" / path.relative_to(raw)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.hardlink_to(path)
            linked.append((target, width, height))
    return linked


def run() -> list[BenchResult]:
    cached = photo_set(IMAGES)
    with tempfile.TemporaryDirectory(prefix="bench-pack-", dir=cached[0][0].parent.parent) as tmp:
        work = Path(tmp)
        raw = work / "raw"
        photos = linked_copies(cached, cached[0][0].parent.parent, raw)
        validated = validated_folder(photos, raw, work / "validated")

        def baseline() -> None:
            images = pa.array([path.read_bytes() for path, _, _ in photos], type=pa.large_binary())
            table = pa.table({"image": images, "key": [str(path) for path, _, _ in photos]})
            with pa.OSFile(str(work / "plain.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table, max_chunksize=64)

        def project() -> None:
            shutil.rmtree(work / "shards", ignore_errors=True)
            build_shards(validated, raw, work / "shards", 1_000_000_000, workers=2)

        baseline()
        baseline_s, project_s = best_of_interleaved(RUNS, baseline, project)  # a load burst slows both
        megabytes = sum(path.stat().st_size for path, _, _ in photos) / 1e6
    return [
        BenchResult(
            "pack",
            baseline_s / project_s,
            ">=0.8",
            {"baseline_s": baseline_s, "project_s": project_s, "images": len(photos), "MB": megabytes},
        )
    ]
