"""Detection samples from verified Arrow shards: the split's shards checked against their manifest,
a stored row decoded into an upright picture and its boxes, and the ordered evaluation pass.

The training stream that mixes and augments these samples is `detection_data`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from torchvision.transforms.v2 import functional as F

from . import shard_format, training_set

# What a corrupt image can raise from PIL: truncated data (OSError), unknown format
# (UnidentifiedImageError is an OSError), broken PNG chunks (SyntaxError), oversized images.
DECODE_ERRORS = (OSError, ValueError, SyntaxError, Image.DecompressionBombError)
_LABEL_COLUMNS = ["width", "height", "boxes", "category_ids", "key"]


@dataclass(frozen=True)
class ShardRef:
    path: Path
    rows: int
    # In a training set: this source's category id -> the shared vocabulary's id, and the keys to skip.
    label_map: dict[int, int] | None = field(default=None, compare=False)
    excluded: frozenset[str] = field(default=frozenset(), compare=False)
    # The source the shard's rows come from ("" in a plain shard set): the reader opens lanes per source.
    source: str = field(default="", compare=False)


class BadSampleError(ValueError):
    """A stored sample that cannot become a training example (undecodable, or not the size recorded)."""


def verified_split(
    folder: Path, split: str, rank: int = 0, world_size: int = 1, training_set_dir: str | None = None
) -> tuple[dict[str, Any], list[ShardRef]]:
    """The manifest and the split's shards, after checking them against the manifest.

    `folder` holds a shard set, or a training set (one shard set per source and the training-set
    manifest, see `training_set`): then the manifest returned carries the shared vocabulary, and each
    shard its label map and excluded keys. Every rank checks sizes and row counts (cheap); the sha256
    pass is divided among ranks by stride so each shard is hashed once per job. Any mismatch raises
    `ShardIntegrityError` and ends the job.

    With `training_set_dir` (a folder inside `folder`, as on SageMaker, where the channel is the shard
    root holding every source's shard sets) the training-set manifest is read there, and each source's
    `folder` is relative to `folder`, the channel root.
    """
    shards_root = Path(folder)  # where a training set's source folders are, below
    if training_set_dir is not None:
        inner = Path(training_set_dir)
        if inner.is_absolute() or ".." in inner.parts:
            raise ValueError(
                f"training set {training_set_dir!r} must be a folder inside the channel {folder}, without '..'"
            )
        folder = shards_root / inner
    chosen = training_set.read_training_set(folder)
    if chosen is None and training_set_dir is not None:  # never fall back to a shard set there
        raise FileNotFoundError(
            f"{folder}/{training_set.MANIFEST}: no training-set manifest there; warm the training set again"
        )
    if chosen is None:
        manifest = shard_format.read_manifest(folder)
        located = [
            (Path(folder), entry, None, frozenset(), "") for entry in shard_format.shards_for_split(manifest, split)
        ]
    else:
        manifest, excluded = chosen, training_set.excluded_keys(folder)
        located = [
            (
                shards_root / source["folder"],
                entry,
                training_set.label_map(source["categories"], chosen["categories"]),
                excluded.get(source["source"], frozenset()),
                source["source"],
            )
            for source in chosen["sources"]
            for entry in shard_format.shards_for_split(source, split)
        ]
    if not located:
        raise FileNotFoundError(f"{folder}/{shard_format.MANIFEST} lists no shards for split {split!r}")
    for index, (where, entry, _, _, _) in enumerate(located):
        shard_format.verify_shard(where, entry, check_sha256=index % world_size == rank)
    return manifest, [
        ShardRef(where / e["file"], int(e["rows"]), labels, skip, source) for where, e, labels, skip, source in located
    ]


class ShardRows:
    """One memory-mapped shard: image bytes read per row from the map, the small label columns read
    into Python once (per-row Arrow scalar access cost a tenth of a JPEG decode)."""

    def __init__(self, path: Path) -> None:
        self.table = shard_format.open_shard(path)
        self.images = shard_format.image_bytes(self.table)
        self.labels = self.table.select(_LABEL_COLUMNS).to_pydict()

    def record(self, row: int) -> dict[str, Any]:
        return {"image": self.images[row].as_py(), **{name: self.labels[name][row] for name in _LABEL_COLUMNS}}


def decode_sample(
    rows: ShardRows, row: int, min_box_side: float = 0.0, label_map: dict[int, int] | None = None
) -> tuple[Image.Image, dict[str, torch.Tensor], str]:
    """One row as (upright RGB picture, {"boxes" [N,4] float32 xyxy, "labels" [N] int64}, key).

    The picture stays a PIL image so a flip happens in Pillow before the one copy into a tensor: flipping
    the channels-first view that `pil_to_tensor` returns is a strided copy that cost a tenth of the decode.
    Boxes with a side under `min_box_side` are dropped (training passes 1, what SanitizeBoundingBoxes
    keeps; a flip keeps box sizes, so this is decided before augmentation); evaluation keeps every box.
    """
    record = rows.record(row)
    try:
        picture = shard_format.decode_upright(record["image"])
    except DECODE_ERRORS as error:
        raise BadSampleError(f"key {record['key']!r}: cannot decode image ({type(error).__name__}: {error})") from error
    if picture.size != (record["width"], record["height"]):
        raise BadSampleError(
            f"key {record['key']!r}: decoded {picture.size[0]}x{picture.size[1]}, "
            f"shard says {record['width']}x{record['height']}"
        )
    boxes, labels = record["boxes"], record["category_ids"]
    if label_map is not None:  # a training set: the source's ids become the shared vocabulary's
        labels = [label_map[label] for label in labels]
    if min_box_side > 0:
        kept = [i for i, (x1, y1, x2, y2) in enumerate(boxes) if x2 - x1 >= min_box_side and y2 - y1 >= min_box_side]
        boxes, labels = [boxes[i] for i in kept], [labels[i] for i in kept]
    target = {
        "boxes": torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4),
        "labels": torch.tensor(labels, dtype=torch.int64),
    }
    return picture, target, record["key"]


@dataclass(frozen=True)
class EvalSample:
    key: str
    width: int
    height: int
    image: torch.Tensor  # uint8 CHW, upright
    boxes: torch.Tensor  # [N, 4] xyxy absolute pixels
    labels: torch.Tensor  # [N] category ids


def iter_eval_samples(shards: list[ShardRef]) -> Iterator[EvalSample]:
    """Every sample in shard order, unaugmented. A sample that cannot be decoded fails the evaluation:
    scoring on a silently smaller set would not be comparable between checkpoints."""
    for shard in shards:
        table = ShardRows(shard.path)
        for row in range(table.table.num_rows):
            if shard.excluded and table.labels["key"][row] in shard.excluded:
                continue
            try:
                picture, target, key = decode_sample(table, row, label_map=shard.label_map)
            except BadSampleError as error:
                raise BadSampleError(f"{shard.path} row {row}: {error}") from error
            yield EvalSample(
                key, picture.width, picture.height, F.pil_to_tensor(picture), target["boxes"], target["labels"]
            )
