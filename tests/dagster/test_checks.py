"""Asset checks run with their assets (the quarantine rate with each source's, the shard manifest with the
one shard set); a failing blocking check stops what depends on it.

Each check is run against a real instance and real outputs: shards the pipeline wrote, on disk and on
the local S3-compatible server. A check that cannot check says so (WARN, `skipped`), never passes.
"""

import json
import os
import shutil
import subprocess
import sys
import typing

import pytest
from conftest import make_resources
from dagster import (
    AssetCheckSeverity,
    AssetMaterialization,
    AssetSelection,
    MetadataValue,
    instance_for_test,
    materialize,
)

from zero_assets.defs.assets import (
    SOURCE_SPECS,
    arrow_shards,
    map_report,
    raw_image_index,
    trained_checkpoint,
    training_set,
    validated_images,
)
from zero_assets.defs.assets.arrow_shards import ShardConfig
from zero_assets.defs.assets.map_report import EvalConfig
from zero_assets.defs.assets.raw_image_index import RawIndexConfig
from zero_assets.defs.assets.trained_checkpoint import TrainConfig
from zero_assets.defs.assets.training_set import TrainingSetConfig
from zero_assets.defs.assets.validated_images import ValidationConfig
from zero_assets.defs.checks import (
    CheckLimits,
    gpu_utilization_held,
    map_not_regressed,
    quarantine_rate_under_limit,
    shard_manifest_integrity,
)
from zero_assets.defs.partitions import RAW_SOURCES

SOURCE = "line_a_camera"  # holds the planted corrupt files
ASSETS = [*SOURCE_SPECS, raw_image_index, validated_images, training_set, arrow_shards]
CHECKS = [quarantine_rate_under_limit, shard_manifest_integrity]
CONFIGS = [RawIndexConfig, ValidationConfig, ShardConfig, TrainingSetConfig, TrainConfig, EvalConfig]


def _run(resources, instance, limit, source=SOURCE):
    instance.add_dynamic_partitions(RAW_SOURCES.name, [source])
    return materialize(
        [*ASSETS, *CHECKS],
        selection=[raw_image_index, validated_images],
        partition_key=source,
        resources={**resources, "limits": CheckLimits()},
        run_config={"ops": {"validated_images": {"config": {"max_quarantine_rate": limit}}}},
        instance=instance,
        raise_on_error=False,
    )


def _run_tail(resources, instance):
    return materialize(
        [*ASSETS, *CHECKS],
        selection=[training_set, arrow_shards],
        resources={**resources, "limits": CheckLimits()},
        instance=instance,
        raise_on_error=False,
    )


def _check_alone(instance, resources, check, source=None, assets=ASSETS):
    """Run one check in a run of its own (as the UI's "Execute" does), judging what is recorded."""
    if source:
        instance.add_dynamic_partitions(RAW_SOURCES.name, [source])
    # The partition goes in as the run tag a partitioned check run carries (materialize refuses a
    # partition key for a selection holding no partitioned asset).
    result = materialize(
        [*assets, check],
        selection=AssetSelection.checks(check),
        tags={"dagster/partition": source} if source else None,
        resources={**resources, "limits": CheckLimits()},
        instance=instance,
        raise_on_error=False,
    )
    evaluations = result.get_asset_check_evaluations()
    failures = [e.step_failure_data.error.message.strip() for e in result.get_step_failure_events()]
    assert len(evaluations) == 1, f"{check.check_key.name} gave no result, it crashed: {failures}"
    return evaluations[0]


def _record(instance, asset, source, metadata):
    """A materialization recorded as if an earlier run had produced these outputs (`source` None: unpartitioned)."""
    if source:
        instance.add_dynamic_partitions(RAW_SOURCES.name, [source])
    instance.report_runless_asset_event(AssetMaterialization(asset_key=asset, partition=source, metadata=metadata))


def _metadata(result, asset):
    return dict(result.asset_materializations_for_node(asset)[0].metadata)


@pytest.fixture(scope="module")
def healthy(tiny_raw_root, tmp_path_factory):
    """One real run of the source's assets and checks, shared by the tests that judge its outputs."""
    with instance_for_test(temp_dir=str(tmp_path_factory.mktemp("instance"))) as instance:
        resources = make_resources(tiny_raw_root, tmp_path_factory.mktemp("state"))
        result = _run(resources, instance, limit=0.5)
        tail = _run_tail(resources, instance)
        assert result.success and tail.success
        yield instance, resources, result, tail


@pytest.mark.slow
def test_checks_pass_on_a_healthy_run(healthy):
    instance, resources, result, tail = healthy
    evaluations = {e.check_name: e for run in (result, tail) for e in run.get_asset_check_evaluations()}
    assert {name: e.passed for name, e in evaluations.items()} == {
        "quarantine_rate_under_limit": True,
        "shard_manifest_integrity": True,
    }
    assert evaluations["shard_manifest_integrity"].metadata["checked"].value == "bytes, sha256, rows"
    # Each source's checks judge that source's materialization, not the latest of another source.
    other = _run(resources, instance, limit=0.5, source="line_b_camera")
    for run in (result, other):
        quarantined = _metadata(run, "validated_images")["quarantined"].value
        evaluation = {e.check_name: e for e in run.get_asset_check_evaluations()}["quarantine_rate_under_limit"]
        assert evaluation.metadata["quarantined"].value == quarantined
    assert _metadata(other, "validated_images")["quarantined"] != _metadata(result, "validated_images")["quarantined"]


@pytest.mark.slow
def test_one_quarantine_limit_for_the_asset_and_its_check(healthy, resources, instance):
    _, _, result, _ = healthy
    evaluation = {e.check_name: e for e in result.get_asset_check_evaluations()}["quarantine_rate_under_limit"]
    assert evaluation.metadata["limit"].value == 0.5, "the check judges by the limit the asset ran with"
    assert evaluation.metadata["limit_from"].value == "the materialization's config"
    # Over the limit the asset itself fails (the validator enforces the same number), so nothing downstream runs.
    strict = _run(resources, instance, limit=0.01)
    assert not strict.success
    assert not strict.asset_materializations_for_node("validated_images")
    # A materialization recorded under a lower limit than its rate (here: the real outputs' metadata,
    # recorded with the limit changed) fails the check with the recorded limit, not some other number.
    metadata = _metadata(result, "validated_images")
    inputs = metadata["fingerprint_inputs"].value
    lowered = {**inputs, "config": {**inputs["config"], "max_quarantine_rate": 0.01}}
    _record(instance, "validated_images", "limit_case", {**metadata, "fingerprint_inputs": MetadataValue.json(lowered)})
    evaluation = _check_alone(instance, resources, quarantine_rate_under_limit, "limit_case")
    assert not evaluation.passed and evaluation.severity == AssetCheckSeverity.ERROR
    assert "limit 1.0%" in evaluation.description and evaluation.metadata["limit"].value == 0.01


def test_the_limit_default_comes_from_the_environment():
    """ZERO_MAX_QUARANTINE_RATE sets the asset config's default, which the launchpad shows."""
    code = (
        "from zero_assets.defs.assets.validated_images import ValidationConfig as C; "
        "print(C.to_config_schema().as_field().config_type.fields['max_quarantine_rate'].default_value)"
    )

    def run(value: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "ZERO_MAX_QUARANTINE_RATE": value}
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)

    assert run("0.37").stdout.strip() == "0.37"
    assert run("").stdout.strip() == "0.2"
    bad = run("lots")
    assert bad.returncode != 0 and "ZERO_MAX_QUARANTINE_RATE='lots' is not a number" in bad.stderr


def test_no_check_crashes_before_its_asset_exists(instance, resources):
    for check, source, asset, where in (
        (quarantine_rate_under_limit, SOURCE, "validated_images", f" for source {SOURCE}"),
        (shard_manifest_integrity, None, "arrow_shards", ""),
    ):
        evaluation = _check_alone(instance, resources, check, source)
        assert not evaluation.passed and evaluation.severity == AssetCheckSeverity.WARN
        assert f"{asset} has no materialization{where} yet" in evaluation.description
        assert "skipped" in evaluation.metadata
    evaluation = _check_alone(instance, resources, map_not_regressed, assets=[map_report])
    assert not evaluation.passed and "map_report has no materialization yet" in evaluation.description


def test_gpu_utilization_warns_under_the_limit_and_says_whether_data_or_model(instance, resources):
    evaluation = _check_alone(instance, resources, gpu_utilization_held, assets=[trained_checkpoint])
    assert not evaluation.passed and "trained_checkpoint has no materialization yet" in evaluation.description
    for metadata, passed, says in [
        ({"gpu_utilization": 0.93, "data_wait_fraction": 0.01}, True, "mean GPU utilisation 93%"),
        ({"gpu_utilization": 0.42, "data_wait_fraction": 0.35}, False, "under 80%; it points at the data pipeline"),
        ({"gpu_utilization": 0.55, "data_wait_fraction": 0.02}, False, "under 80%; it points at the model"),
        ({"gpu_utilization_why": "no GPU: training ran on cpu"}, True, "no GPU figure: no GPU: training ran on cpu"),
    ]:
        _record(instance, "trained_checkpoint", None, metadata)
        evaluation = _check_alone(instance, resources, gpu_utilization_held, assets=[trained_checkpoint])
        assert evaluation.passed == passed and says in evaluation.description, (metadata, evaluation.description)
        if not passed:
            assert evaluation.severity == AssetCheckSeverity.WARN, "a slow GPU warns, it never blocks"


@pytest.mark.slow
def test_integrity_fails_on_a_changed_local_shard(healthy, tmp_path):
    instance, resources, _, tail = healthy
    uri = _metadata(tail, "arrow_shards")["dagster/uri"].value
    copy = tmp_path / "shards"
    shutil.copytree(uri, copy)
    shard = copy / json.loads((copy / "manifest.json").read_text())["shards"][0]["path"]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the sha256 can tell
    shard.write_bytes(bytes(data))
    _record(instance, "arrow_shards", None, {"dagster/uri": MetadataValue.path(str(copy))})
    evaluation = _check_alone(instance, resources, shard_manifest_integrity)
    assert not evaluation.passed and evaluation.severity == AssetCheckSeverity.ERROR
    assert "sha256" in evaluation.description and shard.name in evaluation.description


@pytest.mark.slow
def test_integrity_on_s3_checks_listed_sizes(healthy, s3_env):
    instance, resources, _, tail = healthy
    client = s3_env.client()
    client.create_bucket(Bucket="zero-shards")
    folder = _metadata(tail, "arrow_shards")["dagster/uri"].value
    for root, _, names in os.walk(
        folder
    ):  # the shards, the manifest, and the load_from_disk files in the split folders
        for name in names:
            path = os.path.join(root, name)
            client.upload_file(path, "zero-shards", f"set/{os.path.relpath(path, folder)}")
    _record(instance, "arrow_shards", None, {"dagster/uri": MetadataValue.path("s3://zero-shards/set")})
    evaluation = _check_alone(instance, resources, shard_manifest_integrity)
    assert evaluation.passed and evaluation.metadata["checked"].value == "bytes (from the S3 listing)"
    first = json.loads(open(os.path.join(folder, "manifest.json")).read())["shards"][0]["path"]
    with open(os.path.join(folder, first), "rb") as f:
        client.put_object(Bucket="zero-shards", Key=f"set/{first}", Body=f.read()[:-100])  # truncated
    _record(instance, "arrow_shards", None, {"dagster/uri": MetadataValue.path("s3://zero-shards/set")})
    evaluation = _check_alone(instance, resources, shard_manifest_integrity)
    assert not evaluation.passed and evaluation.severity == AssetCheckSeverity.ERROR
    assert (
        f"s3://zero-shards/set/{first}: " in evaluation.description and "bytes in the listing" in evaluation.description
    )


def test_integrity_is_skipped_not_passed_for_shards_it_cannot_see(instance, resources):
    _record(instance, "arrow_shards", None, {"dagster/uri": MetadataValue.path("fsx://fs-0123/abcd/arrow_shards/x")})
    evaluation = _check_alone(instance, resources, shard_manifest_integrity)
    assert not evaluation.passed and evaluation.severity == AssetCheckSeverity.WARN
    assert "fsx://fs-0123/abcd/arrow_shards/x" in evaluation.metadata["skipped"].value


def test_every_config_field_is_described_and_closed_choices_are_enums():
    from training_code.lib.model import ARCHITECTURES

    for config in CONFIGS:
        shape = config.to_config_schema().as_field().config_type
        for name, field in config.model_fields.items():
            assert field.description, f"{config.__name__}.{name} has no description"
            assert shape.fields[name].description == field.description, (
                f"the launchpad does not show {config.__name__}.{name}'s"
            )
    enums = {"arch": TrainConfig, "split": EvalConfig, "image_encoding": ShardConfig}
    for name, config in enums.items():
        field = config.to_config_schema().as_field().config_type.fields[name]
        assert field.config_type.kind.name == "ENUM", f"{config.__name__}.{name} is a free string in the launchpad"
    arch = TrainConfig.model_fields["arch"].annotation
    assert set(typing.get_args(arch)) == set(ARCHITECTURES), (
        "TrainConfig.arch offers what training_code.lib.model accepts"
    )


def test_map_report_freshness_follows_the_training_cron(instance, resources):
    """Stale until a report exists since the previous training tick; fresh once one is recorded."""
    from zero_assets.defs.automation import train_cron
    from zero_assets.defs.checks import MAP_REPORT_FRESHNESS

    (freshness,) = MAP_REPORT_FRESHNESS

    def evaluate():
        result = materialize(
            [map_report, freshness],
            selection=AssetSelection.checks(freshness),
            resources=resources,
            instance=instance,
            raise_on_error=False,
        )
        (evaluation,) = result.get_asset_check_evaluations()
        return evaluation

    stale = evaluate()
    assert not stale.passed and stale.severity == AssetCheckSeverity.WARN
    params = stale.metadata["dagster/freshness_params"].value
    assert params["deadline_cron"] == train_cron() and params["lower_bound_delta_seconds"] == 24 * 3600
    instance.report_runless_asset_event(AssetMaterialization(asset_key="map_report", metadata={"mAP": 0.5}))
    assert evaluate().passed
