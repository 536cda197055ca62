"""The Hugging Face `datasets` view of a shard set: the features each shard's schema declares (spelled out,
so a shard is read without importing `datasets`; tests check them), the derived `image_id` and `objects`
(COCO `bbox`, ClassLabel `category`; ids stable hashes of the key), and the `load_from_disk` files whose
data files are the shards where they lie. ClassLabel names are `__background__` then categories 1..K."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .hashing import sha256_bytes
from .storage import write_bytes_atomic

BACKGROUND = "__background__"
# `objects` as `datasets` stores a sequence of dicts: a struct of one list per field, a row's lists aligned.
OBJECTS_TYPE = pa.struct(
    [
        pa.field("id", pa.list_(pa.int64())),
        pa.field("area", pa.list_(pa.float32())),
        pa.field("bbox", pa.list_(pa.list_(pa.float32(), 4))),
        pa.field("category", pa.list_(pa.int64())),
    ]
)
DATASET_DICT = "dataset_dict.json"
STATE = "state.json"
INFO = "dataset_info.json"


def class_names(categories: list[dict[str, Any]]) -> list[str]:
    """The ClassLabel names for a manifest's categories: index i names category id i, 0 the background."""
    by_id = {int(c["id"]): str(c["name"]) for c in categories}
    if sorted(by_id) != list(range(1, len(by_id) + 1)) or len(by_id) != len(categories):
        raise ValueError(
            f"category ids must be 1..K, each once, to name a ClassLabel; got {sorted(c['id'] for c in categories)}"
        )
    names = [BACKGROUND] + [by_id[i] for i in range(1, len(by_id) + 1)]
    if len(set(names)) != len(names):
        raise ValueError(f"category names must be distinct and not {BACKGROUND!r}; got {names[1:]}")
    return names


def _value(dtype: str) -> dict[str, Any]:
    return {"dtype": dtype, "_type": "Value"}


def _list(feature: dict[str, Any], length: int | None = None) -> dict[str, Any]:
    return {"feature": feature, **({"length": length} if length is not None else {}), "_type": "List"}


def features(names: list[str]) -> dict[str, Any]:
    """The `datasets` features of a shard, column by column, as `Features.to_dict()` writes them."""
    return {
        "image": {"mode": "RGB", "_type": "Image"},  # decoded upright (EXIF applied) and RGB, the frame the boxes use
        "image_format": _value("string"),
        "width": _value("int32"),
        "height": _value("int32"),
        "boxes": _list(_list(_value("float32"), length=4)),
        "category_ids": _list({"names": list(names), "_type": "ClassLabel"}),
        "category_names": _list(_value("string")),
        "source": _value("string"),
        "key": _value("string"),
        "sha256": _value("string"),
        "image_id": _value("int64"),
        "objects": {  # a sequence of dicts, as `datasets` writes it: a dict of lists
            "id": _list(_value("int64")),
            "area": _list(_value("float32")),
            "bbox": _list(_list(_value("float32"), length=4)),  # COCO x, y, w, h
            "category": _list({"names": list(names), "_type": "ClassLabel"}),
        },
    }


def _mix(values: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: distinct inputs give distinct, well-spread outputs (a bijection)."""
    with np.errstate(over="ignore"):
        z = values ^ (values >> np.uint64(30))
        z = z * np.uint64(0xBF58476D1CE4E5B9)
        z = z ^ (z >> np.uint64(27))
        z = z * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _id63(values: np.ndarray) -> pa.Array:
    return pa.array((values >> np.uint64(1)).astype(np.int64))


def objects_column(hashes: np.ndarray, keys: pa.Array, boxes: pa.Array, category_ids: pa.Array) -> pa.StructArray:
    """The `objects` of each row from its flat `boxes` and `category_ids`, by columns only."""
    counts = pc.list_value_length(boxes).to_numpy(zero_copy_only=False)
    labels = pc.list_value_length(category_ids).to_numpy(zero_copy_only=False)
    if not np.array_equal(counts, labels):
        row = int(np.flatnonzero(counts != labels)[0])
        raise ValueError(
            f"shard row {keys[row].as_py()!r}: {counts[row]} boxes but {labels[row]} category ids; "
            "every box needs one category"
        )
    starts = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts, out=starts[1:])
    xyxy = pc.list_flatten(pc.list_flatten(boxes)).to_numpy(zero_copy_only=False).reshape(-1, 4)
    width, height = xyxy[:, 2] - xyxy[:, 0], xyxy[:, 3] - xyxy[:, 1]
    xywh = np.stack([xyxy[:, 0], xyxy[:, 1], width, height], axis=1).astype(np.float32)
    place = np.arange(starts[-1], dtype=np.int64) - np.repeat(starts[:-1], counts)
    with np.errstate(over="ignore"):
        ids = _mix(np.repeat(hashes, counts) + place.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15))
    fields = {
        "id": _id63(ids),
        "area": pa.array((width * height).astype(np.float32)),
        "bbox": pa.FixedSizeListArray.from_arrays(pa.array(xywh.reshape(-1)), 4),
        "category": pc.list_flatten(category_ids).cast(pa.int64()),
    }
    offsets = pa.array(starts.astype(np.int32))
    lists = [pa.ListArray.from_arrays(offsets, fields[field.name]) for field in OBJECTS_TYPE]
    return pa.StructArray.from_arrays(lists, fields=list(OBJECTS_TYPE))


def convention_columns(columns: dict[str, pa.Array]) -> list[pa.Array]:
    """The derived columns (`image_id`, `objects`) of rows given as flat columns."""
    keys = columns["key"].to_pylist()  # a stable 64-bit hash of each (blake2b)
    digests = b"".join(hashlib.blake2b(key.encode(), digest_size=8).digest() for key in keys)
    hashes = np.frombuffer(digests, dtype=">u8").astype(np.uint64)
    return [_id63(hashes), objects_column(hashes, columns["key"], columns["boxes"], columns["category_ids"])]


def schema_metadata(names: list[str]) -> bytes:
    """The `huggingface` schema metadata value: `datasets` reads `info.features` from it."""
    return json.dumps({"info": {"features": features(names)}}).encode()


def write_dataset_dict(
    folder: Path, entries: list[dict[str, Any]], categories: list[dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Write the `load_from_disk` files for the splits that have shards; name -> {bytes, sha256}."""
    folder = Path(folder)
    names = class_names(categories)
    splits = list(dict.fromkeys(e["split"] for e in entries))
    written = {DATASET_DICT: json.dumps({"splits": splits}).encode()}
    for split in splits:
        shards = [e for e in entries if e["split"] == split]
        # A content fingerprint: `datasets` names the cache files of map()/filter() results after it.
        fingerprint = hashlib.sha256("".join(e["sha256"] for e in shards).encode()).hexdigest()[:16]
        written[f"{split}/{STATE}"] = json.dumps(
            {
                "_data_files": [{"filename": f"../{e['path']}"} for e in shards],
                "_fingerprint": fingerprint,
                "_format_columns": None,
                "_format_kwargs": {},
                "_format_type": None,
                "_output_all_columns": False,
                "_split": split,
            },
            indent=1,
        ).encode()
        written[f"{split}/{INFO}"] = json.dumps(
            {
                "features": features(names),
                "splits": {
                    split: {
                        "name": split,
                        "num_examples": sum(e["rows"] for e in shards),
                        "num_bytes": sum(e["bytes"] for e in shards),
                    }
                },
            },
            indent=1,
        ).encode()
    for name, data in written.items():
        write_bytes_atomic(folder / name, data)
    return {name: {"bytes": len(data), "sha256": sha256_bytes(data)} for name, data in written.items()}
