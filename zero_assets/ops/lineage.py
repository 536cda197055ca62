"""Answer lineage questions from Dagster's own provenance and the manifests the assets wrote: a checkpoint is
walked back by Dagster's input event pointers to its warm set, shard set, selection and validated sets; the
images it trained on are the selection's train rows, so no shard is read.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import pandas as pd
from dagster import DagsterInstance

from training_code.lib import training_set as ts
from training_code.lib.parquet_bytes import read_parquet_bytes
from training_code.lib.raw_index import INDEX_FILE
from training_code.lib.selection_engine import explain
from training_code.lib.shard_format import MANIFEST, MASKED, ROWS
from training_code.lib.storage import join, read_bytes
from training_code.lib.verified_read import read_verified
from zero_assets.ops.provenance import Materialization, materializations, source_upstream_of, upstream_of

__all__ = ["LATEST", "CheckpointLineage", "Materialization", "checkpoint_lineage", "find_checkpoint", "image_fate"]
LATEST = "latest"  # `zero-assets lineage` with no checkpoint named: the newest one


@dataclass
class CheckpointLineage:
    checkpoint: Materialization
    warm: Materialization  # the warm set training read
    shard_set: Materialization  # the arrow_shards output warmed
    training_set: Materialization  # the selection those shards were packed from
    validated_sets: dict[str, Materialization]  # source -> the validated set the selection took its images from
    sources: list[dict[str, Any]]  # the selection manifest's per-source counts (accepted, selected, excluded)
    shards: list[dict[str, Any]]  # the shard set's manifest entries (path, split, rows, masked ...)
    train_images: pd.DataFrame  # source, key, sha256 of every image the training read
    reports: list[Materialization]

    @property
    def warm_s3_uri(self) -> str | None:
        """The S3 side of warm shards on FSx (`fsx://...`): the same bytes, recorded by the warm step."""
        return self.warm.metadata.get("warm_s3_uri")

    def lines(self) -> list[str]:
        """What `zero-assets lineage` prints, in the graph's order from the checkpoint back."""
        earlier = sum(not e["path"].startswith("shards/") for e in self.shards)
        masked = sum(e.get("masked", 0) for e in self.shards)
        lines = [
            f"checkpoint   {self.checkpoint.uri}  (run {self.checkpoint.run_id})",
            f"warm shards  {self.warm.uri}" + (f"  (S3 side {self.warm_s3_uri})" if self.warm_s3_uri else ""),
            f"shard set    {self.shard_set.uri}  ({len(self.shards)} shards, {earlier} kept from earlier sets; "
            f"{sum(e['rows'] for e in self.shards) - masked} rows, {masked} masked)",
            f"training set {self.training_set.uri}  (selected {sum(s['selected'] for s in self.sources)} of "
            f"{sum(s['accepted'] for s in self.sources)} accepted images of {len(self.sources)} sources)",
        ]
        for source in self.sources:
            lines.append(
                f"validated    {source['source']}: {self.validated_sets[source['source']].uri}  (selected "
                f"{source['selected']} of {source['accepted']} accepted, {source['excluded']} excluded)"
            )
        for report in self.reports:
            scores = f"mAP={_plain(report.metadata.get('mAP'))} mAP@0.5={_plain(report.metadata.get('mAP_50'))}"
            lines.append(f"scored by    {report.uri}  {scores}")
        lines.append(f"trained on   {len(self.train_images)} images (source, key, sha256):")
        lines += [f"  {row.source}\t{row.key}\t{row.sha256}" for row in self.train_images.itertuples(index=False)]
        return lines


def _plain(value: object) -> object:
    return round(value, 4) if isinstance(value, float) else value


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


def _trained_from(
    instance: DagsterInstance, checkpoint: Materialization
) -> tuple[Materialization, Materialization, Materialization]:
    """The warm set, the shard set and the selection a checkpoint was trained from."""
    warm = upstream_of(instance, checkpoint, "fsx_warm_state")
    shards = upstream_of(instance, warm, "arrow_shards")
    chosen = upstream_of(instance, shards, "training_set")
    packed_from = _json(join(shards.uri, MANIFEST)).get("selection", {})
    if packed_from.get("data_version") != chosen.data_version:
        raise LookupError(
            f"{shards.uri}/{MANIFEST} says it packed the selection at data version {packed_from.get('data_version')}, "
            f"but the training_set materialization Dagster recorded it read ({chosen.uri}) has {chosen.data_version}"
        )
    return warm, shards, chosen


def checkpoint_lineage(instance: DagsterInstance, checkpoint: Materialization) -> CheckpointLineage:
    warm, shards, chosen = _trained_from(instance, checkpoint)
    sources = _json(join(chosen.uri, ts.MANIFEST))["sources"]
    validated_sets = {}
    for source in sources:
        name = source["source"]
        found = source_upstream_of(instance, chosen, "validated_images", name, source["validated_uri"])
        if found.data_version != source["data_version"]:
            raise LookupError(
                f"{chosen.uri} took source {name}'s images at data version {source['data_version']}, "
                f"its validated_images materialization {found.storage_id} has {found.data_version}"
            )
        validated_sets[name] = found
    shard_entries = _json(join(shards.uri, MANIFEST))["shards"]
    trained, reports = _trained_rows(chosen.uri, shards.uri), _reports(instance, checkpoint)
    return CheckpointLineage(checkpoint, warm, shards, chosen, validated_sets, sources, shard_entries, trained, reports)


def _reports(instance: DagsterInstance, checkpoint: Materialization) -> list[Materialization]:
    """The map_report materializations Dagster recorded reading any materialization of this checkpoint's uri."""
    same = {
        found.storage_id for found in materializations(instance, "trained_checkpoint") if found.uri == checkpoint.uri
    }
    return [
        report for report in materializations(instance, "map_report") if report.pointer("trained_checkpoint") in same
    ]


@lru_cache(maxsize=64)
def _json(uri: str) -> dict[str, Any]:
    return json.loads(read_bytes(uri))


@lru_cache(maxsize=64)
def _table(uri: str, columns: tuple[str, ...]) -> pd.DataFrame:
    """Some columns of a Parquet table its folder's manifest vouches for, local or on S3."""
    return read_parquet_bytes(read_verified(uri), columns).to_pandas()


@lru_cache(maxsize=32)
def _trained_rows(training_set_uri: str, shards_uri: str) -> pd.DataFrame:
    """The selection's train rows, checked against the shard set's live train row count."""
    selected = _table(join(training_set_uri, ts.SELECTION), ("source", "key", "sha256", "split"))
    train = selected[selected["split"] == "train"]
    live = _json(join(shards_uri, MANIFEST))["rows"]["train"]
    if len(train) != live:
        raise ValueError(
            f"{training_set_uri}/{ts.SELECTION} selects {len(train)} train images, but the shard set {shards_uri} "
            f"holds {live} live train rows: it was not packed from that selection"
        )
    return train[["source", "key", "sha256"]].reset_index(drop=True)


def image_fate(instance: DagsterInstance, key: str) -> dict[str, Any]:
    """One raw image's verdict, selection, shards and the checkpoints trained on it."""
    source = key.partition("/")[0]
    _require_indexed(instance, source, key)
    latest = next(materializations(instance, "validated_images", source), None)
    if latest is None:
        detail = f"validated_images was never materialized for source {source}"
        return {"key": key, "status": "not yet processed", "detail": detail}
    fate = _verdict(latest.uri, key)
    chosen = next(materializations(instance, "training_set"), None)
    if fate["status"] == "accepted" and chosen is not None:
        fate.update(_selected(chosen.uri, source, key))
    shards = next(materializations(instance, "arrow_shards"), None)
    fate["shards"] = _held_in(shards.uri, key) if shards is not None else []
    fate["masked"] = any(held["masked"] for held in fate["shards"])
    fate["checkpoints"], changed = [], []
    for checkpoint in materializations(instance, "trained_checkpoint"):
        # Only the images it trained on, not the full checkpoint_lineage walk.
        _, trained_shards, trained_on = _trained_from(instance, checkpoint)
        rows = _trained_rows(trained_on.uri, trained_shards.uri)
        trained = rows.loc[(rows["source"] == source) & (rows["key"] == key), "sha256"]
        if trained.empty:
            continue
        fate["checkpoints"].append(checkpoint.uri)
        if "sha256" in fate and trained.iloc[0] != fate["sha256"]:
            changed.append({"checkpoint": checkpoint.uri, "trained_sha256": trained.iloc[0]})
    fate["trained"] = bool(fate["checkpoints"])
    if changed:
        # The image a checkpoint learned from is not the file there now: edited, replaced or unreadable.
        now = fate.get("sha256") or "unreadable now"
        fate["bytes_changed"] = changed
        fate["bytes_changed_detail"] = (
            f"its bytes changed since {len(changed)} checkpoint(s) trained on it: sha256 then "
            f"{', '.join(sorted({c['trained_sha256'] for c in changed}))}, now {now} "
            f"(latest validated set {latest.uri})"
        )
    return fate


def _require_indexed(instance: DagsterInstance, source: str, key: str) -> None:
    """Raise `LookupError` unless `key` is in the latest index of its source."""
    index = next(materializations(instance, "raw_image_index", source), None)
    if index is None:
        raise LookupError(
            f"{key} is not in the index of any source: source {source!r} (the key's top-level folder) has no "
            f"raw_image_index materialization in this instance ($DAGSTER_HOME); a key is <source>/<path> as the "
            "raw root holds it"
        )
    keys = _table(join(index.uri, INDEX_FILE), ("key",))["key"]
    if not (keys == key).any():
        raise LookupError(
            f"{key} is not in the index of any source: the latest index of source {source} ({index.uri}, "
            f"{len(keys)} images) does not list it; check the key (<source>/<path>, as `zero-assets summary` "
            "counts them), or rematerialize raw_image_index for the source if the file was added since"
        )


def _selected(training_set_uri: str, source: str, key: str) -> dict[str, Any]:
    """What the training set decided for an accepted image: from its files, else by rerunning its policy."""
    selected = _table(join(training_set_uri, ts.SELECTION), ("source", "key", "sha256", "split"))
    if ((selected["source"] == source) & (selected["key"] == key)).any():
        return {"status": "selected", "training_set": training_set_uri}
    excluded = _table(join(training_set_uri, ts.EXCLUDED), ("source", "key", "reason"))
    reason = excluded.loc[(excluded["source"] == source) & (excluded["key"] == key), "reason"]
    if not reason.empty:
        return {"status": "excluded from the training set", "reason": reason.iloc[0], "training_set": training_set_uri}
    chosen = {s["source"] for s in _json(join(training_set_uri, ts.MANIFEST))["sources"]}
    if source in chosen:
        with tempfile.TemporaryDirectory(prefix="zero-lineage-") as scratch:
            decided = explain(training_set_uri, key, Path(scratch))
        if decided is not None and decided["rule"] is not None:
            return {
                "status": "excluded from the training set",
                "reason": decided["reason"],
                "training_set": training_set_uri,
                "detail": "from its policy, run again over the validated sets it chose from",
            }
    why = (
        f"source {source} is not among the training set's sources"
        if source not in chosen
        else "the training set was built from an earlier validated set of its source"
    )
    return {"status": "accepted, not in the training set", "detail": why, "training_set": training_set_uri}


def _held_in(shards_uri: str, key: str) -> list[dict[str, Any]]:
    """The shards holding a row of `key` (from the rows table, no shard read), each with whether it is masked."""
    rows = _table(join(shards_uri, ROWS), ("path", "key"))
    masked = _table(join(shards_uri, MASKED), ("path", "key"))
    hidden = set(masked.loc[masked["key"] == key, "path"])
    return [
        {"shard_set": shards_uri, "path": path, "masked": path in hidden}
        for path in sorted(rows.loc[rows["key"] == key, "path"])
    ]


def _verdict(validated_uri: str, key: str) -> dict[str, Any]:
    def rows(table: str) -> pd.DataFrame:
        frame = read_parquet_bytes(read_bytes(join(validated_uri, table))).to_pandas()
        return frame[frame["key"] == key]

    if not (accepted := rows("accepted.parquet")).empty:
        row = accepted.iloc[0]
        return {"key": key, "status": "accepted", "split": row["split"], "sha256": row["sha256"]}
    if not (quarantined := rows("quarantine.parquet")).empty:
        row = quarantined.iloc[0]
        found = {name: row[name] for name in ("reason", "stage", "error", "sha256")}
        return {"key": key, "status": "quarantined", **found}
    if not (duplicate := rows("duplicates.parquet")).empty:
        row = duplicate.iloc[0]
        return {"key": key, "status": "duplicate", "duplicate_of": row["duplicate_of"], "sha256": row["sha256"]}
    return {"key": key, "status": "not yet processed", "detail": f"not in the latest validated set {validated_uri}"}
