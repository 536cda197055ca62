"""The Arrow shard format: column schema, manifest layout, and verified reading.

A shard set is a folder of Arrow IPC stream files (`<split>-<nnnnn>.arrow`) and a `manifest.json`,
written last, that lists every shard with its row count, byte size and sha256. Readers trust only the
manifest. Boxes are absolute `x1, y1, x2, y2` pixels in the upright frame: decode the stored image
bytes (`image_bytes`) with `decode_upright` (EXIF orientation applied).

Each shard is also a Hugging Face dataset (see shard_hf): its schema carries the `datasets` features,
so `datasets.Dataset.from_file(shard)` yields PIL images and `ClassLabel` category ids, and the folder
loads with `datasets.load_from_disk` as a `DatasetDict` by split.
"""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from PIL import Image, ImageOps

from . import shard_hf
from .hashing import sha256_file

log = logging.getLogger("zero.shard")

MANIFEST = "manifest.json"
# 2: image as struct<bytes, path>, category ids int64, every column nullable, `datasets` features in
# the schema: the storage `datasets` needs to read the features (see shard_hf).
FORMAT = "zero-shards/2"

IMAGE_TYPE = pa.struct([pa.field("bytes", pa.binary()), pa.field("path", pa.string())])
BOXES_NOTE = {"boxes": "x1,y1,x2,y2 absolute pixels, upright frame (EXIF orientation applied)"}

# The columns and their storage. Nullable because `datasets` ignores a column's features when its field
# is not: the writer refuses nulls instead (ShardWriter). A shard's own schema adds the features.
SHARD_SCHEMA = pa.schema(
    [
        pa.field("image", IMAGE_TYPE),  # the stored bytes; `path` is always null
        pa.field("image_format", pa.string()),
        pa.field("width", pa.int32()),
        pa.field("height", pa.int32()),
        pa.field("boxes", pa.list_(pa.list_(pa.float32(), 4))),
        pa.field("category_ids", pa.list_(pa.int64())),
        pa.field("category_names", pa.list_(pa.string())),
        pa.field("source", pa.string()),
        pa.field("key", pa.string()),
        pa.field("sha256", pa.string()),
    ],
    metadata=BOXES_NOTE,
)
# Every column but the image: the labels a shard holds for each row.
LABEL_SCHEMA = pa.schema([f for f in SHARD_SCHEMA if f.name != "image"])


def shard_schema(categories: list[dict[str, Any]]) -> pa.Schema:
    """SHARD_SCHEMA with the `datasets` features of a shard set whose manifest lists `categories`."""
    return SHARD_SCHEMA.with_metadata(
        {**BOXES_NOTE, "huggingface": shard_hf.schema_metadata(shard_hf.class_names(categories))}
    )


class ShardIntegrityError(RuntimeError):
    """A shard on disk does not match its manifest entry."""


def _manifest_json(folder: Path) -> tuple[Path, dict[str, Any]]:
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"no shard manifest at {path}: the shard set is incomplete or was never written")
    return path, json.loads(path.read_text())


def read_manifest(folder: Path) -> dict[str, Any]:
    path, manifest = _manifest_json(folder)
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{path}: format {manifest.get('format')!r} is not {FORMAT!r}")
    return manifest


def shards_for_split(manifest: dict[str, Any], split: str) -> list[dict[str, Any]]:
    return [s for s in manifest["shards"] if s["split"] == split]


def verify_shard(folder: Path, entry: dict[str, Any], check_sha256: bool = True) -> None:
    """Fail loudly when a shard is missing, truncated, edited, or holds a different row count."""
    verify_shard_file(Path(folder) / entry["file"], entry, check_sha256)


def verify_shard_file(path: Path, entry: dict[str, Any], check_sha256: bool = True) -> None:
    """`verify_shard` for the file at `path`, whatever its name: a copy fetched to a temporary name is
    checked against its manifest entry before it is renamed into place."""
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


def image_bytes(table: pa.Table) -> pa.ChunkedArray:
    """The stored image bytes of every row (the `bytes` field of `image`), zero-copy from the map."""
    return pc.struct_field(table.column("image"), "bytes")


def decode_upright(data: bytes) -> Image.Image:
    """Decode stored image bytes to RGB in the frame the boxes use."""
    with Image.open(io.BytesIO(data)) as image:
        ImageOps.exif_transpose(image, in_place=True)  # in place: no extra copy of an image already upright
        image.load()
        # Pixels stay valid after the `with` (it only drops the byte stream); convert() would copy an RGB image.
        return image if image.mode == "RGB" else image.convert("RGB")


def reusable_manifest(previous: Path | None, categories: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The earlier shard set's manifest when its shards may be carried over, else None (every row is
    packed again): an older format, or other categories, since every shard embeds the category names
    (its ClassLabel) and the format decides the bytes."""
    if previous is None:
        return None
    _, manifest = _manifest_json(previous)
    if manifest.get("format") != FORMAT or manifest.get("categories") != categories:
        log.info(
            "earlier shard set %s has format %s and categories %s, now %s and %s: every row is packed again",
            previous,
            manifest.get("format"),
            manifest.get("categories"),
            FORMAT,
            categories,
        )
        return None
    return manifest
