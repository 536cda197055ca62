"""The baselines' per-file work, in a module that imports only Pillow, so baseline pool workers start as
cheaply as possible (a worker imports the module its function lives in)."""

from __future__ import annotations

import io

from PIL import Image


def bare_check(path: str) -> tuple[int, int]:
    """verify() then a full load(), each on a freshly opened file."""
    with Image.open(path) as image:
        image.verify()
    with Image.open(path) as image:
        image.load()
        return image.size


def bare_resize(task: tuple[str, int]) -> int:
    """draft + resize to a longest side of `max_side` + JPEG encode."""
    path, max_side = task
    with Image.open(path) as image:
        scale = min(1.0, max_side / max(image.size))
        target = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
        image.draft("RGB", target)
        small = image.resize(target, Image.Resampling.BILINEAR)
    buffer = io.BytesIO()
    small.save(buffer, "JPEG", quality=90)
    return len(buffer.getvalue())
