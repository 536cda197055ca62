"""A shard set loaded with `datasets`: a local folder without its masked rows (`load_live`), or wherever
fsspec reaches it, `s3://` (s3fs, the `hf` extra) or local, without this project's storage layer (`load_url`).

`datasets.load_from_disk` copies only a split's own folder from a remote filesystem, never the shards
its `state.json` points at one folder up (or in an earlier set's folder), so it cannot load a set on
S3. `load_url` reads the set's `manifest.json` through fsspec, hands `datasets.load_dataset("arrow",
...)` each split's shard URLs (resolved from the manifest's paths, kept shards included) with the set's
features (the manifest's categories name the `ClassLabel`s: a kept shard's own names may be fewer), and
leaves out the rows the manifest masks. As for any remote data files, `datasets` downloads and
prepares the shards into its cache (`cache_dir`), or, `streaming`, reads them as they are iterated.

Imports `datasets` and fsspec only when called: reading a shard never does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from . import relative_paths, shard_format, shard_hf
from .shard_format import FORMAT, MANIFEST, MASKED, shards_for_split
from .storage import join


def _read(url: str, storage_options: dict[str, Any] | None) -> bytes:
    import fsspec

    with fsspec.open(url, "rb", **(storage_options or {})) as file:
        return file.read()


def read_set(url: str, storage_options: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """The set's manifest and, by split, the URL of each of its shards in manifest order."""
    where = join(url, MANIFEST)
    try:
        manifest = json.loads(_read(where, storage_options))
    except FileNotFoundError:
        raise FileNotFoundError(
            f"no shard manifest at {where}: the shard set is incomplete or was never written"
        ) from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise ValueError(f"{where}: format {found!r} is not {FORMAT!r}; rematerialize arrow_shards")
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
    from .parquet_bytes import read_parquet_bytes

    table = read_parquet_bytes(_read(join(url, MASKED), storage_options))
    by_path: dict[str, set[str]] = {}
    for path, key in zip(table.column("path").to_pylist(), table.column("key").to_pylist()):
        by_path.setdefault(path, set()).add(key)
    return {path: frozenset(keys) for path, keys in by_path.items()}


def load_url(
    url: str,
    storage_options: dict[str, Any] | None = None,
    *,
    live: bool = True,
    cache_dir: str | None = None,
    streaming: bool = False,
):
    """The shard set at `url` as a `DatasetDict` by split, with the set's features (`objects` with
    `bbox` and a `ClassLabel` `category`); `live` leaves out the masked rows, as training does.
    `streaming`: an `IterableDatasetDict` that reads the shards as it is iterated, nothing prepared
    in the cache (for a set larger than a disk)."""
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
    """`datasets.load_from_disk(folder)` without the rows the manifest masks: a `DatasetDict` by split
    of the rows training reads (imports `datasets`, which reading a shard otherwise never does)."""
    import datasets  # seconds to import: only where a `datasets` object is asked for

    manifest = shard_format.read_manifest(folder)
    loaded = datasets.load_from_disk(str(folder))
    return without_masked(loaded, manifest, shard_format.masked_keys(folder, manifest))


def without_masked(loaded, manifest: dict[str, Any], masked: dict[str, frozenset[str]]):
    """A `DatasetDict` whose splits hold their shards' rows in manifest order, less the `masked` ones
    (shard path -> keys): an indices mapping, nothing copied."""
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
