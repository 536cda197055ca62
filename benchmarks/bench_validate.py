"""`validate`: the project's validation pass against a bare `verify()` + `load()` loop, same process count.

ratio = bare loop seconds / project seconds on the same realistic JPEGs (0.3-5 MP), both with
os.cpu_count() processes, pool start included; goal >= 1.5. The project also hashes, applies EXIF
orientation, checks labels and writes its tables, and decodes each JPEG strictly (libjpeg-turbo with
corrupt-data warnings as errors, at 1/8 scale: `training_code/lib/jpeg_strict.py`), which is where
it wins. Its run must accept every image, so a pass that skipped the decode could not win.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
from pathlib import Path

from training_code.lib.validation_pass import validate
from training_code.validate import get_args_parser
from zero_assets.defs.change_detection.raw_sources import list_sources

from .bare_workers import bare_check
from .images import best_of_interleaved, photo_set
from .raw_index_inputs import index_folder
from .report import BenchResult

IMAGES, RUNS = 96, 3


def run() -> list[BenchResult]:
    photos = photo_set(IMAGES)
    raw = photos[0][0].parent.parent
    workers = os.cpu_count() or 1
    paths = [str(path) for path, _, _ in photos]

    def baseline() -> None:
        with multiprocessing.get_context("forkserver").Pool(workers) as pool:
            list(pool.imap_unordered(bare_check, paths))

    with tempfile.TemporaryDirectory(prefix="bench-validate-") as tmp:
        # The raw root here is the cache folder itself: one source per lot folder is enough for the pass.
        index_folder(raw, Path(tmp) / "sources", Path(tmp) / "index")
        args = get_args_parser().parse_args(
            [
                "--index",
                str(Path(tmp) / "index"),
                "--raw",
                str(raw),
                "--out",
                str(Path(tmp) / "out"),
                "--workers",
                str(workers),
                # The photos carry no labels: each lot folder is a source configured unlabelled.
                "--unlabelled-sources",
                ",".join(list_sources(str(raw))),
            ]
        )
        # Warm-up, project first: it starts the shared forkserver with its preloads, as the validation job
        # does in its own fresh process; after that both sides pay only for their pools, and the page cache is warm.
        counts = validate(args)[0]["counts"]
        if counts["accepted"] != len(photos):
            raise RuntimeError(f"the project accepted {counts['accepted']} of {len(photos)} intact photos: {counts}")
        baseline()
        baseline_s, project_s = best_of_interleaved(RUNS, baseline, lambda: validate(args))
    megapixels = sum(w * h for _, w, h in photos) / 1e6
    return [
        BenchResult(
            "validate",
            baseline_s / project_s,
            ">=1.5",
            {
                "baseline_s": baseline_s,
                "project_s": project_s,
                "images": len(photos),
                "megapixels": megapixels,
                "workers": workers,
            },
        )
    ]
