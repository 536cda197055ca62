"""Re-materializing a source after images are added to it decodes only the new ones (incremental inside
the source's partition), and the shards of the selection keep the old ones, packing only the new rows."""

import shutil
from pathlib import Path

from conftest import make_resources
from helpers.graph_runs import materialize_source, materialize_tail

from training_code.lib.shard_format import read_manifest, shard_path, verify_shard
from zero_assets.defs.assets.arrow_shards import arrow_shards
from zero_assets.defs.assets.raw_image_index import raw_image_index
from zero_assets.defs.assets.training_set import training_set
from zero_assets.defs.assets.validated_images import validated_images
from zero_assets.ops.demo_data import make_demo_raw_root

DATA_ASSETS = [raw_image_index, validated_images]
SOURCE = "line_a_camera"
SMALL_SHARDS = {"ops": {"arrow_shards": {"config": {"target_shard_bytes": 60_000}}}}


def _metadata(result, asset: str) -> dict:
    return {k: v.value for k, v in result.asset_materializations_for_node(asset)[0].metadata.items()}


def _materialize(instance, resources) -> tuple[dict, dict]:
    source = materialize_source(SOURCE, instance=instance, resources=resources, assets=DATA_ASSETS)
    tail = materialize_tail(
        instance=instance, resources=resources, run_config=SMALL_SHARDS, assets=[training_set, arrow_shards]
    )
    assert source.success and tail.success
    return _metadata(source, "validated_images"), _metadata(tail, "arrow_shards")


def test_added_images_are_the_only_ones_decoded_and_old_shards_stay(instance, tmp_path):
    raw = tmp_path / "raw"
    make_demo_raw_root(raw, images=60, seed=3)
    # One lot of the source is held back, then arrives (its entries are in annotations.json already).
    held_back = tmp_path / "held_back"
    shutil.move(raw / SOURCE / "lot_001", held_back)
    resources = make_resources(raw, tmp_path / "state")
    first_validated, first_shards = _materialize(instance, resources)
    assert first_validated["decoded"] == first_validated["images_in"] and first_validated["reused"] == 0
    old_dir = Path(first_shards["dagster/uri"])
    old_manifest = read_manifest(old_dir)
    old_files = {e["path"]: e for e in old_manifest["shards"]}
    assert len(old_files) > 2, "the test needs several shards to show they are kept"
    old_stats = {path: shard_path(old_dir, entry).stat() for path, entry in old_files.items()}

    shutil.move(held_back, raw / SOURCE / "lot_001")
    added = sum(1 for p in (raw / SOURCE / "lot_001").rglob("*") if p.is_file())

    validated, shards = _materialize(instance, resources)
    assert validated["images_in"] == first_validated["images_in"] + added
    assert (validated["decoded"], validated["reused"]) == (added, first_validated["images_in"])
    assert validated["images_in"] == validated["accepted"] + validated["quarantined"] + validated["duplicates"]

    new_accepted = validated["accepted"] - first_validated["accepted"]
    assert (shards["shards_kept"], shards["shards_dropped"], shards["rows_masked"]) == (len(old_files), 0, 0)
    assert (shards["rows_kept"], shards["rows_packed"]) == (first_validated["accepted"], new_accepted)
    folder = Path(shards["dagster/uri"])
    manifest = read_manifest(folder)
    entries = {e["path"]: e for e in manifest["shards"]}
    kept = {
        f"../{old_dir.name}/{path}": {**entry, "path": f"../{old_dir.name}/{path}"} for path, entry in old_files.items()
    }
    assert {path: entries[path] for path in kept} == kept, "old shards are listed unchanged, by reference"
    assert len(entries) > len(old_files) and sum(manifest["rows"].values()) == validated["accepted"]
    for path, stat in old_stats.items():
        after = shard_path(old_dir, old_files[path]).stat()
        assert (after.st_ino, after.st_mtime_ns, after.st_size) == (stat.st_ino, stat.st_mtime_ns, stat.st_size), path
    for entry in manifest["shards"]:
        verify_shard(folder, entry)
