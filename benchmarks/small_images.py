"""Many small JPEGs in one source of a raw root, fast: the per-file overhead benchmarks' input.

A few photo-like pictures are encoded once (`images.photo_jpeg`); every file is one of them with its
own JPEG comment (`images.unique_copy`), so each file has its own bytes and sha256 for the cost of a
write, and decodes exactly like its picture. Each image gets one box in a COCO annotations.json.
"""

from __future__ import annotations

import json
from pathlib import Path

from .images import photo_jpeg, unique_copy

# About 260x190 pixels and 17 KB: a strict decode and the checks take about 0.5 ms.
SMALL_MEGAPIXELS = 0.05
PICTURES = 8
IMAGES_PER_LOT = 50


def small_pictures(megapixels: float = SMALL_MEGAPIXELS) -> list[bytes]:
    return [photo_jpeg(seed=7_000 + n, megapixels=megapixels) for n in range(PICTURES)]


def add_small_images(
    raw: Path, source: str, start: int, count: int, pictures: list[bytes] | None = None
) -> list[tuple[Path, int]]:
    """Images `start` .. `start + count - 1` of `source` under `raw` (lots of 50, one box each), appended
    to its annotations.json; returns each new file's (path, size)."""
    pictures = pictures or small_pictures()
    folder = raw / source
    annotations = folder / "annotations.json"
    coco = (
        json.loads(annotations.read_text())
        if annotations.is_file()
        else {"images": [], "annotations": [], "categories": [{"id": 1, "name": "part"}]}
    )
    written = []
    for n in range(start, start + count):
        name = f"lot_{n // IMAGES_PER_LOT:04d}/img_{n:06d}.jpg"
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        data = unique_copy(pictures[n % len(pictures)], f"{source} image {n}")
        path.write_bytes(data)
        written.append((path, len(data)))
        image_id = len(coco["images"]) + 1
        coco["images"].append({"id": image_id, "file_name": name, "width": 258, "height": 193})
        coco["annotations"].append({"id": image_id, "image_id": image_id, "category_id": 1, "bbox": [10, 10, 120, 90]})
    annotations.write_text(json.dumps(coco))
    return written
