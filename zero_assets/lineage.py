"""Answer lineage questions from the Dagster instance and the manifests the assets wrote.

Each job-backed materialization records `upstream` (asset -> uri, data version), so a checkpoint can
be walked back to its warm shards and training set; the training set names each source's shard set
(and the validated set it was built from) and the rows it left out; the shards say which images
trained it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

import pandas as pd
import pyarrow as pa
from dagster import AssetKey, AssetRecordsFilter, DagsterInstance

from training_code.lib import training_set as ts
from training_code.lib.shard_format import open_shard, read_manifest, shards_for_split
from training_code.lib.storage import is_s3, join, read_bytes

PAGE = 1000
LATEST = "latest"  # `zero-assets lineage` with no checkpoint named: the newest one


@dataclass(frozen=True)
class Materialization:
    asset: str
    run_id: str
    metadata: dict[str, Any]

    @property
    def uri(self) -> str:
        return str(self.metadata.get("dagster/uri", ""))

    def upstream_uri(self, asset: str) -> str | None:
        entry = (self.metadata.get("upstream") or {}).get(asset)
        return entry["uri"] if entry else None


def materializations(instance: DagsterInstance, asset: str, partition: str | None = None) -> Iterator[Materialization]:
    """Every materialization of `asset` (of one source's partition when given), newest first."""
    cursor = None
    records_filter = AssetRecordsFilter(asset_key=AssetKey(asset), asset_partitions=[partition]) if partition else AssetKey(asset)
    while True:
        page = instance.fetch_materializations(records_filter, limit=PAGE, cursor=cursor)
        for record in page.records:
            event = record.asset_materialization
            yield Materialization(asset, record.run_id, {k: v.value for k, v in event.metadata.items()})
        if not page.has_more:
            return
        cursor = page.cursor


def _find(instance: DagsterInstance, asset: str, uri: str, partition: str | None = None) -> Materialization:
    for found in materializations(instance, asset, partition):
        if found.uri == uri:
            return found
    raise LookupError(f"no materialization of {asset} wrote {uri}")


@dataclass
class CheckpointLineage:
    checkpoint: Materialization
    warm: Materialization
    training_set: Materialization
    shard_sets: dict[str, Materialization]  # source -> its shard set in the training set
    validated_sets: dict[str, Materialization]  # source -> the validated set those shards were built from
    train_images: pd.DataFrame  # source, key, sha256 of every image the training read (excluded rows left out)
    reports: list[Materialization]


def find_checkpoint(instance: DagsterInstance, checkpoint_uri_or_run_id: str = LATEST) -> Materialization:
    """The trained_checkpoint materialization with that uri or run id; `LATEST`: the newest one."""
    for found in materializations(instance, "trained_checkpoint"):
        if checkpoint_uri_or_run_id in (found.uri, found.run_id, LATEST):
            return found
    if checkpoint_uri_or_run_id == LATEST:
        raise LookupError("no trained_checkpoint materialization in this instance yet: materialize the graph first ($DAGSTER_HOME)")
    raise LookupError(f"{checkpoint_uri_or_run_id!r} is neither the uri nor the run id of a trained_checkpoint materialization")


def _trained_from(instance: DagsterInstance, checkpoint: Materialization) -> tuple[Materialization, Materialization]:
    """The warm shards and the training set a checkpoint was trained from."""
    warm = _find(instance, "fsx_warm_state", checkpoint.upstream_uri("fsx_warm_state"))
    return warm, _find(instance, "training_set", warm.upstream_uri("training_set"))


def checkpoint_lineage(instance: DagsterInstance, checkpoint: Materialization) -> CheckpointLineage:
    warm, chosen = _trained_from(instance, checkpoint)
    manifest = _training_set_manifest(chosen.uri)
    shard_sets, validated_sets = {}, {}
    for source in manifest["sources"]:
        name = source["source"]
        shard_sets[name] = _find(instance, "arrow_shards", source["shards_uri"], name)
        validated_sets[name] = _find(instance, "validated_images", source["validated_uri"], name)
    reports = [r for r in materializations(instance, "map_report") if r.upstream_uri("trained_checkpoint") == checkpoint.uri]
    return CheckpointLineage(checkpoint, warm, chosen, shard_sets, validated_sets, _train_images(chosen.uri, warm.uri), reports)


@lru_cache(maxsize=32)
def _training_set_manifest(uri: str) -> dict[str, Any]:
    return json.loads(read_bytes(join(uri, ts.MANIFEST)))


@lru_cache(maxsize=32)
def _train_images(training_set_uri: str, warm_uri: str) -> pd.DataFrame:
    """The images the training read: every source's train split, from the key columns only (image
    bytes are not read), less the rows the training set excluded. Shards in an S3 lake are read from
    their verified copy on the warm mount."""
    manifest = _training_set_manifest(training_set_uri)
    excluded = pd.read_parquet(join(training_set_uri, ts.EXCLUDED))
    tables = []
    for source in manifest["sources"]:
        folder = Path(join(warm_uri, source["folder"]) if is_s3(source["shards_uri"]) else source["shards_uri"])
        tables += [open_shard(folder / e["file"]).select(["source", "key", "sha256"]) for e in shards_for_split(read_manifest(folder), "train")]
    if not tables:
        return pd.DataFrame(columns=["source", "key", "sha256"])
    frame = pa.concat_tables(tables).to_pandas()
    left_out = set(zip(excluded["source"], excluded["key"]))
    return frame[[(s, k) not in left_out for s, k in zip(frame["source"], frame["key"])]].reset_index(drop=True)


def image_fate(instance: DagsterInstance, key: str) -> dict[str, Any]:
    """Where one raw image went: its verdict in its source's latest validated set, whether the latest
    training set left it out, and the checkpoints it reached."""
    source = key.partition("/")[0]
    latest = next(materializations(instance, "validated_images", source), None)
    if latest is None:
        return {"key": key, "status": "not yet processed", "detail": f"validated_images was never materialized for source {source}"}
    fate = _verdict(latest.uri, key)
    chosen = next(materializations(instance, "training_set"), None)
    if fate["status"] == "accepted" and chosen is not None:
        excluded = pd.read_parquet(join(chosen.uri, ts.EXCLUDED))
        reason = excluded.loc[(excluded["source"] == source) & (excluded["key"] == key), "reason"]
        if not reason.empty:
            fate.update(status="excluded from the training set", reason=reason.iloc[0], training_set=chosen.uri)
    fate["checkpoints"] = []
    for checkpoint in materializations(instance, "trained_checkpoint"):
        # only the images it trained on: not the shard-set, validated-set and report walks of checkpoint_lineage
        warm, trained_on = _trained_from(instance, checkpoint)
        if (key == _train_images(trained_on.uri, warm.uri)["key"]).any():
            fate["checkpoints"].append(checkpoint.uri)
    return fate


def _verdict(validated_uri: str, key: str) -> dict[str, Any]:
    def rows(table: str) -> pd.DataFrame:
        frame = pd.read_parquet(join(validated_uri, table))
        return frame[frame["key"] == key]

    if not (accepted := rows("accepted.parquet")).empty:
        row = accepted.iloc[0]
        return {"key": key, "status": "accepted", "split": row["split"], "sha256": row["sha256"]}
    if not (quarantined := rows("quarantine.parquet")).empty:
        row = quarantined.iloc[0]
        return {"key": key, "status": "quarantined", "reason": row["reason"], "stage": row["stage"], "error": row["error"]}
    if not (duplicate := rows("duplicates.parquet")).empty:
        return {"key": key, "status": "duplicate", "duplicate_of": duplicate.iloc[0]["duplicate_of"]}
    return {"key": key, "status": "not yet processed", "detail": f"not in the latest validated set {validated_uri}"}
