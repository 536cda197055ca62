"""A shard set loaded with `datasets` without its masked rows: a local folder (`load_live`), or any fsspec
URL, s3:// included (`load_url`: `load_from_disk` would not copy the shards a split points at).
Imports `datasets` and fsspec only when called."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import relative_paths, shard_format, shard_hf
from .parquet_bytes import read_parquet_bytes
from .shard_format import MANIFEST, MASKED, shards_for_split
from .storage import join


def _read(url: str, storage_options: dict[str, Any] | None) -> bytes:
    import fsspec

    with fsspec.open(url, "rb", **(storage_options or {})) as file:
        return file.read()


def read_set(url: str, storage_options: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """The set's manifest and, by split, the URL of each of its shards in manifest order."""
    where = join(url, MANIFEST)
    try:
        data = _read(where, storage_options)
    except FileNotFoundError:
        data = None
    manifest = shard_format.checked_manifest(data, where)
    splits = dict.fromkeys(entry["split"] for entry in manifest["shards"])
    files = {
        split: [relative_paths.resolve(url, entry["path"]) for entry in shards_for_split(manifest, split)]
        for split in splits
    }
    return manifest, files


def masked_keys(url: str, manifest: dict[str, Any], storage_options: dict[str, Any] | None = None):
    """Shard path (as the manifest lists it) -> the keys of its rows the manifest masks."""
    if MASKED not in manifest.get("files", {}):
        return {}
    return shard_format.masked_by_path(read_parquet_bytes(_read(join(url, MASKED), storage_options)))


def load_url(
    url: str,
    storage_options: dict[str, Any] | None = None,
    *,
    live: bool = True,
    cache_dir: str | None = None,
    streaming: bool = False,
):
    """The shard set at `url` as a `DatasetDict` by split (`streaming`: an `IterableDatasetDict`)."""
    import datasets  # seconds to import: only where a `datasets` object is asked for

    manifest, files = read_set(url, storage_options)
    features = datasets.Features.from_dict(shard_hf.features(shard_hf.class_names(manifest["categories"])))
    masked = masked_keys(url, manifest, storage_options) if live else {}

    def load(data_files: Any, **kwargs: Any):
        # A copy: `datasets` adds its own `hf` entry to the options it is given, which s3fs then refuses.
        options = dict(storage_options) if storage_options else None
        return datasets.load_dataset(
            "arrow", data_files=data_files, features=features, storage_options=options, **kwargs
        )

    if streaming:  # a shard at a time, so each leaves out its own masked rows (a key may be live in another)
        return datasets.IterableDatasetDict(
            {
                split: datasets.concatenate_datasets(
                    [
                        _without(load([shard], streaming=True, split="train"), masked.get(entry["path"]))
                        for entry, shard in zip(shards_for_split(manifest, split), shards)
                    ]
                )
                for split, shards in files.items()
            }
        )
    loaded = load(files, cache_dir=cache_dir)
    return without_masked(loaded, manifest, masked) if live else loaded


def _without(shard: Any, keys: frozenset[str] | None) -> Any:
    return shard.filter(lambda row: row["key"] not in keys) if keys else shard


def load_live(folder: Path):
    """`datasets.load_from_disk(folder)` without the rows the manifest masks."""
    import datasets  # seconds to import: only where a `datasets` object is asked for

    manifest = shard_format.read_manifest(folder)
    loaded = datasets.load_from_disk(str(folder))
    return without_masked(loaded, manifest, shard_format.masked_keys(folder, manifest))


def without_masked(loaded, manifest: dict[str, Any], masked: dict[str, frozenset[str]]):
    """A `DatasetDict` of its shards' rows less the `masked` ones: an indices mapping, nothing copied."""
    import datasets

    live = {}
    for split, data in loaded.items():
        keys, kept, start = data["key"], [], 0
        for entry in shards_for_split(manifest, split):  # the order of the split's data files
            skip = masked.get(entry["path"], frozenset())
            kept += [row for row in range(start, start + entry["rows"]) if keys[row] not in skip]
            start += entry["rows"]
        live[split] = data.select(kept) if len(kept) < len(data) else data
    return datasets.DatasetDict(live)
