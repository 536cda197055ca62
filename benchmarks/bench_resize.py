"""`resize`: the shard job in resize mode against a bare Pillow draft+resize+encode loop, same process count."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import tempfile
from pathlib import Path

from training_code.lib.image_encoding import Encoding
from training_code.shard import build_shards

from .bare_workers import bare_resize
from .images import best_of, photo_set
from .report import BenchResult
from .shard_inputs import validated_folder

IMAGES, RUNS, MAX_SIDE = 64, 2, 1024


def run() -> list[BenchResult]:
    photos = photo_set(IMAGES)
    raw = photos[0][0].parent.parent
    workers = os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="bench-resize-") as tmp:
        work = Path(tmp)
        validated = validated_folder(photos, raw, work / "validated")

        def baseline() -> None:
            with multiprocessing.get_context("forkserver").Pool(workers) as pool:
                list(pool.imap(bare_resize, [(str(path), MAX_SIDE) for path, _, _ in photos]))

        def project() -> None:
            shutil.rmtree(work / "shards", ignore_errors=True)
            build_shards(
                validated, raw, work / "shards", 1_000_000_000, Encoding("resize", MAX_SIDE, 90), workers=workers
            )

        baseline()
        baseline_s, project_s = best_of(RUNS, baseline), best_of(RUNS, project)
    return [
        BenchResult(
            "resize",
            baseline_s / project_s,
            ">=0.8",
            {
                "baseline_s": baseline_s,
                "project_s": project_s,
                "images": len(photos),
                "workers": workers,
                "max_side": MAX_SIDE,
            },
        )
    ]
