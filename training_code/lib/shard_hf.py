"""The Hugging Face `datasets` view of a shard set: the features each shard's schema declares, and the
`load_from_disk` files that make the shard folder a `DatasetDict` by split.

`datasets` reads a table's features from the `huggingface` key of the Arrow schema metadata, and uses
one only where the column's Arrow type is exactly that feature's storage type (nullable included). So
the shard columns are stored the way the features say: `image` as `Image`'s struct<bytes, path> (the
stored bytes; `path` always null), category ids as `ClassLabel`'s int64. The JSON below is what
`datasets.Features.to_dict()` writes; it is spelled out here so that reading or writing a shard never
imports `datasets` (seconds at start), and tests/test_hf_dataset_shards.py checks it against the
installed `datasets`.

Category ids are the detector's labels 1..K (torchvision keeps 0 for the background), so the
`ClassLabel` names are `__background__` followed by the K category names: `int2str(id)` is the
category's name for every stored id.

`load_from_disk(folder)` reads `dataset_dict.json`, then per split `<split>/state.json` and
`<split>/dataset_info.json`, whose data files are the split's shards by their manifest paths, one
folder up (`../shards/train-<sha16>.arrow`, `../../<earlier set>/shards/...`): the shards stay where
every other reader finds them, and nothing is copied. `load_from_disk` knows no masked rows, so it
yields every stored row; `load_live(folder)` is the same DatasetDict without the masked ones (an
indices mapping over the same memory-mapped shards, nothing copied).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from .hashing import sha256_bytes
from .storage import write_bytes_atomic

BACKGROUND = "__background__"
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
    }


def schema_metadata(names: list[str]) -> bytes:
    """The `huggingface` schema metadata value: `datasets` reads `info.features` from it."""
    return json.dumps({"info": {"features": features(names)}}).encode()


def write_dataset_dict(
    folder: Path, entries: list[dict[str, Any]], categories: list[dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Write the `load_from_disk` files for the splits that have shards; returns name -> {bytes, sha256}
    for the manifest, so an output is complete only with them. Written before the manifest, like the shards."""
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


def load_live(folder: Path):
    """`datasets.load_from_disk(folder)` without the rows the manifest masks: a `DatasetDict` by split
    of the rows training reads (imports `datasets`, which reading a shard otherwise never does)."""
    import datasets  # seconds to import: only where a `datasets` object is asked for

    from .shard_format import masked_keys, read_manifest, shards_for_split

    manifest = read_manifest(folder)
    masked = masked_keys(folder, manifest)
    loaded = datasets.load_from_disk(str(folder))
    live = {}
    for split, data in loaded.items():
        keys, kept, start = data["key"], [], 0
        for entry in shards_for_split(manifest, split):  # the order of the split's data files
            skip = masked.get(entry["path"], frozenset())
            kept += [row for row in range(start, start + entry["rows"]) if keys[row] not in skip]
            start += entry["rows"]
        live[split] = data.select(kept) if len(kept) < len(data) else data
    return datasets.DatasetDict(live)
