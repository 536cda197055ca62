"""The training set is the selection: the policy's rules on the validated tables (sources, caps and
weights, categories, negatives, exact duplicates across sources, the split as validated), and a data
version that follows what was selected, so an unchanged selection leaves the shards alone."""

import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from conftest import make_resources
from graph_runs import materialize_source, materialize_tail

from training_code.lib import training_set as ts
from training_code.lib.selection import SelectionPolicy, select_rows, weighted_shares
from zero_assets.defs.assets import training_set


def _row(source: str, name: str, sha: str, names: list[str], split: str = "train") -> dict:
    return {
        "source": source,
        "key": f"{source}/{name}",
        "sha256": sha * 64,
        "size": 10,
        "etag": "e",
        "format": "PNG",
        "mode": "RGB",
        "width": 10,
        "height": 10,
        "orientation": 1,
        "group": f"{source}/lot",
        "split": split,
        "boxes": [[0.0, 0.0, 5.0, 5.0]] * len(names),
        "category_names": names,
    }


ROWS = [
    _row("b_cam", "1.png", "1", ["bolt"]),
    _row("b_cam", "2.png", "2", ["nut"], split="val"),
    _row("b_cam", "3.png", "3", ["bolt", "nut"]),
    _row("a_cam", "9.png", "2", ["nut", "bolt"], split="val"),  # the same bytes as b_cam/2.png
    _row("a_cam", "8.png", "4", []),  # a negative
    _row("c_cam", "5.png", "5", ["nut"]),
]


def _select(**policy) -> tuple[list[str], dict[str, str]]:
    chosen = select_rows(pa.Table.from_pylist(ROWS, schema=ts.SELECTION_SCHEMA), SelectionPolicy(**policy))
    excluded = chosen.excluded.to_pylist()
    return chosen.selected.column("key").to_pylist(), {row["key"]: row["reason"] for row in excluded}


def test_an_exact_duplicate_stays_in_the_source_that_sorts_first_with_its_split():
    selected, excluded = _select()
    assert selected == ["a_cam/8.png", "a_cam/9.png", "b_cam/1.png", "b_cam/3.png", "c_cam/5.png"]
    assert excluded == {"b_cam/2.png": "duplicate of an image kept in source a_cam"}


@pytest.mark.parametrize(
    ("policy", "selected", "reason"),
    [
        ({"max_images_per_source": 1}, ["a_cam/9.png", "b_cam/1.png", "c_cam/5.png"], "over the cap of 1 images per"),
        ({"source_caps": {"b_cam": 0}}, ["a_cam/8.png", "a_cam/9.png", "c_cam/5.png"], "over the cap of 0 images for"),
        ({"max_images": 2, "source_weights": {"c_cam": 0}}, ["a_cam/9.png", "b_cam/1.png"], "over source"),
    ],
    ids=["per source", "one source", "weighted total"],
)
def test_caps_keep_the_images_whose_sha256_sorts_lowest(policy, selected, reason):
    kept, excluded = _select(**policy)
    assert kept == selected
    over = [key for key, why in excluded.items() if why.startswith("over")]
    assert over and all(excluded[key].startswith(reason) for key in over)
    assert set(kept) | set(excluded) == {row["key"] for row in ROWS}, "every row is selected or says why not"


def test_categories_keep_their_boxes_and_exclude_images_left_with_none():
    chosen = select_rows(
        pa.Table.from_pylist(ROWS, schema=ts.SELECTION_SCHEMA), SelectionPolicy(categories=("bolt",), negatives=False)
    )
    labels = {row["key"]: row["category_names"] for row in chosen.selected.to_pylist()}
    boxes = {row["key"]: len(row["boxes"]) for row in chosen.selected.to_pylist()}
    assert labels == {"a_cam/9.png": ["bolt"], "b_cam/1.png": ["bolt"], "b_cam/3.png": ["bolt"]}
    assert boxes == {"a_cam/9.png": 1, "b_cam/1.png": 1, "b_cam/3.png": 1}
    reasons = {row["key"]: row["reason"] for row in chosen.excluded.to_pylist()}
    assert reasons["c_cam/5.png"] == "no box of the chosen categories"
    assert reasons["a_cam/8.png"].startswith("a negative")
    # A duplicate is judged among the rows still eligible: b_cam/2.png has no bolt, so it is out for that.
    assert reasons["b_cam/2.png"] == "no box of the chosen categories"


def test_weighted_shares_give_a_full_source_s_rest_to_the_others():
    assert weighted_shares({"a": 5, "b": 100, "c": 100}, {"a": 1, "b": 1, "c": 2}, 30) == {"a": 5, "b": 8, "c": 17}
    assert weighted_shares({"a": 5, "b": 5}, {"a": 1, "b": 1}, 30) == {"a": 5, "b": 5}
    assert sum(weighted_shares({s: 10 for s in "abc"}, dict.fromkeys("abc", 1.0), 10).values()) == 10


def test_a_policy_that_cannot_be_met_is_refused_naming_the_setting():
    with pytest.raises(ValueError, match="source_caps\\[b_cam\\]"):
        SelectionPolicy(source_caps={"b_cam": -1})
    with pytest.raises(ValueError, match="source_weights\\[a_cam\\]"):
        SelectionPolicy(source_weights={"a_cam": float("nan")})


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
def test_training_set_changes_only_when_what_it_selects_changes(tiny_raw_root, tmp_path, instance):
    raw = tmp_path / "raw"
    shutil.copytree(tiny_raw_root, raw)
    resources = make_resources(raw, tmp_path / "state")
    for source in ("line_a_camera", "line_b_camera"):
        assert materialize_source(source, instance=instance, resources=resources).success
    first, meta = _version(instance, resources)
    assert _sources(meta) == ["line_a_camera", "line_b_camera"]
    manifest, selection = ts.read_selection(meta["dagster/uri"])
    assert [s["source"] for s in manifest["sources"]] == _sources(meta)
    assert manifest["policy"]["duplicates"].startswith("an exact duplicate (same sha256) is kept in the source")
    assert selection.num_rows == meta["dagster/row_count"] == sum(s["selected"] for s in manifest["sources"])
    assert set(selection.column("source").to_pylist()) == {"line_a_camera", "line_b_camera"}

    # A source validated again from unchanged data: same validated version, same training set.
    assert materialize_source("line_a_camera", instance=instance, resources=resources).success
    again, meta = _version(instance, resources)
    assert again == first and meta["cache"] == "hit"

    # One image of a chosen source changes: a new training set.
    _touch_one_image(raw, "line_a_camera")
    assert materialize_source("line_a_camera", instance=instance, resources=resources).success
    changed, meta = _version(instance, resources)
    assert changed != first and "upstream validated_images[line_a_camera] changed" in meta["cache_reason"]

    # A source that is not chosen changes: the training set of the chosen ones stays as it was.
    chosen = {"sources": ["line_a_camera", "line_b_camera"]}
    assert materialize_source("warehouse_scanner", instance=instance, resources=resources).success
    before, _ = _version(instance, resources, **chosen)
    _touch_one_image(raw, "warehouse_scanner")
    assert materialize_source("warehouse_scanner", instance=instance, resources=resources).success
    after, meta = _version(instance, resources, **chosen)
    assert after == before and meta["cache"] == "hit"
    # Chosen by default (every registered source with a validated set), it changes.
    everything, meta = _version(instance, resources)
    assert everything != after and _sources(meta) == ["line_a_camera", "line_b_camera", "warehouse_scanner"]

    # The cap: each source keeps at most that many images, the rest are listed with the reason.
    _, meta = _version(instance, resources, max_images_per_source=3)
    excluded = ts.read_excluded(meta["dagster/uri"]).to_pylist()
    assert meta["dagster/row_count"] == 3 * 3
    assert meta["over_cap"] == sum(row["reason"].startswith("over the cap") for row in excluded) > 0

    # A config naming an unknown source or category fails before anything is written, saying which.
    for config, named in (({"sources": ["no_such_cam"]}, "no_such_cam"), ({"categories": ["unicorn"]}, "unicorn")):
        result = materialize_tail(
            instance=instance,
            resources=resources,
            assets=[training_set],
            run_config={"ops": {"training_set": {"config": config}}},
            raise_on_error=False,
        )
        assert not result.success and named in str(result.all_events)
