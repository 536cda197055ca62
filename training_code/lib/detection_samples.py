"""Detection samples from verified Arrow shards: a split's shards checked against their manifest, a stored
row decoded into an upright picture and its boxes, and the ordered evaluation pass (training: `detection_data`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import torch
from PIL import Image
from torchvision.transforms.v2 import functional as F

from . import shard_format

# What a corrupt image can raise from PIL (UnidentifiedImageError is an OSError).
DECODE_ERRORS = (OSError, ValueError, SyntaxError, Image.DecompressionBombError)
_LABEL_COLUMNS = ["width", "height", "boxes", "category_ids", "key"]


@dataclass(frozen=True)
class ShardRef:
    path: Path
    rows: int  # the rows stored in it, masked ones included
    # Keys of its rows the manifest masks: read order counts them, samples skip them.
    masked: frozenset[str] = field(default=frozenset(), compare=False)
    # The source of more than half its rows, "" when none is: read_order gives such a source lanes of its own.
    source: str = field(default="", compare=False)

    @property
    def live_rows(self) -> int:
        return self.rows - len(self.masked)


class BadSampleError(ValueError):
    """A stored sample that cannot become a training example (undecodable, or not the size recorded)."""


def verified_split(
    folder: Path, split: str, rank: int = 0, world_size: int = 1, training_set_dir: str | None = None
) -> tuple[dict[str, Any], list[ShardRef]]:
    """The shard-set manifest (zero-shards/4) and the split's shards, checked against it (else
    `ShardIntegrityError`); the sha256 checks are divided among ranks by stride. Shards stay inside the root:
    the channel `folder` with `training_set_dir` (the manifest's folder in it), else two folders above the manifest."""
    folder, root = shard_format.set_in_channel(folder, training_set_dir)
    manifest = shard_format.read_manifest(folder)
    masked = shard_format.masked_keys(folder, manifest)
    entries = shard_format.shards_for_split(manifest, split)
    if not entries:
        raise FileNotFoundError(f"{folder}/{shard_format.MANIFEST} lists no shards for split {split!r}")
    located = [(shard_format.shard_path(folder, entry, root), entry) for entry in entries]
    for index, (path, entry) in enumerate(located):
        shard_format.verify_shard_file(path, entry, check_sha256=index % world_size == rank)
    return manifest, [
        ShardRef(path, int(e["rows"]), masked.get(e["path"], frozenset()), shard_source(path)) for path, e in located
    ]


def shard_source(path: Path) -> str:
    """The source of more than half the shard's rows, else "", from its small `source` column."""
    counts = pc.value_counts(shard_format.open_shard(path).column("source")).to_pylist()
    top = max(counts, key=lambda entry: entry["counts"], default=None)
    return top["values"] if top and 2 * top["counts"] > sum(entry["counts"] for entry in counts) else ""


class ShardRows:
    """One memory-mapped shard: image bytes read per row, label columns converted to Python a chunk of rows at
    a time when first needed (per-row Arrow scalar access is slow)."""

    CHUNK_ROWS = 256

    def __init__(self, path: Path) -> None:
        self.table = shard_format.open_shard(path)
        self.images = shard_format.image_bytes(self.table)
        self._labels = self.table.select(_LABEL_COLUMNS)
        self._chunks: dict[int, dict[str, list[Any]]] = {}

    def _chunk(self, row: int) -> tuple[dict[str, list[Any]], int]:
        """The converted chunk holding `row`, and the row's place in it."""
        index, offset = divmod(row, self.CHUNK_ROWS)
        if index not in self._chunks:
            self._chunks[index] = self._labels.slice(index * self.CHUNK_ROWS, self.CHUNK_ROWS).to_pydict()
        return self._chunks[index], offset

    def key(self, row: int) -> str:
        chunk, offset = self._chunk(row)
        return chunk["key"][offset]

    def record(self, row: int) -> dict[str, Any]:
        chunk, offset = self._chunk(row)
        return {"image": self.images[row].as_py(), **{name: chunk[name][offset] for name in _LABEL_COLUMNS}}


def decode_sample(
    rows: ShardRows, row: int, min_box_side: float = 0.0
) -> tuple[Image.Image, dict[str, torch.Tensor], str]:
    """One row as (upright RGB PIL picture, {"boxes" [N,4] float32 xyxy, "labels" [N] int64}, key); boxes
    with a side under `min_box_side` are dropped (training passes 1, as SanitizeBoundingBoxes would)."""
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
    """Every sample in shard order, unaugmented; an undecodable one fails (scores on fewer would not compare)."""
    for shard in shards:
        table = ShardRows(shard.path)
        for row in range(table.table.num_rows):
            if shard.masked and table.key(row) in shard.masked:
                continue
            try:
                picture, target, key = decode_sample(table, row)
            except BadSampleError as error:
                raise BadSampleError(f"{shard.path} row {row}: {error}") from error
            yield EvalSample(
                key, picture.width, picture.height, F.pil_to_tensor(picture), target["boxes"], target["labels"]
            )
