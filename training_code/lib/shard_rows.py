"""What goes into one shard row: the image bytes (as stored, or resized and re-encoded) and its labels.

Labels are a pure function of the selected row and the encoding settings (a resized image's size is
computed, not measured), so whether an earlier shard's row still stands for the selected one is a
comparison of `label_digest`s, without decoding anything. The `sha256` column is always the raw
file's, as validation recorded it.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from PIL import Image, ImageOps

from .hashing import sha256_bytes, sha256_json
from .labels import upright_size

ENCODINGS = ("original", "resize")


class ChangedAfterValidation(RuntimeError):
    """Raw bytes no longer match the sha256 recorded by validation."""


@dataclass(frozen=True)
class Encoding:
    """How image bytes are stored: `original` keeps the file's bytes; `resize` caps the longest side and
    re-encodes JPEG."""

    mode: str = "original"
    max_side: int = 1024
    jpeg_quality: int = 90

    def __post_init__(self) -> None:
        if self.mode not in ENCODINGS:
            raise ValueError(f"--image-encoding must be one of {ENCODINGS}, got {self.mode!r}")
        if self.max_side < 1 or not 1 <= self.jpeg_quality <= 100:
            raise ValueError(
                f"--max-side must be >= 1 and --jpeg-quality within 1..100; got {self.max_side}, {self.jpeg_quality}"
            )

    def config(self) -> dict[str, Any]:
        """The settings that decide the stored bytes (part of the shard manifest and of the fingerprint)."""
        if self.mode == "original":
            return {"image_encoding": "original"}
        return {"image_encoding": "resize", "max_side": self.max_side, "jpeg_quality": self.jpeg_quality}


def resized_size(width: int, height: int, max_side: int) -> tuple[int, int]:
    """The upright size after capping the longest side at `max_side` (never enlarged)."""
    scale = min(1.0, max_side / max(width, height))
    return max(1, round(width * scale)), max(1, round(height * scale))


# The selected row's columns a shard row's labels are made of (with the encoding, which a shard set's
# config fixes for every shard it keeps).
LABEL_SOURCES = ("format", "width", "height", "orientation", "boxes", "category_names")


def label_digests(selected: pa.Table) -> list[str]:
    """`label_digest` of each row of a selection table, in its order."""
    columns = selected.select(list(LABEL_SOURCES)).to_pydict()
    return [sha256_json(values)[:16] for values in zip(*columns.values())]


def shard_labels(row: dict[str, Any], category_id: dict[str, int], encoding: Encoding) -> dict[str, Any]:
    """Every shard column but `image` for one selected row (training_set.SELECTION_SCHEMA as a dict)."""
    width, height = int(row["width"]), int(row["height"])
    boxes = [[float(v) for v in box] for box in row["boxes"]]
    image_format = row["format"]
    if encoding.mode == "resize":
        new_width, new_height = resized_size(width, height, encoding.max_side)
        sx, sy = new_width / width, new_height / height
        boxes = [[x1 * sx, y1 * sy, x2 * sx, y2 * sy] for x1, y1, x2, y2 in boxes]
        width, height, image_format = new_width, new_height, "JPEG"
    return {
        "image_format": image_format,
        "width": width,
        "height": height,
        "boxes": boxes,
        "category_ids": [category_id[name] for name in row["category_names"]],
        "category_names": list(row["category_names"]),
        "source": row["source"],
        "key": row["key"],
        "sha256": row["sha256"],
    }


def read_checked(path: Path, key: str, sha256: str) -> bytes:
    data = path.read_bytes()
    if (digest := sha256_bytes(data)) != sha256:
        raise ChangedAfterValidation(
            f"{key}: sha256 is {digest} but validation recorded {sha256}; the raw file changed after validation. "
            "Re-materialize validated_images of its source, then training_set and arrow_shards."
        )
    return data


def resize_encode(data: bytes, upright_target: tuple[int, int], orientation: int, quality: int) -> bytes:
    """Decode, apply EXIF orientation, convert to RGB as `shard_format.decode_upright` does, resize, encode JPEG."""
    with Image.open(io.BytesIO(data)) as image:
        # draft: a JPEG decodes straight at 1/2, 1/4 or 1/8 scale, never below the size asked for.
        image.draft("RGB", upright_size(*upright_target, orientation))
        image.load()
        ImageOps.exif_transpose(image, in_place=True)
        rgb = image.convert("RGB")
    if rgb.size != upright_target:
        rgb = rgb.resize(upright_target, Image.Resampling.BILINEAR)
    buffer = io.BytesIO()
    rgb.save(buffer, "JPEG", quality=quality)
    return buffer.getvalue()


def load_image_bytes(task: tuple[str, str, str, tuple[int, int], int, Encoding]) -> bytes:
    """The `image` column value for one row; runs in a worker (thread or process)."""
    path, key, sha256, upright_target, orientation, encoding = task
    data = read_checked(Path(path), key, sha256)  # the raw bytes are checked before anything is derived from them
    if encoding.mode == "original":
        return data
    return resize_encode(data, upright_target, orientation, encoding.jpeg_quality)
