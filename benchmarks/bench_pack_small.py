"""`pack_small`: packing 20,000 small images against a plain `pyarrow.ipc` stream of the same rows (goal >= 0.6).

ratio = baseline seconds / project seconds, files in the page cache. The project is, in this process,
the shard job's `build_shards` on a training set selecting all of them (one box each), 2 workers, as
`arrow_shards` runs it: the plan, each image's sha256 checked against what validation recorded, the
labels mapped to the manifest's category ids, shards hashed and named by their content, rows.parquet,
masked.parquet, the Hugging Face files and the manifest. The baseline, `benchmarks/plain_ipc_stream.py`
in a fresh process each round (timing its work, not its interpreter: see there why a process of its
own), reads the selection and the same files and writes the same rows (image struct, format, size,
boxes, category ids and names, source, key, sha256) as one IPC stream in batches of 64 rows. Small
files are where per-row work shows: each image is about 17 KB. Runs interleave and the best of each counts.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from training_code.lib.shard_format import MANIFEST
from training_code.shard import build_shards

from .report import BenchResult
from .scripts import run_script
from .shard_inputs import validated_folder
from .small_images import small_source

IMAGES, WORKERS, RUNS, SOURCE = 20_000, 2, 3, "cam"


def run() -> list[BenchResult]:
    with tempfile.TemporaryDirectory(prefix="bench-pack-small-") as tmp:
        work = Path(tmp)
        raw, written = small_source(SOURCE, IMAGES)
        photos = [(path, 258, 193) for path, _ in written]
        selection = validated_folder(photos, raw, work / "selection")

        plain = [sys.executable, "-m", "benchmarks.plain_ipc_stream", str(selection), str(raw), str(work / "plain")]

        def baseline() -> float:
            report = json.loads(run_script(plain, "the plain stream"))
            if report["rows"] != IMAGES:
                raise RuntimeError(f"the plain stream wrote {report['rows']} rows, not {IMAGES}")
            return report["seconds"]

        def project() -> float:
            shutil.rmtree(work / "shards", ignore_errors=True)
            started = time.perf_counter()
            manifest, _ = build_shards(selection, raw, work / "shards", 1_000_000_000, workers=WORKERS)
            elapsed = time.perf_counter() - started
            if sum(manifest["rows"].values()) != IMAGES or not (work / "shards" / MANIFEST).is_file():
                raise RuntimeError(f"the shard set holds {manifest['rows']} rows, not {IMAGES}")
            return elapsed

        timings = [(baseline(), project()) for _ in range(RUNS)]  # interleaved: load slows both sides
        baseline_s, project_s = (min(side) for side in zip(*timings))
        megabytes = sum(size for _, size in written) / 1e6
    return [
        BenchResult(
            "pack_small",
            baseline_s / project_s,
            ">=0.6",
            {
                "baseline_s": baseline_s,
                "project_s": project_s,
                "images": IMAGES,
                "MB": megabytes,
                "workers": WORKERS,
                "project_us_per_image": 1e6 * project_s / IMAGES,
            },
        )
    ]
