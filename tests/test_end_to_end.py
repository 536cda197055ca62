"""The whole graph materializes on a tiny raw root, on the local backend, with a real Dagster instance."""

import pandas as pd
import pytest
from dagster import materialize

from zero_assets.assets import ALL_ASSETS

FAST_TRAINING = {"ops": {"trained_checkpoint": {"config": {"max_steps": 12, "checkpoint_every": 6, "batch_size": 4}}}}


def _metadata(result, asset):
    return {k: v.value for k, v in result.asset_materializations_for_node(asset)[0].metadata.items()}


@pytest.mark.slow
def test_whole_graph_materializes_and_reports_every_planted_case(instance, resources, tiny_demo):
    result = materialize(ALL_ASSETS, resources=resources, instance=instance, run_config=FAST_TRAINING)
    assert result.success
    meta = {asset.key.to_user_string(): _metadata(result, asset.key.to_user_string()) for asset in ALL_ASSETS}
    for asset, values in meta.items():
        assert values["uri"], f"{asset} records where its output is"
        assert values["cache"] == "miss"

    validated = meta["validated_images"]
    assert validated["images_in"] == validated["accepted"] + validated["quarantined"] + validated["duplicates"]
    assert validated["images_in"] == meta["raw_image_index"]["images"]
    assert meta["arrow_shards"]["train_rows"] + meta["arrow_shards"]["val_rows"] == validated["accepted"]

    out, planted = validated["uri"], tiny_demo["planted"]
    quarantine = pd.read_parquet(f"{out}/quarantine.parquet").set_index("key")["reason"].to_dict()
    assert quarantine[planted["truncated_jpeg"]] == "truncated"
    assert quarantine[planted["zero_byte"]] == "empty"
    assert quarantine[planted["text_as_jpg"]] == "unidentified"
    assert quarantine[planted["png_bad_crc"]] == "checksum"
    duplicates = pd.read_parquet(f"{out}/duplicates.parquet")
    assert duplicates["key"].tolist() == [planted["duplicate_across_sources"]]
    rejected = pd.read_parquet(f"{out}/rejected_labels.parquet")
    assert "outside_image" in rejected.loc[rejected["key"] == planted["box_outside_image"], "reason"].tolist()
    unmatched = pd.read_parquet(f"{out}/unmatched.parquet").set_index("key")["kind"].to_dict()
    assert unmatched[planted["image_without_annotation"]] == "image_without_annotation"
    assert unmatched[planted["annotation_without_image"]] == "annotation_without_image"

    assert meta["trained_checkpoint"]["steps"] == 12
    assert meta["trained_checkpoint"]["job_name"].startswith("zero-trained-checkpoint-")
    assert 0.0 <= meta["map_report"]["mAP_50"] <= 1.0


    _check_lineage(instance, meta, planted)


def _check_lineage(instance, meta, planted):
    from zero_assets.lineage import checkpoint_lineage, find_checkpoint, image_fate

    checkpoint_uri = meta["trained_checkpoint"]["uri"]
    found = checkpoint_lineage(instance, find_checkpoint(instance, checkpoint_uri))
    assert found.shards.uri == meta["arrow_shards"]["uri"] and found.validated.uri == meta["validated_images"]["uri"]
    assert len(found.train_images) == meta["arrow_shards"]["train_rows"]
    assert [r.uri for r in found.reports] == [meta["map_report"]["uri"]]

    trained_key = found.train_images["key"].iloc[0]
    assert image_fate(instance, trained_key)["checkpoints"] == [checkpoint_uri]
    truncated = image_fate(instance, planted["truncated_jpeg"])
    assert truncated["status"] == "quarantined" and truncated["reason"] == "truncated" and truncated["checkpoints"] == []
    assert image_fate(instance, planted["duplicate_across_sources"])["status"] == "duplicate"
    assert image_fate(instance, "line_a_camera/lot_999/never_seen.jpg")["status"] == "not yet processed"
