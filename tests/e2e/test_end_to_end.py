"""The whole graph materializes on a tiny raw root, on the local backend, with a real Dagster instance:
each source indexed and validated in its own run (its partition), then the tail: the selection, its
shards, the warm state, training and the report."""

import pandas as pd
import pytest
from helpers.graph_runs import materialize_graph

from zero_assets.defs.assets import PER_SOURCE_ASSETS, TAIL_ASSETS

FAST_TRAINING = {"ops": {"trained_checkpoint": {"config": {"max_steps": 12, "checkpoint_every": 6, "batch_size": 4}}}}


def _metadata(result, asset):
    return {k: v.value for k, v in result.asset_materializations_for_node(asset)[0].metadata.items()}


@pytest.mark.slow
def test_whole_graph_materializes_and_reports_every_planted_case(instance, resources, tiny_demo, tiny_raw_root):
    per_source, tail = materialize_graph(
        tiny_raw_root, instance=instance, resources=resources, run_config=FAST_TRAINING
    )
    assert all(result.success for result in per_source.values()) and tail.success
    sources = {
        s: {a.key.to_user_string(): _metadata(r, a.key.to_user_string()) for a in PER_SOURCE_ASSETS}
        for s, r in per_source.items()
    }
    meta = {a.key.to_user_string(): _metadata(tail, a.key.to_user_string()) for a in TAIL_ASSETS}
    for asset, values in [*meta.items(), *((f"{a}[{s}]", v) for s, m in sources.items() for a, v in m.items())]:
        assert values["dagster/uri"], f"{asset} records where its output is"
        assert values["cache"] == "miss"
    for source, m in sources.items():
        assert f"/{source}/" in m["raw_image_index"]["dagster/uri"], "per-source outputs sit under <asset>/<source>/"
        validated = m["validated_images"]
        assert validated["images_in"] == validated["accepted"] + validated["quarantined"] + validated["duplicates"]
        assert validated["images_in"] == m["raw_image_index"]["dagster/row_count"]

    planted = tiny_demo["planted"]

    def table(key, name):
        return pd.read_parquet(f"{sources[key.partition('/')[0]]['validated_images']['dagster/uri']}/{name}.parquet")

    def reason(key):
        return table(key, "quarantine").set_index("key")["reason"].to_dict()[key]

    assert reason(planted["truncated_jpeg"]) == "truncated"
    assert reason(planted["zero_byte"]) == "empty"
    assert reason(planted["text_as_jpg"]) == "unidentified"
    assert reason(planted["png_bad_crc"]) == "checksum"
    rejected = table(planted["box_outside_image"], "rejected_labels")
    assert "outside_image" in rejected.loc[rejected["key"] == planted["box_outside_image"], "reason"].tolist()
    assert (
        table(planted["image_without_annotation"], "unmatched").set_index("key")["kind"][
            planted["image_without_annotation"]
        ]
        == "image_without_annotation"
    )
    assert (
        table(planted["annotation_without_image"], "unmatched").set_index("key")["kind"][
            planted["annotation_without_image"]
        ]
        == "annotation_without_image"
    )

    # The copy in another source is validated there, then left out of the training set by the stated rule and
    # listed; the image with no entry in its source's annotations.json (no training image) is counted.
    duplicate = planted["duplicate_across_sources"]
    excluded = pd.read_parquet(f"{meta['training_set']['dagster/uri']}/excluded.parquet").set_index("key")
    assert list(excluded.index) == [duplicate] and excluded.loc[duplicate, "rule"] == "duplicate"
    assert excluded.loc[duplicate, "reason"].startswith("duplicate of an image kept in source")
    assert meta["training_set"]["duplicates_across_sources"] == 1 and meta["training_set"]["not_annotated"] == 1
    accepted = sum(m["validated_images"]["accepted"] for m in sources.values())
    assert meta["training_set"]["dagster/row_count"] == accepted - 2
    # The shards hold the selection, nothing more: every accepted image but the duplicate and the unannotated one.
    shards = meta["arrow_shards"]
    assert shards["train_rows"] + shards["val_rows"] == shards["dagster/row_count"] == accepted - 2
    assert meta["fsx_warm_state"]["shards"] == shards["shards"]

    assert meta["trained_checkpoint"]["steps"] == 12
    assert meta["trained_checkpoint"]["job_name"].startswith("zero-trained-checkpoint-")
    assert 0.0 <= meta["map_report"]["mAP_50"] <= 1.0

    _check_lineage(instance, meta, sources, planted)


def _check_lineage(instance, meta, sources, planted):
    from zero_assets.ops.lineage import checkpoint_lineage, find_checkpoint, image_fate

    checkpoint_uri = meta["trained_checkpoint"]["dagster/uri"]
    found = checkpoint_lineage(instance, find_checkpoint(instance, checkpoint_uri))
    # The graph's order: checkpoint -> warm set -> shard set -> selection -> each source's validated set.
    assert found.warm.uri == meta["fsx_warm_state"]["dagster/uri"]
    assert found.shard_set.uri == meta["arrow_shards"]["dagster/uri"]
    assert found.training_set.uri == meta["training_set"]["dagster/uri"]
    assert {s: m.uri for s, m in found.validated_sets.items()} == {
        s: m["validated_images"]["dagster/uri"] for s, m in sources.items()
    }
    duplicate, unannotated = planted["duplicate_across_sources"], planted["image_without_annotation"]
    assert (
        len(found.train_images) == meta["arrow_shards"]["train_rows"] == meta["trained_checkpoint"]["dagster/row_count"]
    )
    assert duplicate not in set(found.train_images["key"]) and unannotated not in set(found.train_images["key"])
    assert [r.uri for r in found.reports] == [meta["map_report"]["dagster/uri"]]
    lines = found.lines()
    assert lines[2].startswith(f"shard set    {found.shard_set.uri}  ({meta['arrow_shards']['shards']} shards")

    trained_key = found.train_images["key"].iloc[0]
    fate = image_fate(instance, trained_key)
    assert (fate["status"], fate["checkpoints"], fate["masked"]) == ("selected", [checkpoint_uri], False), fate
    assert "bytes_changed" not in fate, "the bytes it trained on are the bytes there now"
    assert [held["shard_set"] for held in fate["shards"]] == [found.shard_set.uri]
    truncated = image_fate(instance, planted["truncated_jpeg"])
    assert (
        truncated["status"] == "quarantined" and truncated["reason"] == "truncated" and truncated["checkpoints"] == []
    )
    assert image_fate(instance, planted["duplicate_across_sources"])["status"] == "excluded from the training set"
    fate = image_fate(instance, unannotated)  # not listed: the policy, run again, says why
    assert fate["status"] == "excluded from the training set" and fate["reason"].startswith("not annotated: no entry")
    with pytest.raises(LookupError, match="is not in the index of any source"):
        image_fate(instance, "line_a_camera/lot_999/never_seen.jpg")
