"""Select, then shard (issue 20, done-when 1): a lake of several sources, about a tenth of it selected,
and exactly the selected rows in the shards; then images added and some rows unselected, and the shard
set follows incrementally: new rows packed into new shards, removed rows masked, shards past the
compaction threshold rewritten, small shards merged, every untouched shard left as it was (same file,
never rewritten) and not copied again to the warm state."""

import shutil
from pathlib import Path

import pyarrow.compute as pc
import pytest
from conftest import make_resources
from helpers.graph_runs import materialize_source, materialize_tail

from training_code.lib import training_set as ts
from training_code.lib.shard_format import masked_keys, open_shard, read_manifest, shard_path, verify_shard
from zero_assets.defs.assets import arrow_shards, fsx_warm_state, training_set
from zero_assets.ops.demo_data import SOURCES, make_demo_raw_root

HELD_BACK = "line_a_camera/lot_004"  # arrives after the first materialization
TAIL = [training_set, arrow_shards, fsx_warm_state]
SHARD_BYTES = 500_000  # about four demo images a shard: many shards, so some stay untouched


def _tail(instance, resources, caps: dict[str, int], **shard_config) -> dict[str, dict]:
    run_config = {
        "ops": {
            "training_set": {"config": {"source_caps": caps}},
            "arrow_shards": {"config": {"target_shard_bytes": SHARD_BYTES, **shard_config}},
        }
    }
    result = materialize_tail(instance=instance, resources=resources, assets=TAIL, run_config=run_config)
    assert result.success
    return {
        a.key.to_user_string(): {
            k: v.value for k, v in result.asset_materializations_for_node(a.key.to_user_string())[0].metadata.items()
        }
        for a in TAIL
    }


def _listed(folder: Path) -> tuple[dict, dict[str, list[str]], dict[str, frozenset[str]]]:
    """The manifest, each listed shard's keys (read from the shard itself) and its masked keys."""
    manifest = read_manifest(folder)
    keys = {}
    for entry in manifest["shards"]:
        verify_shard(folder, entry)
        keys[entry["path"]] = open_shard(shard_path(folder, entry)).column("key").to_pylist()
    return manifest, keys, masked_keys(folder, manifest)


def _check_exactly_the_selection(metadata: dict) -> tuple[dict, dict[str, list[str]], dict[str, frozenset[str]]]:
    """Every selected row is live in exactly one shard, with the split and sha256 selected; nothing else is live."""
    _, selection = ts.read_selection(metadata["training_set"]["dagster/uri"])
    folder = Path(metadata["arrow_shards"]["dagster/uri"])
    manifest, keys, masked = _listed(folder)
    live = [key for path, ks in keys.items() for key in ks if key not in masked.get(path, frozenset())]
    assert sorted(live) == sorted(selection.column("key").to_pylist()), "the live rows are the selection, once each"
    split_of = dict(zip(selection.column("key").to_pylist(), selection.column("split").to_pylist()))
    for entry in manifest["shards"]:
        table = open_shard(shard_path(folder, entry)).select(["key", "sha256"]).to_pylist()
        sha_of = dict(zip(selection.column("key").to_pylist(), selection.column("sha256").to_pylist()))
        for row in table:
            if row["key"] not in masked.get(entry["path"], frozenset()):
                assert (split_of[row["key"]], sha_of[row["key"]]) == (entry["split"], row["sha256"]), row
    assert sum(manifest["rows"].values()) == len(live) == metadata["arrow_shards"]["dagster/row_count"]
    assert manifest["masked_rows"] == sum(len(m) for m in masked.values())
    return manifest, keys, masked


@pytest.mark.slow
def test_a_tenth_selected_is_exactly_what_is_sharded_and_refreshes_are_incremental(tmp_path, instance):
    raw = tmp_path / "raw"
    make_demo_raw_root(raw, images=360, seed=5)
    shutil.move(raw / HELD_BACK, tmp_path / "held_back")
    resources = make_resources(raw, tmp_path / "state")
    for source in SOURCES:
        assert materialize_source(source, instance=instance, resources=resources).success

    # About a tenth of the lake: twelve images of each source's ~115.
    first = _tail(instance, resources, dict.fromkeys(SOURCES, 12))
    accepted, selected = first["training_set"]["accepted"], first["training_set"]["dagster/row_count"]
    assert selected == 36 and 0.08 <= selected / accepted <= 0.15, (selected, accepted)
    manifest, keys, masked = _check_exactly_the_selection(first)
    assert not masked and manifest["masked_rows"] == 0
    assert len(manifest["shards"]) >= 6, "the test needs many shards to show some are left alone"
    image_bytes = pc.sum(ts.read_selection(first["training_set"]["dagster/uri"])[1].column("size")).as_py()
    shard_bytes = sum(entry["bytes"] for entry in manifest["shards"])
    assert image_bytes < shard_bytes < 1.1 * image_bytes, "the shards hold the selected images, no more"
    first_folder = Path(first["arrow_shards"]["dagster/uri"])
    files = {entry["path"]: shard_path(first_folder, entry) for entry in manifest["shards"]}
    stats = {path: file.stat() for path, file in files.items()}
    assert first["fsx_warm_state"]["copied"] == len(manifest["shards"])

    # Images arrive in one source, which may select more of them; another source selects fewer.
    shutil.move(tmp_path / "held_back", raw / HELD_BACK)
    assert materialize_source("line_a_camera", instance=instance, resources=resources).success
    caps = {"line_a_camera": 19, "line_b_camera": 5, "warehouse_scanner": 12}
    second = _tail(instance, resources, caps, compact_masked_share=0.3)
    manifest2, keys2, masked2 = _check_exactly_the_selection(second)
    work = second["arrow_shards"]
    assert second["training_set"]["dagster/row_count"] == 36
    assert work["rows_packed"] > 0 and work["shards_packed"] > 0 and work["shards_kept"] > 0
    assert work["shards_compacted"] > 0, "a shard with most of its rows unselected is rewritten"
    assert len(manifest2["shards"]) == work["shards_kept"] + work["shards_packed"]
    kept = {e["path"]: e for e in manifest2["shards"] if e["path"].startswith("../")}
    assert len(kept) == work["shards_kept"]
    for path, entry in kept.items():
        earlier = path.removeprefix(f"../{first_folder.name}/")
        assert earlier in keys and keys2[path] == keys[earlier], "a kept shard is the earlier file, by reference"
        assert entry["masked"] / entry["rows"] <= 0.3, "past the threshold it would have been compacted"
        after = files[earlier].stat()
        assert (after.st_ino, after.st_mtime_ns, after.st_size) == (
            stats[earlier].st_ino,
            stats[earlier].st_mtime_ns,
            stats[earlier].st_size,
        ), f"{earlier} was never rewritten"
    # What the unselected rows became: masked in the shards kept, gone with the shards compacted.
    _, selection2 = ts.read_selection(second["training_set"]["dagster/uri"])
    now_selected = set(selection2.column("key").to_pylist())
    for path in kept:
        assert masked2.get(path, frozenset()) == {k for k in keys2[path] if k not in now_selected}
    assert any(masked2.values()), "some kept shard holds a row no longer selected"
    assert any(not entry["masked"] for entry in kept.values()), "some kept shard is untouched"
    new = [e for e in manifest2["shards"] if e["path"].startswith("shards/")]
    assert len(new) == work["shards_packed"] and sum(e["rows"] for e in new) == work["rows_packed"]
    # The warm step copies only the shards it has not got.
    warm = second["fsx_warm_state"]
    assert warm["copied"] == work["shards_packed"] and warm["already_warm"] == work["shards_kept"]

    # Small shards past their share are merged into ~target-sized ones: here every shard under the target
    # (the last of each packing: a shard closes once it reaches the target) is small, and any share is too much.
    small_before = [e for e in manifest2["shards"] if e["bytes"] < SHARD_BYTES]
    third = _tail(instance, resources, caps, compact_masked_share=0.3, merge_small_share=1.0, merge_rows_share=0.0)
    manifest3, _, _ = _check_exactly_the_selection(third)
    assert third["arrow_shards"]["shards_merged"] > 0 and third["arrow_shards"]["rows_packed"] > 0
    for split in ("train", "val"):
        small = [e for e in manifest3["shards"] if e["split"] == split and e["bytes"] < SHARD_BYTES]
        assert len(small) <= 1, f"{split}: at most the last shard packed is under the target, got {small}"
    assert len(small_before) > 2 and sum(e["bytes"] < SHARD_BYTES for e in manifest3["shards"]) <= 2
    print(
        f"selected {selected} of {accepted} accepted; first: {len(manifest['shards'])} shards packed; refresh: "
        f"{work['shards_kept']} kept, {work['shards_compacted']} compacted, {work['shards_packed']} packed "
        f"({work['rows_packed']} rows), {work['rows_masked']} rows masked, {warm['copied']} copied to the warm "
        f"state; merge: {third['arrow_shards']['shards_merged']} merged into {len(manifest3['shards'])} shards"
    )
