"""Labels that mean what they say (issue 22): "not annotated" is not "annotated, no objects".

An image listed in annotations.json with no annotations is a negative; an image with no entry is
reported and never a training image unless its source opts in to "unlabelled images are negatives";
a source whose annotations.json is missing or unusable fails its validation naming the file, unless it
is configured as unlabelled (then it is validated, reported and selected for nothing). The job script
in-process on small roots, the selection's rule on its own, and the graph on the demo's raw root.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from conftest import make_resources
from helpers import policy_runs
from helpers.graph_runs import materialize_source, materialize_tail
from helpers.policy_runs import outcome, run_policy_over
from helpers.raw_index_reference import build_raw_index
from PIL import Image

from training_code.lib import training_set as ts
from training_code.lib.coco import ANNOTATIONS_FILE
from training_code.lib.raw_index import whole_root_manifest
from training_code.lib.selection_engine import explain
from training_code.lib.selection_plan import SelectionPolicy
from training_code.lib.shard_format import masked_keys, open_shard, read_manifest, shard_path
from training_code.lib.tables import RAW_INDEX, write_table
from training_code.lib.validation_pass import MANIFEST, validate
from training_code.validate import get_args_parser
from zero_assets.defs.assets import arrow_shards, training_set
from zero_assets.ops.demo_data import SOURCES

UNLABELLED_DEMO_SOURCE = "warehouse_scanner"  # where the demo plants lot_900/unlabeled_0001.jpg
BROKEN_DEMO_SOURCE = "line_b_camera"


def jpeg(seed: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (48, 64, 3), dtype=np.uint8)).save(buffer, "JPEG")
    return buffer.getvalue()


def make_root(raw: Path) -> None:
    """Source `cam`: boxed.jpg (one box), empty.jpg (listed, no annotations: a negative) and
    unlisted.jpg (no entry at all)."""
    (raw / "cam" / "lot_0").mkdir(parents=True)
    for n, name in enumerate(["boxed.jpg", "empty.jpg", "unlisted.jpg"], start=1):
        (raw / "cam" / "lot_0" / name).write_bytes(jpeg(n))
    coco = {
        "categories": [{"id": 1, "name": "part"}],
        "images": [{"id": 1, "file_name": "lot_0/boxed.jpg"}, {"id": 2, "file_name": "lot_0/empty.jpg"}],
        "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [4, 4, 20, 20]}],
    }
    (raw / "cam" / ANNOTATIONS_FILE).write_text(json.dumps(coco))


def run_job(raw: Path, base: Path, *flags: str) -> dict:
    """Index `raw` as raw_image_index records it, then the validation pass over it; its manifest."""
    index = build_raw_index(str(raw))
    (base / "index").mkdir(parents=True, exist_ok=True)
    write_table(index.frame, RAW_INDEX, base / "index" / "index.parquet")
    manifest = whole_root_manifest(str(raw), sorted(set(index.frame["source"])))
    (base / "index" / "manifest.json").write_text(json.dumps(manifest))
    arguments = ["--index", str(base / "index"), "--raw", str(raw), "--out", str(base / "out"), "--workers", "1"]
    return validate(get_args_parser().parse_args([*arguments, *flags]))[0]


def accepted(base: Path) -> pd.DataFrame:
    return pd.read_parquet(base / "out" / "accepted.parquet").set_index("key")


def test_listed_without_annotations_is_a_negative_and_unlisted_is_not_a_training_image(tmp_path):
    make_root(tmp_path / "raw")
    counts = run_job(tmp_path / "raw", tmp_path)["counts"]
    table = accepted(tmp_path)
    assert table["annotation"].to_dict() == {
        "cam/lot_0/boxed.jpg": "annotated",
        "cam/lot_0/empty.jpg": "annotated",
        "cam/lot_0/unlisted.jpg": "unlisted",
    }
    assert [len(table.loc[k, "boxes"]) for k in table.index] == [1, 0, 0]
    assert counts["accepted_by_annotation"] == {
        "annotated": 2,
        "unlisted_negative": 0,
        "unlisted": 1,
        "unlabelled_source": 0,
    }
    assert (counts["images_not_annotated"], counts["unlisted_negatives"]) == (1, 0)
    unmatched = pd.read_parquet(tmp_path / "out" / "unmatched.parquet").set_index("key")
    assert unmatched.loc["cam/lot_0/unlisted.jpg", "kind"] == "image_without_annotation"
    assert "not a training image" in unmatched.loc["cam/lot_0/unlisted.jpg", "detail"]

    # The selection: the negative is selected, the unannotated image is left out saying why.
    selected, excluded = outcome(run_policy_over(policy_rows(table)))
    assert selected == ["cam/lot_0/boxed.jpg", "cam/lot_0/empty.jpg"]
    assert list(excluded) == ["cam/lot_0/unlisted.jpg"]
    assert excluded["cam/lot_0/unlisted.jpg"].startswith("not annotated: no entry")


def test_a_source_opted_in_takes_its_unlisted_images_as_negatives(tmp_path):
    make_root(tmp_path / "raw")
    manifest = run_job(tmp_path / "raw", tmp_path, "--unlabelled-are-negatives", "cam")
    table = accepted(tmp_path)
    assert table.loc["cam/lot_0/unlisted.jpg", "annotation"] == "unlisted_negative"
    assert len(table.loc["cam/lot_0/unlisted.jpg", "boxes"]) == 0
    assert manifest["counts"]["unlisted_negatives"] == 1 and manifest["counts"]["images_not_annotated"] == 0
    assert manifest["config"]["unlabelled_are_negatives"] == ["cam"], "the setting is part of the data version"
    assert len(outcome(run_policy_over(policy_rows(table)))[0]) == 3
    off = outcome(run_policy_over(policy_rows(table), SelectionPolicy(negatives=False)))  # a negative like any other
    assert off[0] == ["cam/lot_0/boxed.jpg"]


PADDED = b'{"images": [], "annotations": [], "categories": [], "pad": "' + b"x" * 2000 + b'"}'
BROKEN_FILES = {
    "missing": (None, "is missing"),
    "not_json": (b'{"images": [', "is unusable: not valid JSON"),
    "top_level_list": (b"[1, 2]", "is unusable: the top level is a JSON list"),
    "section_missing": (b'{"images": [], "categories": []}', "is unusable: field 'annotations' is missing"),
    "too_large": (PADDED, f"is unusable: too_large: {len(PADDED)} bytes, above the limit of 1000"),
}


@pytest.mark.parametrize("case", sorted(BROKEN_FILES))
def test_a_missing_or_unusable_annotations_json_fails_the_source_naming_the_file(tmp_path, case):
    data, problem = BROKEN_FILES[case]
    make_root(tmp_path / "raw")
    coco = tmp_path / "raw" / "cam" / ANNOTATIONS_FILE
    coco.unlink() if data is None else coco.write_bytes(data)
    limit = ["--max-annotation-bytes", "1000"] if case == "too_large" else []
    with pytest.raises(SystemExit) as failed:
        run_job(tmp_path / "raw", tmp_path, *limit)
    message = str(failed.value)
    assert f"{coco} {problem}" in message, message
    assert "unlabelled_sources" in message and "--unlabelled-sources cam" in message
    assert not (tmp_path / "out" / MANIFEST).exists()
    assert not (tmp_path / "out" / "verdicts.parquet").exists(), "it failed before any image was decoded"

    # Configured as unlabelled, the source validates: every image reported, none a training image.
    counts = run_job(tmp_path / "raw", tmp_path, *limit, "--unlabelled-sources", "cam")["counts"]
    table = accepted(tmp_path)
    assert set(table["annotation"]) == {"unlabelled_source"} and len(table) == counts["accepted"] == 3
    assert counts["images_not_annotated"] == 3 and counts["labels_in"] == 0
    unmatched = pd.read_parquet(tmp_path / "out" / "unmatched.parquet")
    assert len(unmatched) == 3 and all("configured unlabelled" in detail for detail in unmatched["detail"])
    selected, excluded = outcome(run_policy_over(policy_rows(table)))
    assert not selected and len(excluded) == 3
    assert all("configured unlabelled" in reason for reason in excluded.values())


def test_an_unannotated_copy_never_takes_the_place_of_an_annotated_one_across_sources():
    """The labels rule comes before the duplicate rule: a source that sorts first but holds the image
    unannotated does not keep it from the source that annotated it."""

    def row(source: str, annotation: str, names: list[str]) -> dict:
        return {"source": source, "key": f"{source}/x.png", "sha256": "a" * 64, "annotation": annotation,
                "category_names": names}  # fmt: skip

    rows = policy_runs.accepted([row("a_cam", "unlisted", []), row("b_cam", "annotated", ["bolt"])])
    selected, excluded = outcome(run_policy_over(rows))
    assert selected == ["b_cam/x.png"] and list(excluded) == ["a_cam/x.png"]


def policy_rows(table: pd.DataFrame) -> pa.Table:
    """The validation job's accepted table (by key) as the policy reads it."""
    return policy_runs.accepted(table.reset_index().to_dict("records"))


def shard_rows(shard_set: str) -> dict[str, dict]:
    """Every live row of a shard set by key: its split and labels as the trainer reads them."""
    folder = Path(shard_set)
    manifest = read_manifest(folder)
    masked = masked_keys(folder, manifest)
    rows = {}
    for entry in manifest["shards"]:
        table = open_shard(shard_path(folder, entry)).select(["key", "boxes", "category_names"]).to_pylist()
        for row in table:
            if row["key"] not in masked.get(entry["path"], frozenset()):
                rows[row["key"]] = {"split": entry["split"], **row}
    return rows


def tail(instance, resources) -> dict[str, dict]:
    result = materialize_tail(instance=instance, resources=resources, assets=[training_set, arrow_shards])
    assert result.success
    return {
        asset: {k: v.value for k, v in result.asset_materializations_for_node(asset)[0].metadata.items()}
        for asset in ("training_set", "arrow_shards")
    }


def validated_metadata(result) -> dict:
    return {k: v.value for k, v in result.asset_materializations_for_node("validated_images")[0].metadata.items()}


@pytest.mark.slow
def test_the_demos_unlabelled_image_is_reported_and_not_sharded_until_its_source_opts_in(
    tiny_demo, tiny_raw_root, instance, resources, tmp_path
):
    unlabelled = tiny_demo["planted"]["image_without_annotation"]
    assert unlabelled.startswith(f"{UNLABELLED_DEMO_SOURCE}/")
    validated = {}
    for source in SOURCES:
        result = materialize_source(source, instance=instance, resources=resources)
        validated[source] = validated_metadata(result)
    reported = validated[UNLABELLED_DEMO_SOURCE]
    assert reported["images_not_annotated"] == 1 and reported["unlisted_negatives"] == 0
    by_state = {r.data["reason"]: r.data["count"] for r in reported["accepted_by_annotation"].records}
    assert by_state["unlisted"] == 1 and by_state["annotated"] == reported["accepted"] - 1
    assert reported["unlabelled_images"].startswith("excluded: ")
    assert all(validated[s]["images_not_annotated"] == 0 for s in SOURCES if s != UNLABELLED_DEMO_SOURCE)
    unmatched = pd.read_parquet(f"{reported['dagster/uri']}/unmatched.parquet").set_index("key")
    assert "not a training image" in unmatched.loc[unlabelled, "detail"]

    first = tail(instance, resources)
    # Not listed (a rule a user acts on in the source, not in the training set): said on demand, by the policy.
    decided = explain(first["training_set"]["dagster/uri"], unlabelled, tmp_path / "explain")
    assert decided["rule"] == "not_annotated"
    assert decided["reason"].startswith("not annotated: no entry in its source's annotations.json")
    assert first["training_set"]["not_annotated"] == 1
    sharded = shard_rows(first["arrow_shards"]["dagster/uri"])
    assert unlabelled not in sharded and len(sharded) == first["arrow_shards"]["dagster/row_count"]

    # The source opts in: only its own validation is redone, and the image trains as a negative.
    opt_in = {"ops": {"validated_images": {"config": {"unlabelled_are_negatives": [UNLABELLED_DEMO_SOURCE]}}}}
    again = materialize_source("line_a_camera", instance=instance, resources=resources, run_config=opt_in)
    assert validated_metadata(again)["cache"] == "hit", "another source's setting is not in this one's fingerprint"
    result = materialize_source(UNLABELLED_DEMO_SOURCE, instance=instance, resources=resources, run_config=opt_in)
    opted = validated_metadata(result)
    assert opted["cache"] == "miss" and opted["unlisted_negatives"] == 1 and opted["images_not_annotated"] == 0
    assert opted["unlabelled_images"].startswith("negatives: ")
    second = tail(instance, resources)
    assert second["training_set"]["not_annotated"] == 0
    sharded = shard_rows(second["arrow_shards"]["dagster/uri"])
    assert sharded[unlabelled]["boxes"] == [] and sharded[unlabelled]["category_names"] == []
    assert second["arrow_shards"]["dagster/row_count"] == first["arrow_shards"]["dagster/row_count"] + 1


@pytest.mark.slow
def test_a_source_with_a_broken_annotations_json_fails_naming_the_file_and_the_others_go_on(
    tiny_raw_root, tmp_path, instance
):
    raw = tmp_path / "raw"
    shutil.copytree(tiny_raw_root, raw)
    broken = raw / BROKEN_DEMO_SOURCE / ANNOTATIONS_FILE
    broken.write_text(broken.read_text()[:500])  # cut mid-document: not JSON any more
    resources = make_resources(raw, tmp_path / "state")
    results = {
        source: materialize_source(source, instance=instance, resources=resources, raise_on_error=False)
        for source in SOURCES
    }
    assert {s for s, r in results.items() if not r.success} == {BROKEN_DEMO_SOURCE}, "the other sources go on"
    [failure] = [e for e in results[BROKEN_DEMO_SOURCE].all_events if e.event_type_value == "STEP_FAILURE"]
    message = str(failure.event_specific_data.error)
    assert f"{broken} is unusable: not valid JSON" in message and "unlabelled_sources" in message, message
    assert not results[BROKEN_DEMO_SOURCE].asset_materializations_for_node("validated_images")

    # Configured as unlabelled, it validates, and the training set takes none of its images.
    unlabelled = {"ops": {"validated_images": {"config": {"unlabelled_sources": [BROKEN_DEMO_SOURCE]}}}}
    result = materialize_source(BROKEN_DEMO_SOURCE, instance=instance, resources=resources, run_config=unlabelled)
    reported = validated_metadata(result)
    assert reported["images_not_annotated"] == reported["accepted"] > 0
    assert reported["unlabelled_images"].startswith("unlabelled: ")
    selection = tail(instance, resources)
    _, selected = ts.read_selection(selection["training_set"]["dagster/uri"])
    assert BROKEN_DEMO_SOURCE not in set(selected.column("source").to_pylist())
    assert selection["training_set"]["not_annotated"] == reported["accepted"] + 1  # and the demo's unlabelled image
    assert not [
        key for key in shard_rows(selection["arrow_shards"]["dagster/uri"]) if key.startswith(BROKEN_DEMO_SOURCE)
    ]
