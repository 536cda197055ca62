"""Read selected images as a shard stores them: raw bytes checked against validation's sha256, kept or
resized and re-encoded. Runs in the packing pool's workers, so it imports only Pillow and small modules
(a forkserver child importing pyarrow would cost several times more).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

from PIL import Image, ImageOps

from .hashing import sha256_bytes
from .labels import upright_size
from .raw_files import Locator, Refused, read_regular

ENCODINGS = ("original", "resize")


class ChangedAfterValidation(RuntimeError):
    """Raw bytes no longer match the sha256 recorded by validation."""


_REDO = (
    "the raw file changed after validation. "
    "Re-materialize validated_images of its source, then training_set and arrow_shards."
)


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


def read_checked(path: str, key: str, sha256: str) -> bytes:
    try:
        data = read_regular(path)
    except (Refused, OSError) as error:  # gone, or no longer a regular file at the located path
        why = error.detail if isinstance(error, Refused) else error.strerror or str(error)
        raise ChangedAfterValidation(f"{key}: cannot be read ({why}); {_REDO}") from None
    if (digest := sha256_bytes(data)) != sha256:
        raise ChangedAfterValidation(f"{key}: sha256 is {digest} but validation recorded {sha256}; {_REDO}")
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


def read_batch(task: tuple[Locator, list[tuple], Encoding]) -> list[bytes]:
    """The `image` column values of one batch of rows; runs in a worker (thread or process)."""
    locator, batch, encoding = task
    images = []
    for key, sha256, target, orientation in batch:
        # Located inside the raw root: a symlink swapped in since validation fails the job, its target unread.
        try:
            path = locator.located(key)
        except Refused as refused:
            raise RuntimeError(
                f"{key}: {refused}; the raw root changed since validation, rematerialize validated_images"
            ) from None
        data = read_checked(path, key, sha256)  # the raw bytes are checked before anything is derived from them
        if encoding.mode == "resize":
            data = resize_encode(data, target, int(orientation), encoding.jpeg_quality)
        images.append(data)
    return images
