"""Asset checks run with each source's assets; a failing blocking check stops what depends on it."""

import pytest
from dagster import materialize

from zero_assets.assets import SOURCE_SPECS, arrow_shards, raw_image_index, validated_images
from zero_assets.checks import CheckLimits, quarantine_rate_under_limit, shard_manifest_integrity
from zero_assets.partitions import RAW_SOURCES

SOURCE = "line_a_camera"  # holds the planted corrupt files


def _run(resources, instance, limit, source=SOURCE):
    instance.add_dynamic_partitions(RAW_SOURCES.name, [source])
    return materialize(
        [*SOURCE_SPECS, raw_image_index, validated_images, arrow_shards, quarantine_rate_under_limit, shard_manifest_integrity],
        selection=[raw_image_index, validated_images, arrow_shards],
        partition_key=source,
        resources={**resources, "limits": CheckLimits(max_quarantine_rate=limit)},
        instance=instance,
        raise_on_error=False,
    )


@pytest.mark.slow
def test_quarantine_check_blocks_sharding_when_over_the_limit(resources, instance):
    result = _run(resources, instance, limit=0.01)  # the tiny root quarantines 4 planted files
    evaluation = {e.check_name: e for e in result.get_asset_check_evaluations()}["quarantine_rate_under_limit"]
    assert not evaluation.passed and "limit 1.0%" in evaluation.description
    assert not result.asset_materializations_for_node("arrow_shards"), "a failed blocking check stops downstream work"


@pytest.mark.slow
def test_checks_pass_on_a_healthy_run(resources, instance):
    result = _run(resources, instance, limit=0.5)
    assert result.success
    assert {e.check_name: e.passed for e in result.get_asset_check_evaluations()} == {
        "quarantine_rate_under_limit": True, "shard_manifest_integrity": True,
    }
    # Each source's checks judge that source's materialization, not the latest of another source.
    for source in (SOURCE, "line_b_camera"):
        run = _run(resources, instance, limit=0.5, source=source)
        quarantined = run.asset_materializations_for_node("validated_images")[0].metadata["quarantined"].value
        evaluation = {e.check_name: e for e in run.get_asset_check_evaluations()}["quarantine_rate_under_limit"]
        assert evaluation.metadata["quarantined"].value == quarantined, source
    assert _quarantined(run, "line_b_camera") != _quarantined(_run(resources, instance, 0.5), SOURCE)


def _quarantined(result, source):
    return result.asset_materializations_for_node("validated_images")[0].metadata["quarantined"].value
