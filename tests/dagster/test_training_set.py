"""The training set is the selection: the policy's rules on the validated tables (sources, caps and
weights, categories, negatives, exact duplicates across sources, the split as validated), run as a job,
and a data version that follows what was selected, so an unchanged selection leaves the shards alone."""

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from conftest import make_resources
from dagster import AssetKey
from helpers.graph_runs import materialize_source, materialize_tail
from helpers.policy_runs import accepted, outcome, run_policy_over

from benchmarks.pyarrow_selection.selection import SelectionPolicy as BaselinePolicy
from benchmarks.pyarrow_selection.selection import select_rows
from training_code.lib import training_set as ts
from training_code.lib.selection_engine import explain
from training_code.lib.selection_plan import SelectionPolicy
from zero_assets.core.settings import REPO_ROOT as REPO
from zero_assets.defs.assets import training_set

ROWS = accepted(
    [
        {"key": "b_cam/lot/1.png", "source": "b_cam", "sha256": "1" * 64, "category_names": ["bolt"]},
        {"key": "b_cam/lot/2.png", "source": "b_cam", "sha256": "2" * 64, "category_names": ["nut"], "split": "val"},
        {"key": "b_cam/lot/3.png", "source": "b_cam", "sha256": "3" * 64, "category_names": ["bolt", "nut"]},
        # the same bytes as b_cam/lot/2.png
        {"key": "a_cam/lot/9.png", "source": "a_cam", "sha256": "2" * 64, "category_names": ["nut", "bolt"]},
        {"key": "a_cam/lot/8.png", "source": "a_cam", "sha256": "4" * 64},  # a negative
        {"key": "c_cam/lot/5.png", "source": "c_cam", "sha256": "5" * 64, "category_names": ["nut"]},
    ]
)


def _select(**policy) -> tuple[list[str], dict[str, str]]:
    return outcome(run_policy_over(ROWS, SelectionPolicy(**policy)))


def test_an_exact_duplicate_stays_in_the_source_that_sorts_first():
    selected, excluded = _select()
    assert selected == ["a_cam/lot/8.png", "a_cam/lot/9.png", "b_cam/lot/1.png", "b_cam/lot/3.png", "c_cam/lot/5.png"]
    assert excluded == {"b_cam/lot/2.png": "duplicate of an image kept in source a_cam"}


@pytest.mark.parametrize(
    ("policy", "selected", "reason"),
    [
        ({"max_images_per_source": 1}, ["a_cam/lot/9.png", "b_cam/lot/1.png", "c_cam/lot/5.png"], "over the cap of 1 "),
        ({"source_caps": {"b_cam": 0}}, ["a_cam/lot/8.png", "a_cam/lot/9.png", "c_cam/lot/5.png"], "over the cap of 0"),
        ({"max_images": 2, "source_weights": {"c_cam": 0}}, ["a_cam/lot/9.png", "b_cam/lot/1.png"], "over source"),
    ],
    ids=["per source", "one source", "weighted total"],
)
def test_caps_keep_the_images_whose_sha256_sorts_lowest(policy, selected, reason):
    kept, excluded = _select(**policy)
    assert kept == selected
    over = [key for key, why in excluded.items() if why.startswith("over")]
    assert over and all(excluded[key].startswith(reason) for key in over)
    assert set(kept) | set(excluded) == set(ROWS.column("key").to_pylist()), "every row is selected or says why not"


def test_categories_keep_their_boxes_and_exclude_images_left_with_none():
    engine = run_policy_over(ROWS, SelectionPolicy(categories=("bolt",), negatives=False))
    rows = engine.execute("SELECT key, category_names, len(boxes) FROM selected ORDER BY key").fetchall()
    assert rows == [
        ("a_cam/lot/9.png", ["bolt"], 1),
        ("b_cam/lot/1.png", ["bolt"], 1),
        ("b_cam/lot/3.png", ["bolt"], 1),
    ]
    _, reasons = outcome(engine)
    assert reasons["c_cam/lot/5.png"] == "no box of the chosen categories"
    assert reasons["a_cam/lot/8.png"].startswith("a negative")
    # A duplicate is judged among the rows still eligible: b_cam/2.png has no bolt, so it is out for that.
    assert reasons["b_cam/lot/2.png"] == "no box of the chosen categories"


@pytest.mark.parametrize(
    ("images", "weights", "total", "shares"),
    [
        ({"a": 5, "b": 100, "c": 100}, {"c": 2.0}, 30, {"a": 5, "b": 8, "c": 17}),
        ({"a": 5, "b": 5}, {}, 30, {"a": 5, "b": 5}),
        ({"a": 10, "b": 10, "c": 10}, {}, 10, {"a": 4, "b": 3, "c": 3}),
    ],
    ids=["a full source's rest to the others", "fewer than the total", "the last image to the first name"],
)
def test_max_images_is_shared_by_weight_and_a_full_source_leaves_the_rest(images, weights, total, shares):
    rows = accepted([{"source": s, "key": f"{s}/lot/{n}.png"} for s, count in images.items() for n in range(count)])
    engine = run_policy_over(rows, SelectionPolicy(max_images=total, source_weights=weights))
    assert dict(engine.execute("SELECT source, count(*) FROM selected GROUP BY source").fetchall()) == shares


def test_the_policy_selects_what_the_in_process_selection_selected():
    """The SQL policy against the pyarrow selection it replaced (benchmarks/pyarrow_selection), on rows of
    four sources with exact copies across them, unannotated images and negatives, under every setting."""
    rows = []
    for n in range(400):
        source = f"cam_{n % 4}"
        rows.append(
            {
                "source": source,
                "key": f"{source}/lot_{n % 9}/{n}.png",
                "sha256": f"{(n * 7919) % 397:064x}",  # some bytes in two sources
                "category_names": [["bolt", "nut", "gear"][(n + k) % 3] for k in range(n % 3)],
                "split": "val" if n % 9 == 2 else "train",
                "annotation": "unlisted" if n % 37 == 0 else "annotated",
            }
        )
    table = accepted(rows)
    baseline_rows = table.select([*ts.SELECTION_SCHEMA.names, "annotation"])
    policies = [
        {},
        {"max_images_per_source": 60},
        {"source_caps": {"cam_1": 10}, "max_images_per_source": 80},
        {"max_images": 150, "source_weights": {"cam_0": 3.0, "cam_2": 0.5, "cam_3": 0}},
        {"categories": ("nut",), "negatives": False},
        {"categories": ("gear", "bolt"), "max_images": 77},
    ]
    for policy in policies:
        before = select_rows(baseline_rows, BaselinePolicy(**policy))
        engine = run_policy_over(table, SelectionPolicy(**policy))
        columns = ", ".join(f'"{name}"' for name in ts.SELECTION_SCHEMA.names if name != "etag")
        now = engine.sql(f"SELECT {columns} FROM selected ORDER BY source, key").to_arrow_table()
        assert now.num_rows > 0 and now.to_pylist() == before.selected.drop_columns(["etag"]).to_pylist(), policy
        reasons = engine.execute("SELECT key, reason FROM decisions WHERE rule IS NOT NULL ORDER BY source, key")
        assert reasons.fetchall() == [(r["key"], r["reason"]) for r in before.excluded.to_pylist()], policy


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


def _assert_as_the_in_process_selection_selected(folder: str, manifest: dict) -> None:
    """The job's selection on the demo lake against the in-process selection it replaced, wherever the
    near-duplicate rule (resolved per group before, per image now) is not involved."""
    tables = []
    for source in manifest["sources"]:
        validated = Path(source["validated_uri"])
        rows = pq.read_table(validated / "accepted.parquet")
        verdicts = pq.read_table(validated / "verdicts.parquet", columns=["key", "etag"])
        rows = rows.append_column(
            "etag", pc.take(verdicts["etag"], pc.index_in(rows["key"], value_set=verdicts["key"]))
        )
        rows = rows.set_column(rows.schema.get_field_index("phash"), "phash", pc.list_element(rows["phash"], 0))
        tables.append(rows.select([*ts.SELECTION_SCHEMA.names, "annotation", "phash"]))
    before = select_rows(pa.concat_tables(tables), BaselinePolicy())
    now = pq.read_table(Path(folder) / ts.NEAR_DUPLICATES)
    involved = set(now["key"].to_pylist()) | set(before.near_duplicates["key"].to_pylist())
    _, selection = ts.read_selection(folder)
    kept = {row["key"]: row for row in selection.to_pylist() if row["key"] not in involved}
    earlier = {row["key"]: row for row in before.selected.to_pylist() if row["key"] not in involved}
    assert kept and kept == earlier


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
    assert manifest["policy"] == SelectionPolicy().as_config() and "policy.sql" in manifest["files"]
    _assert_as_the_in_process_selection_selected(meta["dagster/uri"], manifest)
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
    assert meta["dagster/row_count"] == 3 * 3
    manifest, selection = ts.read_selection(meta["dagster/uri"])
    assert meta["over_cap"] == sum(s["excluded_by_rule"].get("over_cap", 0) for s in manifest["sources"]) > 0
    # Images over a cap are counted, not listed; the policy, run again, says why one was left out.
    validated = Path(manifest["sources"][0]["validated_uri"])
    left_out = sorted(
        set(pq.read_table(validated / "accepted.parquet")["key"].to_pylist()) - set(selection["key"].to_pylist())
    )
    assert left_out and left_out[0] not in ts.read_excluded(meta["dagster/uri"])["key"].to_pylist()
    decided = explain(meta["dagster/uri"], left_out[0], tmp_path / "explain")
    assert decided["rule"] == "over_cap" and decided["reason"] == "over the cap of 3 images per source"

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


@pytest.mark.slow
def test_a_policy_of_your_own_selects_by_your_own_table(tiny_raw_root, tmp_path, instance):
    """docs/policies/site_scores.sql with a table of scores the user made: the images scored 0.5 or more
    are selected, the rest are counted under the policy's own rule; a new table is a new training set."""
    resources = make_resources(tiny_raw_root, tmp_path / "state")
    assert materialize_source("line_a_camera", instance=instance, resources=resources).success
    validated = instance.get_latest_materialization_event(AssetKey("validated_images")).asset_materialization
    accepted_rows = pq.read_table(Path(validated.metadata["dagster/uri"].value) / "accepted.parquet")
    keys = accepted_rows.filter(pc.equal(accepted_rows["annotation"], "annotated"))["key"].to_pylist()
    scores = tmp_path / "site_scores.parquet"
    pq.write_table(pa.table({"key": keys, "score": [n % 2 * 0.9 for n in range(len(keys))]}), scores)
    config = {"policy_sql": str(REPO / "docs" / "policies" / "site_scores.sql"), "tables": {"site_scores": str(scores)}}

    _, meta = _version(instance, resources, **config)
    manifest, selection = ts.read_selection(meta["dagster/uri"])
    assert sorted(selection["key"].to_pylist()) == sorted(keys[1::2]) and keys[1::2]
    assert manifest["sources"][0]["excluded_by_rule"]["site_score"] == len(keys[::2])
    assert meta["excluded_by_other_rules"] == {"site_score": len(keys[::2])}

    pq.write_table(pa.table({"key": keys, "score": [0.9] * len(keys)}), scores)
    _, meta = _version(instance, resources, **config)
    assert meta["cache"] == "miss" and "config tables" in meta["cache_reason"]
    assert meta["dagster/row_count"] == len(keys)
