"""Answer lineage questions from the Dagster instance and the manifests the assets wrote.

Each job-backed materialization records `upstream` (asset -> uri, data version), so a checkpoint can
be walked back to its warm shards, shard set and validated set; the shards say which images trained it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

import pandas as pd
import pyarrow as pa
from dagster import AssetKey, DagsterInstance

from training_code.lib.shard_format import open_shard, read_manifest, shards_for_split
from training_code.lib.storage import is_s3, join

PAGE = 1000
LATEST = "latest"  # `zero-assets lineage` with no checkpoint named: the newest one


@dataclass(frozen=True)
class Materialization:
    asset: str
    run_id: str
    metadata: dict[str, Any]

    @property
    def uri(self) -> str:
        return str(self.metadata.get("uri", ""))

    def upstream_uri(self, asset: str) -> str | None:
        entry = (self.metadata.get("upstream") or {}).get(asset)
        return entry["uri"] if entry else None


def materializations(instance: DagsterInstance, asset: str) -> Iterator[Materialization]:
    """Every materialization of `asset`, newest first."""
    cursor = None
    while True:
        page = instance.fetch_materializations(AssetKey(asset), limit=PAGE, cursor=cursor)
        for record in page.records:
            event = record.asset_materialization
            yield Materialization(asset, record.run_id, {k: v.value for k, v in event.metadata.items()})
        if not page.has_more:
            return
        cursor = page.cursor


def _find(instance: DagsterInstance, asset: str, uri: str) -> Materialization:
    for found in materializations(instance, asset):
        if found.uri == uri:
            return found
    raise LookupError(f"no materialization of {asset} wrote {uri}")


@dataclass
class CheckpointLineage:
    checkpoint: Materialization
    warm: Materialization
    shards: Materialization
    validated: Materialization
    train_images: pd.DataFrame  # source, key, sha256 of every image in the train shards
    reports: list[Materialization]


def find_checkpoint(instance: DagsterInstance, checkpoint_uri_or_run_id: str = LATEST) -> Materialization:
    """The trained_checkpoint materialization with that uri or run id; `LATEST`: the newest one."""
    for found in materializations(instance, "trained_checkpoint"):
        if checkpoint_uri_or_run_id in (found.uri, found.run_id, LATEST):
            return found
    if checkpoint_uri_or_run_id == LATEST:
        raise LookupError("no trained_checkpoint materialization in this instance yet: materialize the graph first ($DAGSTER_HOME)")
    raise LookupError(f"{checkpoint_uri_or_run_id!r} is neither the uri nor the run id of a trained_checkpoint materialization")


def checkpoint_lineage(instance: DagsterInstance, checkpoint: Materialization) -> CheckpointLineage:
    warm = _find(instance, "fsx_warm_state", checkpoint.upstream_uri("fsx_warm_state"))
    shards = _find(instance, "arrow_shards", warm.upstream_uri("arrow_shards"))
    validated = _find(instance, "validated_images", shards.upstream_uri("validated_images"))
    reports = [r for r in materializations(instance, "map_report") if r.upstream_uri("trained_checkpoint") == checkpoint.uri]
    # Shards in an S3 lake are read from their verified copy on the warm mount instead.
    local_shards = warm.uri if is_s3(shards.uri) else shards.uri
    return CheckpointLineage(checkpoint, warm, shards, validated, _train_images(local_shards), reports)


@lru_cache(maxsize=32)
def _train_images(shards_folder: str) -> pd.DataFrame:
    """The images in a shard set's train split, from the key columns only (image bytes are not read)."""
    folder = Path(shards_folder)
    tables = [open_shard(folder / e["file"]).select(["source", "key", "sha256"]) for e in shards_for_split(read_manifest(folder), "train")]
    if not tables:
        return pd.DataFrame(columns=["source", "key", "sha256"])
    return pa.concat_tables(tables).to_pandas()


def image_fate(instance: DagsterInstance, key: str) -> dict[str, Any]:
    """Where one raw image went: its verdict in the latest validated set and the checkpoints it reached."""
    latest = next(materializations(instance, "validated_images"), None)
    if latest is None:
        return {"key": key, "status": "not yet processed", "detail": "validated_images was never materialized"}
    fate = _verdict(latest.uri, key)
    fate["checkpoints"] = [
        c.uri for c in materializations(instance, "trained_checkpoint")
        if (key == checkpoint_lineage(instance, c).train_images["key"]).any()
    ]
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
