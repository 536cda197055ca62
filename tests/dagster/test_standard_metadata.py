"""Every materialization carries Dagster's standard metadata, and it tells the truth about the output on
disk: `dagster/row_count` (the rows in the output's own files), `dagster/size_bytes` (the bytes of its
files), `dagster/uri`; table-like assets declare their column schema; cache hits carry the same keys."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import make_resources
from dagster import AssetKey, TableMetadataValue, instance_for_test
from helpers.graph_runs import materialize_graph, materialize_source, materialize_tail

from training_code.lib import training_set as ts
from training_code.lib.shard_format import FORMAT, SHARD_SCHEMA, masked_keys, open_shard, read_manifest, shard_path
from zero_assets.backends.sagemaker.fsx_warm import counted_on_s3
from zero_assets.backends.sagemaker.training_set_channel import FILE_LIST, write_channel_training_set
from zero_assets.core.output_marker import OUTPUT_MARKER
from zero_assets.definitions import defs
from zero_assets.defs.assets import PER_SOURCE_ASSETS, TAIL_ASSETS
from zero_assets.launch.upstream import latest_materializations

SOURCES = ["line_a_camera", "line_b_camera"]
FAST_TRAINING = {
    "ops": {"trained_checkpoint": {"config": {"max_steps": 4, "checkpoint_every": 4, "batch_size": 2, "processes": 1}}}
}
STANDARD = ("dagster/row_count", "dagster/size_bytes", "dagster/uri")


def latest(instance, asset: str, partition: str | None = None) -> dict:
    [record] = latest_materializations(instance, asset, partition)
    return {k: v.value for k, v in record.asset_materialization.metadata.items()}


def every_latest(instance) -> dict[str, dict]:
    """`asset[source]` or `asset` -> the metadata of its latest materialization."""
    found = {
        f"{a.key.to_user_string()}[{s}]": latest(instance, a.key.to_user_string(), s)
        for a in PER_SOURCE_ASSETS
        for s in SOURCES
    }
    return found | {a.key.to_user_string(): latest(instance, a.key.to_user_string()) for a in TAIL_ASSETS}


def bytes_on_disk(folder: Path) -> int:
    """Every file of an output, as a reader finds it: all but the cache's completeness marker, and the
    shards its manifest lists in other folders (an earlier shard set's, the warm mount's shared folder)."""
    own = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and p.name != OUTPUT_MARKER)
    if not (folder / "manifest.json").is_file() or read_json(folder / "manifest.json").get("format") != FORMAT:
        return own
    elsewhere = [e for e in read_manifest(folder)["shards"] if e["path"].startswith("../")]
    return own + sum(shard_path(folder, e).stat().st_size for e in elsewhere)


def read_json(path: Path):
    return json.loads(path.read_text())


def shard_rows(folder: Path, split: str | None = None) -> list[dict]:
    """(split, key) of every live row of every shard the set at `folder` lists, read from the Arrow files
    themselves (the masked rows left out)."""
    manifest = read_manifest(folder)
    masked = masked_keys(folder, manifest)
    return [
        {"split": entry["split"], "key": key}
        for entry in manifest["shards"]
        if split in (None, entry["split"])
        for key in open_shard(shard_path(folder, entry)).column("key").to_pylist()
        if key not in masked.get(entry["path"], frozenset())
    ]


def rows_in_output(asset: str, folder: Path) -> int | None:
    """The rows a reader finds in the output's files (None: validated_images and map_report, whose counts
    their own tests hold to their files)."""
    if asset == "raw_image_index":
        return len(pd.read_parquet(folder / "index.parquet"))
    if asset == "arrow_shards" or asset == "fsx_warm_state":
        return len(shard_rows(folder))
    if asset == "training_set":
        return ts.read_selection(folder)[1].num_rows
    return None


@pytest.fixture(scope="module")
def graph(tiny_raw_root, tmp_path_factory):
    """The demo graph (two sources, a short training) materialized once for the module."""
    state = tmp_path_factory.mktemp("standard")
    resources = make_resources(tiny_raw_root, state / "state")
    with instance_for_test(temp_dir=str(state)) as instance:
        per_source, tail = materialize_graph(
            tiny_raw_root, instance=instance, resources=resources, run_config=FAST_TRAINING, sources=SOURCES
        )
        assert all(r.success for r in per_source.values()) and tail.success
        yield instance, resources, every_latest(instance)


def test_every_job_logs_json_lines_naming_its_job_asset_rank_and_host(graph):
    _, resources, _ = graph
    jobs = Path(resources["settings"].lake_uri) / "_jobs"
    logs = sorted(jobs.rglob("job.log"))
    assert logs, "the graph ran its jobs"
    seen = set()
    for log in logs:
        # <asset>/<fingerprint16>/runs/<run>/<job>/[hosts/<host>/]opt/ml/output/job.log
        asset, _, _, _, job, *rest = log.relative_to(jobs).parts
        host = rest[1] if rest[0] == "hosts" else "algo-1"
        for line in log.read_text().splitlines():  # a job that logs nothing (map_report) leaves it empty
            record = json.loads(line)  # every line, torchrun's included
            assert {k: record[k] for k in ("job", "asset", "host")} == {"job": job, "asset": asset, "host": host}, line
            assert record["level"] in ("INFO", "WARNING") and record["message"] and record["time"].endswith("+00:00")
            seen.add((asset, record["rank"]))
    assert {"validated_images", "trained_checkpoint"} <= {asset for asset, _ in seen}, seen


def test_every_materialization_records_rows_size_and_uri_of_its_output(graph):
    _, _, metadata = graph
    for label, values in metadata.items():
        asset = label.split("[")[0]
        missing = [key for key in STANDARD if key not in values]
        assert not missing, f"{label} has no {missing}"
        folder = Path(values["dagster/uri"])
        assert isinstance(values["dagster/row_count"], int) and values["dagster/row_count"] >= 0, label
        assert values["dagster/size_bytes"] == bytes_on_disk(folder) > 0, label
        expected = rows_in_output(asset, folder)
        if expected is not None:
            assert values["dagster/row_count"] == expected, label
    # The checkpoint's rows: the train split of the warm shards (the selection's, the duplicate left out).
    warm = Path(metadata["fsx_warm_state"]["dagster/uri"])
    excluded = ts.read_excluded(metadata["training_set"]["dagster/uri"]).column("key").to_pylist()
    assert excluded, "the demo plants a duplicate across sources, excluded from the training set"
    trained_on = shard_rows(warm, "train")
    assert not {row["key"] for row in trained_on} & set(excluded)
    assert metadata["trained_checkpoint"]["dagster/row_count"] == len(trained_on) > 0


def test_shards_declare_their_column_schema_and_summarise_the_shard_list(graph):
    _, _, metadata = graph
    names = [field.name for field in SHARD_SCHEMA]
    declared = {
        asset: [
            c.name
            for c in defs.get_assets_def(asset)
            .specs_by_key[AssetKey(asset)]
            .metadata["dagster/column_schema"]
            .schema.columns
        ]
        for asset in ("raw_image_index", "arrow_shards", "training_set")
    }
    assert declared["arrow_shards"] == names and declared["training_set"] == ts.SELECTION_SCHEMA.names
    index = pd.read_parquet(Path(metadata[f"raw_image_index[{SOURCES[0]}]"]["dagster/uri"]) / "index.parquet")
    assert declared["raw_image_index"] == list(index.columns)
    _, selection = ts.read_selection(metadata["training_set"]["dagster/uri"])
    assert selection.schema.names == declared["training_set"], "the declared schema is the selection's own"
    values = metadata["arrow_shards"]
    folder = Path(values["dagster/uri"])
    files = [shard_path(folder, entry) for entry in read_manifest(folder)["shards"]]
    assert open_shard(files[0]).schema.names == names, "the declared schema is the one the shards are written with"
    assert "shard_table" not in values and "shard_bytes" not in values
    summary = values["shard_sizes"]
    assert isinstance(summary, TableMetadataValue)
    overall = next(r.data for r in summary.records if r.data["split"] == "all")
    assert overall["shards"] == len(files)
    assert overall["bytes_max"] == max(f.stat().st_size for f in files) and overall["bytes_min"] == min(
        f.stat().st_size for f in files
    )
    assert overall["rows_max"] == max(open_shard(f).num_rows for f in files)
    sources = metadata["training_set"]["sources"]
    assert isinstance(sources, TableMetadataValue)
    assert [r.data["source"] for r in sources.records] == SOURCES
    assert sum(r.data["selected"] for r in sources.records) == metadata["training_set"]["dagster/row_count"]


def test_cache_hits_carry_the_standard_keys_of_the_miss(graph, tiny_raw_root):
    instance, resources, built = graph
    # Again on the same instance: every asset a hit on its earlier materialization.
    for source in SOURCES:
        assert materialize_source(source, instance=instance, resources=resources).success
    assert materialize_tail(instance=instance, resources=resources, run_config=FAST_TRAINING).success
    again = every_latest(instance)
    for label, values in again.items():
        assert values["cache"] == "hit", (label, values.get("cache_reason"))
        assert {k: values.get(k) for k in STANDARD} == {k: built[label][k] for k in STANDARD}, label
    # A fresh instance on the same lake: the job-backed assets find the published outputs through their
    # markers alone (no earlier materialization recorded there) and still report the same keys.
    with instance_for_test() as fresh:
        assert materialize_source(SOURCES[0], instance=fresh, resources=resources).success
        for asset in ("validated_images",):
            label, values = f"{asset}[{SOURCES[0]}]", latest(fresh, asset, SOURCES[0])
            assert values["cache"] == "hit", (label, values.get("cache_reason"))
            assert "reused_run_id" not in values, "a hit found through the marker, not this instance's records"
            assert {k: values.get(k) for k in STANDARD} == {k: built[label][k] for k in STANDARD}, label
            # ... and what it was built from, as the miss recorded it
            assert values["upstream"] == built[label]["upstream"], label


def test_fsx_warm_job_counts_what_the_local_warm_counts(graph, tmp_path):
    """The FSx warm job (training_code.warm, run here on a copy of the lake's shard root laid out as the
    SageMaker warm step lays out its channel: the set at `_training_sets/<data version16>/`, its shards
    where arrow_shards wrote them) reports the rows and shard bytes the local warm state did, and as bytes
    what its channel's set holds: the warm step without FSx (`counted_on_s3`) counts the same."""
    instance, _, metadata = graph
    shards_uri = Path(metadata["arrow_shards"]["dagster/uri"])
    [record] = latest_materializations(instance, "arrow_shards", None)
    data_version = record.asset_materialization.tags["dagster/data_version"]
    lake = tmp_path / "lake"
    shutil.copytree(shards_uri.parent, lake / "arrow_shards", ignore=shutil.ignore_patterns(OUTPUT_MARKER))
    channel, listed = write_channel_training_set(str(lake / "arrow_shards" / shards_uri.name), str(lake), data_version)
    root = Path(channel.root)
    assert channel.folder == f"_training_sets/{data_version[:16]}"
    environment = {**os.environ, "SM_CHANNEL_SHARDS": str(root), "ZERO_OPT_ML": str(tmp_path / "opt_ml")}
    environment.pop("DAGSTER_PIPES_CONTEXT", None)
    done = subprocess.run(
        [sys.executable, "-m", "training_code.warm", "--training-set", channel.folder],
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    [event] = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"event": "materialization"')]
    reported, warm = event["metadata"], metadata["fsx_warm_state"]
    assert reported["dagster/row_count"] == warm["dagster/row_count"] == len(shard_rows(root / channel.folder))
    # Each layout's set folder (its manifest names the shards by its own paths) around the same shards.
    shard_bytes = sum(shard.entry["bytes"] for shard in listed)
    local_set = [p for p in Path(warm["dagster/uri"]).iterdir() if p.is_file() and p.name != OUTPUT_MARKER]
    assert warm["dagster/size_bytes"] == shard_bytes + sum(p.stat().st_size for p in local_set)
    beside = [p for p in (root / channel.folder).iterdir() if p.is_file() and p.name != FILE_LIST]
    assert reported["dagster/size_bytes"] == shard_bytes + sum(p.stat().st_size for p in beside)
    assert counted_on_s3(channel, listed) == {
        "shards": reported["shards"],
        "rows": reported["dagster/row_count"],
        "bytes": reported["dagster/size_bytes"],
    }
