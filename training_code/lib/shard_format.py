"""The Arrow shard format (docs/shards.md): column schema, manifest layout, and verified reading.

A shard set's `manifest.json`, written last, lists every shard by `path` from its folder (content-addressed:
`shards/<split>-<sha256[:16]>.arrow`, or `../<earlier set>/shards/...`); `masked.parquet` names rows readers
skip, `rows.parquet` every row (see shard_plan). Boxes are upright-frame `x1, y1, x2, y2` pixels."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from PIL import Image, ImageOps

from . import relative_paths, shard_hf
from .hashing import sha256_file
from .parquet_bytes import read_parquet_bytes
from .storage import join
from .verified_read import read_verified

MANIFEST = "manifest.json"
FORMAT = "zero-shards/4"
# What an earlier set lacks, for the error that refuses it (the next set packs every row again).
EARLIER_FORMATS = {
    "zero-shards/3": "its shards have no `objects` and `image_id` columns (the Hugging Face detection convention)",
    "zero-shards/2": "its shards are listed by file name, not by path, and have no `objects` column",
}
SHARDS = "shards"  # the folder of a set's own shards
MASKED = "masked.parquet"
ROWS = "rows.parquet"
MASKED_SCHEMA = pa.schema([pa.field("path", pa.string(), nullable=False), pa.field("key", pa.string(), nullable=False)])
# `labels`: shard_packing.label_digests of the selected row a shard row was packed from.
ROWS_SCHEMA = pa.schema(
    [pa.field(name, pa.string(), nullable=False) for name in ("path", "key", "sha256", "split", "labels")]
)

IMAGE_TYPE = pa.struct([pa.field("bytes", pa.binary()), pa.field("path", pa.string())])
BOXES_NOTE = {
    "boxes": "x1,y1,x2,y2 absolute pixels, upright frame (EXIF orientation applied)",
    "objects.bbox": "x,y,w,h (COCO) absolute pixels, the same boxes",
}

# Nullable because `datasets` ignores a non-nullable column's features; the writer refuses nulls instead.
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
        pa.field("image_id", pa.int64()),  # derived: shard_hf.image_ids
        pa.field("objects", shard_hf.OBJECTS_TYPE),  # derived: shard_hf.objects_column
    ],
    metadata=BOXES_NOTE,
)
# The columns the writer derives from the others (shard_hf.convention_columns), last in a shard.
DERIVED = ("image_id", "objects")
# Every column a writer is given but the image: the labels a shard holds for each row.
LABEL_SCHEMA = pa.schema([f for f in SHARD_SCHEMA if f.name != "image" and f.name not in DERIVED])


def shard_schema(categories: list[dict[str, Any]]) -> pa.Schema:
    """SHARD_SCHEMA with the `datasets` features of a shard set whose manifest lists `categories`."""
    return SHARD_SCHEMA.with_metadata(
        {**BOXES_NOTE, "huggingface": shard_hf.schema_metadata(shard_hf.class_names(categories))}
    )


class ShardIntegrityError(RuntimeError):
    """A shard on disk does not match its manifest entry."""


def read_manifest(folder: Path) -> dict[str, Any]:
    """The shard-set manifest in `folder`; an error naming it when it is missing or of another format."""
    path = Path(folder) / MANIFEST
    return checked_manifest(path.read_bytes() if path.is_file() else None, path)


def checked_manifest(data: bytes | None, path: Path | str) -> dict[str, Any]:
    """The shard-set manifest `data` read from `path` (None: there is none), checked to be of FORMAT."""
    if data is None:
        raise FileNotFoundError(f"no shard manifest at {path}: the shard set is incomplete or was never written")
    manifest = json.loads(data)
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        why = f" ({EARLIER_FORMATS[found]})" if isinstance(found, str) and found in EARLIER_FORMATS else ""
        raise ValueError(
            f"{path}: format {found!r} is not {FORMAT!r}{why}; rematerialize arrow_shards, which packs "
            "every row again into a new set"
        )
    return manifest


def shards_for_split(manifest: dict[str, Any], split: str) -> list[dict[str, Any]]:
    return [s for s in manifest["shards"] if s["split"] == split]


def set_in_channel(channel: Path, training_set_dir: str | None) -> tuple[Path, Path]:
    """(the set's folder, the root its shards stay inside): `training_set_dir` inside the channel and the
    channel, else the channel and two folders above it."""
    root = Path(channel)
    if training_set_dir is None:
        return root, Path(os.path.abspath(root)).parent.parent
    inner = Path(training_set_dir)
    if inner.is_absolute() or ".." in inner.parts:
        raise ValueError(
            f"training set {training_set_dir!r} must be a folder inside the channel {channel}, without '..'"
        )
    return root / inner, root


def shard_path(folder: Path, entry: dict[str, Any], root: Path | None = None) -> Path:
    """Where the shard of a manifest entry is, from the manifest's folder; ValueError when it leaves `root`."""
    return Path(relative_paths.resolve(folder, entry["path"], root))


def verify_shard(folder: Path, entry: dict[str, Any], check_sha256: bool = True, root: Path | None = None) -> None:
    """Fail loudly when a shard is missing, truncated, edited, or holds a different row count."""
    verify_shard_file(shard_path(folder, entry, root), entry, check_sha256)


def masked_keys(folder: str | Path, manifest: dict[str, Any]) -> dict[str, frozenset[str]]:
    """Shard path -> the keys of its rows that readers skip (`masked.parquet`, checked against the manifest)."""
    if MASKED not in manifest.get("files", {}):
        return {}
    return masked_by_path(read_parquet_bytes(read_verified(join(folder, MASKED))))  # local or s3://


def masked_by_path(table: pa.Table) -> dict[str, frozenset[str]]:
    """A MASKED_SCHEMA table as shard path -> the keys of its masked rows."""
    by_path: dict[str, set[str]] = {}
    for path, key in zip(table.column("path").to_pylist(), table.column("key").to_pylist()):
        by_path.setdefault(path, set()).add(key)
    return {path: frozenset(keys) for path, keys in by_path.items()}


def verify_shard_file(path: Path, entry: dict[str, Any], check_sha256: bool = True) -> None:
    """`verify_shard` for the file at `path`, whatever its name (a copy fetched to a temporary name)."""
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
