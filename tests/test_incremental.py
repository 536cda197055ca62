"""Re-materializing a source after images are added to it decodes only the new ones and adds shards
beside the old ones (incremental inside the source's partition)."""

import shutil

from conftest import make_resources
from graph_runs import materialize_source

from training_code.lib.shard_format import read_manifest, verify_shard
from zero_assets.defs.assets.arrow_shards import arrow_shards
from zero_assets.defs.assets.raw_image_index import raw_image_index
from zero_assets.defs.assets.validated_images import validated_images
from zero_assets.ops.demo_data import make_demo_raw_root

DATA_ASSETS = [raw_image_index, validated_images, arrow_shards]
SOURCE = "line_a_camera"
SMALL_SHARDS = {"ops": {"arrow_shards": {"config": {"target_shard_bytes": 60_000}}}}


def _metadata(result, asset: str) -> dict:
    return {k: v.value for k, v in result.asset_materializations_for_node(asset)[0].metadata.items()}


def _materialize(instance, resources) -> tuple[dict, dict]:
    result = materialize_source(
        SOURCE, instance=instance, resources=resources, run_config=SMALL_SHARDS, assets=DATA_ASSETS
    )
    assert result.success
    return _metadata(result, "validated_images"), _metadata(result, "arrow_shards")


def test_added_images_are_the_only_ones_decoded_and_old_shards_stay(instance, tmp_path):
    raw = tmp_path / "raw"
    make_demo_raw_root(raw, images=60, seed=3)
    # One lot of the source is held back, then arrives (its entries are in annotations.json already).
    held_back = tmp_path / "held_back"
    shutil.move(raw / SOURCE / "lot_001", held_back)
    resources = make_resources(raw, tmp_path / "state")
    first_validated, first_shards = _materialize(instance, resources)
    assert first_validated["decoded"] == first_validated["images_in"] and first_validated["reused"] == 0
    old_dir = first_shards["dagster/uri"]
    old_manifest = read_manifest(old_dir)
    old_files = {e["file"]: e for e in old_manifest["shards"]}
    assert len(old_files) > 2, "the test needs several shards to show they are kept"
    old_stats = {name: (tmp_path / old_dir / name).stat() for name in old_files}

    shutil.move(held_back, raw / SOURCE / "lot_001")
    added = sum(1 for p in (raw / SOURCE / "lot_001").rglob("*") if p.is_file())

    validated, shards = _materialize(instance, resources)
    assert validated["images_in"] == first_validated["images_in"] + added
    assert (validated["decoded"], validated["reused"]) == (added, first_validated["images_in"])
    assert validated["images_in"] == validated["accepted"] + validated["quarantined"] + validated["duplicates"]

    new_accepted = validated["accepted"] - first_validated["accepted"]
    assert (shards["shards_reused"], shards["shards_dropped"]) == (len(old_files), 0)
    assert (shards["rows_reused"], shards["rows_packed"]) == (first_validated["accepted"], new_accepted)
    manifest = read_manifest(shards["dagster/uri"])
    entries = {e["file"]: e for e in manifest["shards"]}
    assert {name: entries[name] for name in old_files} == old_files, "old shards are listed unchanged"
    assert len(entries) > len(old_files) and sum(manifest["rows"].values()) == validated["accepted"]
    for name, stat in old_stats.items():
        after = (tmp_path / old_dir / name).stat()
        assert (after.st_ino, after.st_mtime_ns, after.st_size) == (stat.st_ino, stat.st_mtime_ns, stat.st_size), name
    for entry in manifest["shards"]:
        verify_shard(shards["dagster/uri"], entry)
