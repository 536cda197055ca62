"""Many small JPEGs in one source of a raw root, fast: the per-file overhead benchmarks' input.

A few photo-like pictures are encoded once (`images.photo_jpeg`); every file is one of them with its
own JPEG comment (`images.unique_copy`), so each file has its own bytes and sha256 for the cost of a
write, and decodes exactly like its picture. Each image gets one box in a COCO annotations.json.
`small_source` keeps a raw root of one such source in the benchmark cache, made once.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path

from PIL import Image

from .images import CACHE, photo_jpeg, unique_copy

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
    written, sizes = [], [Image.open(io.BytesIO(picture)).size for picture in pictures]
    for n in range(start, start + count):
        name = f"lot_{n // IMAGES_PER_LOT:04d}/img_{n:06d}.jpg"
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        data = unique_copy(pictures[n % len(pictures)], f"{source} image {n}")
        path.write_bytes(data)
        written.append((path, len(data)))
        image_id = len(coco["images"]) + 1
        width, height = sizes[n % len(pictures)]
        coco["images"].append({"id": image_id, "file_name": name, "width": width, "height": height})
        coco["annotations"].append({"id": image_id, "image_id": image_id, "category_id": 1, "bbox": [10, 10, 120, 90]})
    annotations.write_text(json.dumps(coco))
    return written


def small_source(source: str, count: int, megapixels: float = SMALL_MEGAPIXELS) -> tuple[Path, list[tuple[Path, int]]]:
    """A cached raw root holding `source` with `count` images of `megapixels` (made on first use; never
    modify it: copy or link it, see `linked_source`): the root and each image's (path, size), in key order."""
    root = CACHE / f"small-{source}-{count}-{megapixels}"
    if not (root / ".complete").is_file():
        shutil.rmtree(root, ignore_errors=True)
        add_small_images(root, source, 0, count, small_pictures(megapixels))
        (root / ".complete").write_text("")
    files = sorted((root / source).rglob("*.jpg"))
    return root, [(path, path.stat().st_size) for path in files]


def linked_source(cached: Path, source: str, raw: Path) -> None:
    """`source` of the cached root `cached` under `raw`, to add images to: each image a hard link (no
    bytes copied; the same file, mtime and etag), annotations.json a copy, since adding images
    rewrites it. Needs `raw` on the cache's file system."""
    for image in sorted((cached / source).rglob("*.jpg")):
        target = raw / image.relative_to(cached)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.link(image, target)
    shutil.copyfile(cached / source / "annotations.json", raw / source / "annotations.json")
