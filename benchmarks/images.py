"""Realistic test images for the benchmarks: photographic-looking JPEGs of 0.3-5 megapixels, cached on disk.

Smooth structure plus sensor-like noise compresses like a photo (about 1-3 bits per pixel), so
decode and encode costs are those of real camera frames, not of flat synthetic tiles.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

CACHE = Path(os.environ.get("ZERO_BENCH_CACHE", Path(tempfile.gettempdir()) / "zero-bench-images"))
MEGAPIXELS = (0.3, 5.0)


def photo_jpeg(seed: int, megapixels: float, quality: int = 90) -> bytes:
    rng = np.random.default_rng(seed)
    width = int((megapixels * 1e6 * 4 / 3) ** 0.5)
    height = int(width * 3 / 4)
    coarse = rng.integers(0, 255, (height // 64 + 2, width // 64 + 2, 3), dtype=np.uint8)
    smooth = np.asarray(Image.fromarray(coarse).resize((width, height), Image.Resampling.BICUBIC), dtype=np.int16)
    noise = rng.normal(0, 6, (height, width, 1)).astype(np.int16)
    pixels = np.clip(smooth + noise, 0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=quality)
    return buffer.getvalue()


def photo_set(count: int, seed: int = 0) -> list[tuple[Path, int, int]]:
    """`count` JPEGs with sizes spread evenly over 0.3-5 MP: (path, width, height), made once and cached."""
    folder = CACHE / hashlib.sha256(json.dumps([count, seed, MEGAPIXELS]).encode()).hexdigest()[:12]
    spec = folder / "spec.json"
    if not spec.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        rows = []
        for n in range(count):
            megapixels = MEGAPIXELS[0] + (MEGAPIXELS[1] - MEGAPIXELS[0]) * n / max(1, count - 1)
            path = folder / f"lot_{n % 8}" / f"photo_{n:04d}.jpg"
            path.parent.mkdir(exist_ok=True)
            path.write_bytes(photo_jpeg(seed * 100_000 + n, megapixels))
            with Image.open(path) as image:
                rows.append([str(path.relative_to(folder)), image.width, image.height])
        spec.write_text(json.dumps(rows))
    return [(folder / key, width, height) for key, width, height in json.loads(spec.read_text())]


def unique_copy(jpeg: bytes, tag: str) -> bytes:
    """The same picture with a distinct JPEG comment: new bytes and sha256, identical decode cost."""
    comment = tag.encode()
    return jpeg[:2] + b"\xff\xfe" + (len(comment) + 2).to_bytes(2, "big") + comment + jpeg[2:]


def best_of_interleaved(runs: int, *functions) -> list[float]:
    """The fastest of `runs` timings of each function, run in turn (a, b, a, b, ...), so a stretch of
    load on the machine slows both sides, not only the one that happened to be running."""
    best = [float("inf")] * len(functions)
    for _ in range(runs):
        for position, function in enumerate(functions):
            best[position] = min(best[position], best_of(1, function))
    return best


def best_of(runs: int, function) -> float:
    """The fastest of `runs` timings: the least disturbed by other work on a shared machine."""
    import time

    timings = []
    for _ in range(runs):
        started = time.perf_counter()
        function()
        timings.append(time.perf_counter() - started)
    return min(timings)
