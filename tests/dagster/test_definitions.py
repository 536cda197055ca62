"""The code location loads and wires the assets as one lineage chain: raw data and the per-source
assets (index, validation) partitioned by source, then the unpartitioned tail: the training set (the
selection), its shards, the warm state, training and the report."""

import subprocess
import sys

from dagster import AssetKey

from zero_assets.definitions import defs

CHAIN = [
    "raw_data",
    "raw_image_index",
    "validated_images",
    "training_set",
    "arrow_shards",
    "fsx_warm_state",
    "trained_checkpoint",
    "map_report",
]
PER_SOURCE = {"raw_data", "raw_image_index", "validated_images"}


def test_assets_form_one_lineage_chain_partitioned_by_source_up_to_the_selection():
    graph = defs.resolve_asset_graph()
    assert {k.to_user_string() for k in graph.get_all_asset_keys()} == {
        *CHAIN,
        "training_rehearsal",
        "tuned_hyperparameters",
    }
    for upstream, downstream in zip(CHAIN, CHAIN[1:]):
        assert AssetKey(upstream) in graph.get(AssetKey(downstream)).parent_keys
    for name in CHAIN:
        partitions = graph.get(AssetKey(name)).partitions_def
        assert (getattr(partitions, "name", None) == "raw_sources") == (name in PER_SOURCE), name
    assert not graph.get(AssetKey("raw_data")).is_materializable, "raw data is observed, never materialized here"
    assert graph.get(AssetKey("trained_checkpoint")).pools == {"training"}


def test_map_report_reads_the_warm_shards_and_the_checkpoint():
    parents = defs.resolve_asset_graph().get(AssetKey("map_report")).parent_keys
    assert parents == {AssetKey("trained_checkpoint"), AssetKey("fsx_warm_state")}


def test_the_rehearsal_reads_the_warm_shards_and_feeds_nothing():
    graph = defs.resolve_asset_graph()
    assert graph.get(AssetKey("training_rehearsal")).parent_keys == {AssetKey("fsx_warm_state")}
    assert not graph.get(AssetKey("training_rehearsal")).child_keys, "a gate, never an input of training"
    assert graph.get(AssetKey("training_rehearsal")).pools == {"training"}


def test_the_tuning_reads_the_warm_shards_outside_the_whole_graph_job():
    graph = defs.resolve_asset_graph()
    assert graph.get(AssetKey("tuned_hyperparameters")).parent_keys == {AssetKey("fsx_warm_state")}
    # An optional input of training (its `use_tuning`), named in the checkpoint's metadata: an edge would
    # make every "Materialize all" warn that it was never materialized.
    assert not graph.get(AssetKey("tuned_hyperparameters")).child_keys
    assert graph.get(AssetKey("tuned_hyperparameters")).pools == {"training"}
    whole = defs.resolve_job_def("zero_whole_graph").asset_layer.selected_asset_keys
    assert AssetKey("tuned_hyperparameters") not in whole and AssetKey("trained_checkpoint") in whole


def test_dagster_cli_validates_the_code_location():
    result = subprocess.run(
        [sys.executable, "-m", "dagster", "definitions", "validate", "-m", "zero_assets.definitions"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_unknown_backend_is_rejected_with_the_variable_name(monkeypatch):
    from zero_assets.backends.from_env import resources_from_env

    monkeypatch.setenv("ZERO_BACKEND", "kubernetes")
    try:
        resources_from_env()
    except ValueError as error:
        assert "ZERO_BACKEND" in str(error) and "kubernetes" in str(error)
    else:
        raise AssertionError("an unknown backend must be rejected")


def test_jobs_sensor_schedule_and_checks_are_wired():
    assert {"zero_whole_graph", "zero_per_source", "zero_training_tail", "campaign_readiness"} <= {
        j.name for j in defs.jobs
    }
    assert {s.name for s in defs.sensors} == {
        "new_raw_data_sensor",
        "map_report_freshness_sensor",
        "run_cost_on_success",
        "run_cost_on_failure",
        "run_cost_on_canceled",
        "training_plan_start_sensor",
        "campaign_readiness_sensor",
        "orphaned_jobs_sensor",
    }
    assert {s.name for s in defs.schedules} == {"weekly_full_refresh"}
    checks = {k.name for k in defs.resolve_asset_graph().asset_check_keys}
    assert checks == {
        "quarantine_rate_under_limit",
        "val_share_held",
        "shard_manifest_integrity",
        "map_not_regressed",
        "gpu_utilization_held",
        "freshness_check",
        "rehearsal_passed",
        "campaign_ready",
    }
