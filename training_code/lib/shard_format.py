"""The Arrow shard format: column schema, manifest layout, and verified reading.

A shard set is a folder of Arrow IPC stream files (`<split>-<nnnnn>.arrow`, readable with
`datasets.Dataset.from_file`) and a `manifest.json`, written last, that lists every shard with its
row count, byte size and sha256. Readers trust only the manifest. Boxes are absolute `x1, y1, x2, y2`
pixels in the upright frame: decode `image` with `decode_upright` (EXIF orientation applied).
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
from PIL import Image, ImageOps

from .hashing import sha256_file

MANIFEST = "manifest.json"
FORMAT = "zero-shards/1"

SHARD_SCHEMA = pa.schema(
    [
        pa.field("image", pa.large_binary(), nullable=False),
        pa.field("image_format", pa.string(), nullable=False),
        pa.field("width", pa.int32(), nullable=False),
        pa.field("height", pa.int32(), nullable=False),
        pa.field("boxes", pa.list_(pa.list_(pa.float32(), 4)), nullable=False),
        pa.field("category_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("category_names", pa.list_(pa.string()), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("key", pa.string(), nullable=False),
        pa.field("sha256", pa.string(), nullable=False),
    ],
    metadata={"boxes": "x1,y1,x2,y2 absolute pixels, upright frame (EXIF orientation applied)"},
)


class ShardIntegrityError(RuntimeError):
    """A shard on disk does not match its manifest entry."""


def read_manifest(folder: Path) -> dict[str, Any]:
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"no shard manifest at {path}: the shard set is incomplete or was never written")
    manifest = json.loads(path.read_text())
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{path}: format {manifest.get('format')!r} is not {FORMAT!r}")
    return manifest


def shards_for_split(manifest: dict[str, Any], split: str) -> list[dict[str, Any]]:
    return [s for s in manifest["shards"] if s["split"] == split]


def verify_shard(folder: Path, entry: dict[str, Any], check_sha256: bool = True) -> None:
    """Fail loudly when a shard is missing, truncated, edited, or holds a different row count."""
    path = Path(folder) / entry["file"]
    if not path.is_file():
        raise ShardIntegrityError(f"{path}: listed in the manifest but missing")
    size = path.stat().st_size
    if size != entry["bytes"]:
        raise ShardIntegrityError(f"{path}: {size} bytes on disk, manifest says {entry['bytes']}")
    if check_sha256 and (digest := sha256_file(path)) != entry["sha256"]:
        raise ShardIntegrityError(f"{path}: sha256 {digest} does not match manifest {entry['sha256']}")
    rows = open_shard(path).num_rows
    if rows != entry["rows"]:
        raise ShardIntegrityError(f"{path}: {rows} rows, manifest says {entry['rows']}")


def open_shard(path: Path) -> pa.Table:
    """Memory-map one shard as a table (zero-copy; pages load on access)."""
    with pa.memory_map(str(path)) as source:
        return pa.ipc.open_stream(source).read_all()


def decode_upright(data: bytes) -> Image.Image:
    """Decode stored image bytes to RGB in the frame the boxes use."""
    with Image.open(io.BytesIO(data)) as image:
        ImageOps.exif_transpose(image, in_place=True)  # in place: no extra copy of an image already upright
        image.load()
        # Pixels stay valid after the `with` (it only drops the byte stream); convert() would copy an RGB image.
        return image if image.mode == "RGB" else image.convert("RGB")
