"""`incremental`: validating after 1% new images arrive in a 10,000-image root, against the full pass.

Both runs are the project's own `validate` with the same workers; the incremental one gets the full
run's output as --previous. Goal: at most a tenth of the full time.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from training_code.lib.validation_pass import validate
from training_code.validate import get_args_parser

from .images import photo_jpeg, unique_copy
from .raw_index_inputs import index_folder
from .report import BenchResult

IMAGES, SOURCES, ADDED_FRACTION = 10_000, 10, 0.01


def _write_images(raw: Path, base: bytes, start: int, count: int) -> None:
    by_source: dict[int, list[str]] = {}
    for n in range(start, start + count):
        source, name = n % SOURCES, f"lot_{n // 250:03d}/img_{n:05d}.jpg"
        path = raw / f"src_{source}" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(unique_copy(base, f"image {n}"))
        by_source.setdefault(source, []).append(name)
    for source in range(SOURCES):
        file = raw / f"src_{source}" / "annotations.json"
        coco = (
            json.loads(file.read_text())
            if file.is_file()
            else {"images": [], "annotations": [], "categories": [{"id": 1, "name": "part"}]}
        )
        for name in by_source.get(source, []):
            image_id = len(coco["images"]) + 1
            coco["images"].append({"id": image_id, "file_name": name})
            coco["annotations"].append(
                {"id": image_id, "image_id": image_id, "category_id": 1, "bbox": [10, 10, 40, 30]}
            )
        file.write_text(json.dumps(coco))


def _validate(raw: Path, work: Path, out: str, previous: Path | None) -> tuple[float, dict]:
    index_dir = index_folder(raw, work / f"sources-{out}", work / f"index-{out}")
    arguments = [
        "--index",
        str(index_dir),
        "--raw",
        str(raw),
        "--out",
        str(work / out),
        "--workers",
        str(os.cpu_count() or 1),
    ]
    args: argparse.Namespace = get_args_parser().parse_args(
        arguments + (["--previous", str(previous)] if previous else [])
    )
    started = time.perf_counter()
    _, _, counts, _ = validate(args)
    return time.perf_counter() - started, counts


def run() -> list[BenchResult]:
    # 0.3 MP, the low end of the realistic range: unique copies of one photo keep the root quick to make
    base = photo_jpeg(seed=1, megapixels=0.3)
    with tempfile.TemporaryDirectory(prefix="bench-incremental-") as tmp:
        work, raw = Path(tmp), Path(tmp) / "raw"
        _write_images(raw, base, 0, IMAGES)
        full_s, _ = _validate(raw, work, "full", None)
        added = int(IMAGES * ADDED_FRACTION)
        _write_images(raw, base, IMAGES, added)
        incremental_s, counts = _validate(raw, work, "incremental", work / "full")
    if counts["decoded"] != added:
        raise AssertionError(
            f"the incremental run decoded {counts['decoded']} images, expected only the {added} new ones"
        )
    return [
        BenchResult(
            "incremental",
            incremental_s / full_s,
            "<=0.1",
            {"full_s": full_s, "incremental_s": incremental_s, "images": IMAGES, "added": added, **counts},
        )
    ]
