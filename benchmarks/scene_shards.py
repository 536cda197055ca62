"""Demo-like shard sets for the training benchmarks and the demo-difficulty test: rendered industrial
scenes, written as the shard job writes them."""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from training_code.lib.raw_index_listing import group_of
from training_code.lib.shard_format import FORMAT, MANIFEST
from training_code.lib.shard_writer import ShardWriter
from training_code.lib.validation_outputs import split_of_group
from zero_assets.ops.demo_data import IMAGE_SIZES, demo_images, shuffle_labels
from zero_assets.ops.demo_scenes import CATEGORIES, render_scene

CATEGORY_LIST = [{"id": i + 1, "name": name} for i, name in enumerate(CATEGORIES)]


def scene_row(rng: np.random.Generator, key: str) -> dict:
    """One demo scene as a shard row; JPEG or PNG in the demo's 70/30 mix."""
    width, height = IMAGE_SIZES[int(rng.integers(len(IMAGE_SIZES)))]
    image, parts = render_scene(rng, width, height)
    return _row(image, parts, "JPEG" if rng.random() < 0.7 else "PNG", "bench", key)


def _row(image, parts, image_format: str, source: str, key: str) -> dict:
    width, height = image.size
    buffer = io.BytesIO()
    image.save(buffer, image_format, **({"quality": 90} if image_format == "JPEG" else {}))
    data = buffer.getvalue()
    ids = [CATEGORIES.index(p.category) + 1 for p in parts]
    return {
        "image": data,
        "image_format": image_format,
        "width": width,
        "height": height,
        "boxes": [list(p.box) for p in parts],
        "category_ids": ids,
        "category_names": [p.category for p in parts],
        "source": source,
        "key": key,
        "sha256": hashlib.sha256(data).hexdigest(),
    }


def write_scene_shards(folder: Path, rows_by_split: dict[str, int], seed: int = 0, shard_bytes: int = 4 << 20) -> Path:
    """Render `rows` scenes per split into shards plus a manifest under `folder`; returns `folder`."""
    rng = np.random.default_rng(seed)  # one stream across the splits, drawn in their order (the rows are lazy)
    return write_shard_set(
        folder, {split: _scenes(rng, split, rows) for split, rows in rows_by_split.items()}, shard_bytes
    )


def _scenes(rng: np.random.Generator, split: str, rows: int) -> Iterator[dict]:
    for index in range(rows):
        yield scene_row(rng, f"{split}/{index:05d}")


def write_shard_set(folder: Path, rows_by_split: dict[str, Iterable[dict]], shard_bytes: int) -> Path:
    """Each split's rows into shards plus the manifest under `folder`, as the shard job lays them out;
    returns `folder`."""
    entries = []
    for split, rows in rows_by_split.items():
        with ShardWriter(folder, split, shard_bytes, categories=CATEGORY_LIST) as writer:
            for row in rows:
                writer.write(row)
        entries += writer.entries
    (folder / MANIFEST).write_text(json.dumps({"format": FORMAT, "categories": CATEGORY_LIST, "shards": entries}))
    return folder


def write_demo_shards(
    folder: Path,
    images: int = 240,
    seed: int = 0,
    shuffled_labels: bool = False,
    split_seed: int = 0,
    val_fraction: float = 0.2,
    shard_bytes: int = 4 << 20,
) -> Path:
    """The good images of `make-demo-data --images N --seed S [--shuffle-labels]` as shards, split by lot
    as validated_images splits them (its defaults), without running the graph; returns `folder`.

    The graph's output differs only by the planted bad cases (one duplicate image fewer, one stray box
    dropped), so scores on these shards are the demo's to within a point or two."""
    drawn = demo_images(images, np.random.default_rng(seed))
    rows: dict[str, list[dict]] = {"train": [], "val": []}
    for image in shuffle_labels(drawn, seed) if shuffled_labels else drawn:
        key = f"{image.source}/{image.name}"
        rows[split_of_group(group_of(key), split_seed, val_fraction)].append(
            _row(image.scene, image.parts, image.fmt, image.source, key)
        )
    return write_shard_set(folder, rows, shard_bytes)
