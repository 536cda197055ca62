"""Answer lineage questions from Dagster's own provenance and the manifests the assets wrote.

Dagster tags every materialization with the data version and the event (storage id) of each upstream
asset it read (`dagster/input_data_version/<asset>`, `dagster/input_event_pointer/<asset>`). A
checkpoint is walked back by those pointers: checkpoint -> fsx_warm_state -> training_set. The
training set's manifest names each source's shard set and the validated set it was built from; for a
per-source upstream Dagster points at the asset's newest event of any source, so a source's own
materialization is the newest of its partition at or before that pointer. Files are read through the
storage layer, so a lake on S3 (at any endpoint) with warm shards on FSx answers like a local one.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import pandas as pd
import pyarrow.parquet as pq
from dagster import AssetKey, AssetRecordsFilter, DagsterInstance, DataProvenance, EventLogRecord

from training_code.lib import training_set as ts
from training_code.lib.storage import join, read_bytes
from zero_assets.core.fingerprints import DATA_VERSION_TAG

PAGE = 1000
LATEST = "latest"  # `zero-assets lineage` with no checkpoint named: the newest one


@dataclass(frozen=True)
class Materialization:
    asset: str
    partition: str | None
    storage_id: int
    run_id: str
    metadata: dict[str, Any]
    tags: dict[str, str]

    @classmethod
    def of(cls, record: EventLogRecord) -> Materialization:
        event = record.asset_materialization
        return cls(
            event.asset_key.to_user_string(),
            record.partition_key,
            record.storage_id,
            record.run_id,
            {k: v.value for k, v in event.metadata.items()},
            dict(event.tags or {}),
        )

    @property
    def name(self) -> str:
        return f"{self.asset}[{self.partition}]" if self.partition else self.asset

    @property
    def uri(self) -> str:
        return str(self.metadata.get("dagster/uri", ""))

    @property
    def data_version(self) -> str | None:
        return self.tags.get(DATA_VERSION_TAG)

    def _recorded(self, upstream: str) -> tuple[str, int] | None:
        provenance, key = DataProvenance.from_tags(self.tags), AssetKey(upstream)
        if provenance is None or not provenance.has_input_asset(key) or provenance.input_storage_ids[key] is None:
            return None
        return provenance.input_data_versions[key].value, provenance.input_storage_ids[key]

    def pointer(self, upstream: str) -> int | None:
        """The storage id of the `upstream` event Dagster recorded this materialization read; None when it
        recorded none."""
        recorded = self._recorded(upstream)
        return recorded[1] if recorded else None

    def read_from(self, upstream: str) -> tuple[str, int]:
        """The data version and the event storage id of `upstream` that Dagster recorded this materialization read."""
        recorded = self._recorded(upstream)
        if recorded is None:
            raise LookupError(
                f"materialization {self.storage_id} of {self.name} (run {self.run_id}) has no Dagster provenance for "
                f"its input {upstream} (tag dagster/input_event_pointer/{upstream}); re-materialize it"
            )
        return recorded


def materializations(
    instance: DagsterInstance, asset: str, partition: str | None = None, before_storage_id: int | None = None
) -> Iterator[Materialization]:
    """Every materialization of `asset` (of one source's partition when given), newest first."""
    cursor = None
    records_filter = AssetRecordsFilter(
        asset_key=AssetKey(asset),
        asset_partitions=[partition] if partition else None,
        before_storage_id=before_storage_id,
    )
    while True:
        page = instance.fetch_materializations(records_filter, limit=PAGE, cursor=cursor)
        yield from (Materialization.of(record) for record in page.records)
        if not page.has_more:
            return
        cursor = page.cursor


def upstream_of(instance: DagsterInstance, found: Materialization, asset: str) -> Materialization:
    """The materialization of the unpartitioned `asset` that `found` was built from: the event Dagster points at."""
    version, pointer = found.read_from(asset)
    records = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey(asset), storage_ids=[pointer]), limit=1
    ).records
    if not records:
        raise LookupError(
            f"{found.name} (run {found.run_id}) was built from {asset} event {pointer}, which this Dagster instance "
            "no longer holds (wiped?)"
        )
    upstream = Materialization.of(records[0])
    if upstream.data_version != version:
        raise LookupError(
            f"{found.name} (run {found.run_id}) read {asset} at data version {version}, but the event it points at "
            f"({pointer}) has {upstream.data_version}"
        )
    return upstream


def source_upstream_of(
    instance: DagsterInstance, found: Materialization, asset: str, source: str, uri: str
) -> Materialization:
    """The materialization of `asset` for `source` that `found` was built from, which wrote `uri`.

    Dagster's pointer for a partitioned upstream is that asset's newest event when the step started,
    of any source; the source's own is then the newest of its partition at or before the pointer."""
    _, pointer = found.read_from(asset)
    upstream = next(materializations(instance, asset, source, before_storage_id=pointer + 1), None)
    if upstream is None or upstream.uri != uri:
        held = upstream.uri if upstream else "none"
        raise LookupError(
            f"{found.name} (run {found.run_id}) names {uri} as {asset} of source {source}, but that source's "
            f"materialization current at Dagster's pointer {pointer} wrote {held}"
        )
    return upstream


@dataclass
class CheckpointLineage:
    checkpoint: Materialization
    warm: Materialization
    training_set: Materialization
    shard_sets: dict[str, Materialization]  # source -> its shard set in the training set
    validated_sets: dict[str, Materialization]  # source -> the validated set those shards were built from
    train_images: pd.DataFrame  # source, key, sha256 of every image the training read (excluded rows left out)
    reports: list[Materialization]

    @property
    def warm_s3_uri(self) -> str | None:
        """The S3 side of warm shards on FSx (`fsx://...`): the same bytes, recorded by the warm step."""
        return self.warm.metadata.get("warm_s3_uri")


def find_checkpoint(instance: DagsterInstance, checkpoint_uri_or_run_id: str = LATEST) -> Materialization:
    """The trained_checkpoint materialization with that uri or run id; `LATEST`: the newest one."""
    for found in materializations(instance, "trained_checkpoint"):
        if checkpoint_uri_or_run_id in (found.uri, found.run_id, LATEST):
            return found
    if checkpoint_uri_or_run_id == LATEST:
        raise LookupError(
            "no trained_checkpoint materialization in this instance yet: materialize the graph first ($DAGSTER_HOME)"
        )
    raise LookupError(
        f"{checkpoint_uri_or_run_id!r} is neither the uri nor the run id of a trained_checkpoint materialization"
    )


def _trained_from(instance: DagsterInstance, checkpoint: Materialization) -> tuple[Materialization, Materialization]:
    """The warm shards and the training set a checkpoint was trained from."""
    warm = upstream_of(instance, checkpoint, "fsx_warm_state")
    return warm, upstream_of(instance, warm, "training_set")


def checkpoint_lineage(instance: DagsterInstance, checkpoint: Materialization) -> CheckpointLineage:
    warm, chosen = _trained_from(instance, checkpoint)
    shard_sets, validated_sets = {}, {}
    for source in _training_set_manifest(chosen.uri)["sources"]:
        name = source["source"]
        shards = source_upstream_of(instance, chosen, "arrow_shards", name, source["shards_uri"])
        if shards.data_version != source["data_version"]:
            raise LookupError(
                f"{chosen.uri} lists source {name}'s shards at data version {source['data_version']}, "
                f"its materialization {shards.storage_id} has {shards.data_version}"
            )
        shard_sets[name] = shards
        validated_sets[name] = source_upstream_of(instance, shards, "validated_images", name, source["validated_uri"])
    return CheckpointLineage(
        checkpoint, warm, chosen, shard_sets, validated_sets, _train_images(chosen.uri), _reports(instance, checkpoint)
    )


def _reports(instance: DagsterInstance, checkpoint: Materialization) -> list[Materialization]:
    """The map_report materializations Dagster recorded reading a materialization of this checkpoint (a
    cache hit records the same uri again); a report recorded outside a Dagster step names none."""
    same = {
        found.storage_id for found in materializations(instance, "trained_checkpoint") if found.uri == checkpoint.uri
    }
    return [
        report for report in materializations(instance, "map_report") if report.pointer("trained_checkpoint") in same
    ]


@lru_cache(maxsize=32)
def _training_set_manifest(uri: str) -> dict[str, Any]:
    return json.loads(read_bytes(join(uri, ts.MANIFEST)))


def _parquet(uri: str, columns: list[str] | None = None) -> pd.DataFrame:
    """A Parquet table (some columns, or all), local or on S3 (the storage layer's endpoint and retries)."""
    return pq.read_table(io.BytesIO(read_bytes(uri)), columns=columns).to_pandas()


@lru_cache(maxsize=32)
def _excluded(training_set_uri: str) -> pd.DataFrame:
    return _parquet(join(training_set_uri, ts.EXCLUDED), ["source", "key", "reason"])


@lru_cache(maxsize=128)
def _trained_rows(training_set_uri: str, source: str) -> pd.DataFrame:
    """One source's images the training read: its shard set holds exactly the train rows of the
    validated set it was built from (the validated table's key and sha256 columns, so no shard is
    downloaded; the count is checked against the shard manifest), less the rows the training set excluded."""
    entry = next(s for s in _training_set_manifest(training_set_uri)["sources"] if s["source"] == source)
    accepted = _parquet(join(entry["validated_uri"], "accepted.parquet"), ["key", "sha256", "split"])
    train = accepted[accepted["split"] == "train"]
    in_shards = sum(shard["rows"] for shard in entry["shards"] if shard["split"] == "train")
    if len(train) != in_shards:
        raise ValueError(
            f"{entry['validated_uri']}/accepted.parquet has {len(train)} train rows, but the shard set "
            f"{entry['shards_uri']} lists {in_shards}: it was not built from that validated set"
        )
    excluded = _excluded(training_set_uri)
    left_out = set(excluded.loc[excluded["source"] == source, "key"])
    kept = train[~train["key"].isin(left_out)]
    return pd.DataFrame({"source": source, "key": kept["key"].to_numpy(), "sha256": kept["sha256"].to_numpy()})


def _train_images(training_set_uri: str) -> pd.DataFrame:
    frames = [_trained_rows(training_set_uri, s["source"]) for s in _training_set_manifest(training_set_uri)["sources"]]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["source", "key", "sha256"])


def image_fate(instance: DagsterInstance, key: str) -> dict[str, Any]:
    """Where one raw image went: its verdict in its source's latest validated set, whether the latest
    training set left it out, and the checkpoints it reached."""
    source = key.partition("/")[0]
    latest = next(materializations(instance, "validated_images", source), None)
    if latest is None:
        return {
            "key": key,
            "status": "not yet processed",
            "detail": f"validated_images was never materialized for source {source}",
        }
    fate = _verdict(latest.uri, key)
    chosen = next(materializations(instance, "training_set"), None)
    if fate["status"] == "accepted" and chosen is not None:
        excluded = _excluded(chosen.uri)
        reason = excluded.loc[(excluded["source"] == source) & (excluded["key"] == key), "reason"]
        if not reason.empty:
            fate.update(status="excluded from the training set", reason=reason.iloc[0], training_set=chosen.uri)
    fate["checkpoints"] = []
    for checkpoint in materializations(instance, "trained_checkpoint"):
        # only the images it trained on: not the shard-set, validated-set and report walks of checkpoint_lineage
        _, trained_on = _trained_from(instance, checkpoint)
        if (
            source in {s["source"] for s in _training_set_manifest(trained_on.uri)["sources"]}
            and (key == _trained_rows(trained_on.uri, source)["key"]).any()
        ):
            fate["checkpoints"].append(checkpoint.uri)
    return fate


def _verdict(validated_uri: str, key: str) -> dict[str, Any]:
    def rows(table: str) -> pd.DataFrame:
        frame = _parquet(join(validated_uri, table))
        return frame[frame["key"] == key]

    if not (accepted := rows("accepted.parquet")).empty:
        row = accepted.iloc[0]
        return {"key": key, "status": "accepted", "split": row["split"], "sha256": row["sha256"]}
    if not (quarantined := rows("quarantine.parquet")).empty:
        row = quarantined.iloc[0]
        return {
            "key": key,
            "status": "quarantined",
            "reason": row["reason"],
            "stage": row["stage"],
            "error": row["error"],
        }
    if not (duplicate := rows("duplicates.parquet")).empty:
        return {"key": key, "status": "duplicate", "duplicate_of": duplicate.iloc[0]["duplicate_of"]}
    return {"key": key, "status": "not yet processed", "detail": f"not in the latest validated set {validated_uri}"}
