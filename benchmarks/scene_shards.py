"""Demo-like shard sets for the training benchmarks: rendered industrial scenes, written as the shard job writes them."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import numpy as np

from training_code.lib.shard_format import FORMAT, MANIFEST
from training_code.lib.shard_writer import ShardWriter
from zero_assets.demo_data import CATEGORIES, IMAGE_SIZES, render_scene

CATEGORY_LIST = [{"id": i + 1, "name": name} for i, name in enumerate(CATEGORIES)]


def scene_row(rng: np.random.Generator, key: str) -> dict:
    """One demo scene as a shard row; JPEG or PNG in the demo's 70/30 mix."""
    width, height = IMAGE_SIZES[int(rng.integers(len(IMAGE_SIZES)))]
    image, parts = render_scene(rng, width, height)
    image_format = "JPEG" if rng.random() < 0.7 else "PNG"
    buffer = io.BytesIO()
    image.save(buffer, image_format, **({"quality": 90} if image_format == "JPEG" else {}))
    data = buffer.getvalue()
    ids = [CATEGORIES.index(p.category) + 1 for p in parts]
    return {"image": data, "image_format": image_format, "width": width, "height": height,
            "boxes": [list(p.box) for p in parts], "category_ids": ids, "category_names": [p.category for p in parts],
            "source": "bench", "key": key, "sha256": hashlib.sha256(data).hexdigest()}


def write_scene_shards(folder: Path, rows_by_split: dict[str, int], seed: int = 0, shard_bytes: int = 4 << 20) -> Path:
    """Render `rows` scenes per split into shards plus a manifest under `folder`; returns `folder`."""
    rng = np.random.default_rng(seed)
    entries = []
    for split, rows in rows_by_split.items():
        with ShardWriter(folder, split, shard_bytes, categories=CATEGORY_LIST) as writer:
            for index in range(rows):
                writer.write(scene_row(rng, f"{split}/{index:05d}"))
        entries += writer.entries
    (folder / MANIFEST).write_text(json.dumps({"format": FORMAT, "categories": CATEGORY_LIST, "shards": entries}))
    return folder
