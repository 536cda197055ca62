"""The training set: its data version follows the chosen sources' shard data versions only; exact
duplicates across sources and the per-source cap are resolved by the stated rules."""

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from conftest import make_resources
from graph_runs import materialize_source, materialize_tail

from training_code.lib.detection_samples import iter_eval_samples, verified_split
from training_code.lib.shard_format import open_shard
from training_code.lib.training_set import choose_rows
from zero_assets.backends.local.warm_state import warm_training_set
from zero_assets.defs.assets import training_set


def test_duplicates_stay_in_the_source_that_sorts_first_and_the_cap_keeps_the_lowest_key_hashes():
    accepted = {
        "b_cam": [("b_cam/1.jpg", "s1"), ("b_cam/2.jpg", "s2"), ("b_cam/3.jpg", "s3")],
        "a_cam": [("a_cam/9.jpg", "s2"), ("a_cam/8.jpg", "s4")],
    }
    excluded = choose_rows(accepted, None)
    assert [(s, k) for s, k, _ in excluded] == [("b_cam", "b_cam/2.jpg")]
    assert excluded[0][2] == "duplicate of an image kept in source a_cam"
    capped = choose_rows(accepted, 1)
    over = sorted((s, k) for s, k, reason in capped if reason.startswith("over the cap"))
    assert [s for s, _ in over] == ["a_cam", "b_cam"], "each source keeps one image"
    assert choose_rows(accepted, 1) == capped, "the same rows every time"


def _version(instance, resources, **config) -> tuple[str, dict]:
    result = materialize_tail(
        instance=instance,
        resources=resources,
        assets=[training_set],
        run_config={"ops": {"training_set": {"config": config}}} if config else None,
    )
    event = result.asset_materializations_for_node("training_set")[0]
    return event.tags["dagster/data_version"], {k: v.value for k, v in event.metadata.items()}


def _sources(metadata: dict) -> list[str]:
    """The chosen sources, from the materialization's per-source table."""
    return [record.data["source"] for record in metadata["sources"].records]


def _touch_one_image(raw: Path, source: str) -> None:
    image = sorted(p for p in (raw / source).rglob("*.png") if "lot_900" not in str(p))[0]
    image.write_bytes(image.read_bytes() + b"\0")  # a trailing byte PNG decoders ignore: a new version of the source


@pytest.mark.slow
def test_training_set_changes_only_when_a_chosen_source_changes(tiny_raw_root, tmp_path, instance):
    raw = tmp_path / "raw"
    shutil.copytree(tiny_raw_root, raw)
    resources = make_resources(raw, tmp_path / "state")
    for source in ("line_a_camera", "line_b_camera"):
        assert materialize_source(source, instance=instance, resources=resources).success
    first, meta = _version(instance, resources)
    assert _sources(meta) == ["line_a_camera", "line_b_camera"]
    manifest = json.loads(Path(meta["dagster/uri"], "manifest.json").read_text())
    assert [s["source"] for s in manifest["sources"]] == _sources(meta)
    assert manifest["duplicate_rule"].startswith(
        "an exact duplicate (same sha256) in several sources is kept in the source whose name sorts first"
    )

    # A source rebuilt from unchanged data: same shard data version, same training set.
    assert materialize_source("line_a_camera", instance=instance, resources=resources).success
    again, meta = _version(instance, resources)
    assert again == first and meta["cache"] == "hit"

    # One image of a chosen source changes: a new training set.
    _touch_one_image(raw, "line_a_camera")
    assert materialize_source("line_a_camera", instance=instance, resources=resources).success
    changed, meta = _version(instance, resources)
    assert changed != first and "upstream arrow_shards[line_a_camera] changed" in meta["cache_reason"]

    # A source that is not chosen changes: the training set of the chosen ones stays as it was.
    chosen = {"sources": ["line_a_camera", "line_b_camera"]}
    assert materialize_source("warehouse_scanner", instance=instance, resources=resources).success
    before, _ = _version(instance, resources, **chosen)
    _touch_one_image(raw, "warehouse_scanner")
    assert materialize_source("warehouse_scanner", instance=instance, resources=resources).success
    after, meta = _version(instance, resources, **chosen)
    assert after == before and meta["cache"] == "hit"
    # Chosen by default (every registered source with shards), it changes.
    everything, meta = _version(instance, resources)
    assert everything != after and _sources(meta) == ["line_a_camera", "line_b_camera", "warehouse_scanner"]

    # The cap: each source keeps at most that many images, the rest are listed with the reason.
    capped, meta = _version(instance, resources, max_images_per_source=3)
    excluded = pd.read_parquet(Path(meta["dagster/uri"], "excluded.parquet"))
    kept = meta["dagster/row_count"]
    assert kept == 3 * 3 and meta["over_cap"] == (excluded["reason"].str.startswith("over the cap")).sum() > 0

    # What the trainer and evaluator read of it, warmed: the listed shards of every source, the excluded
    # rows skipped, each source's labels in the shared vocabulary.
    warm = warm_training_set(meta["dagster/uri"], tmp_path / "fsx", "capped").path
    read = []
    for split in ("train", "val"):
        manifest, shards = verified_split(warm, split)
        read += list(iter_eval_samples(shards))
    assert len(read) == kept and not {s.key for s in read} & set(excluded["key"])
    shared = {c["id"]: c["name"] for c in manifest["categories"]}
    by_key = {}
    for source in manifest["sources"]:
        for entry in source["shards"]:
            rows = open_shard(warm / source["folder"] / entry["file"]).select(["key", "category_names"]).to_pylist()
            by_key |= {row["key"]: row["category_names"] for row in rows}
    for sample in read:  # the same names, whichever source's ids the shard stored
        assert [shared[int(label)] for label in sample.labels] == by_key[sample.key]
