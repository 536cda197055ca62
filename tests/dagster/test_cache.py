"""Fingerprints skip unchanged work, say why they ran, and notice outputs deleted behind their back."""

import os
import shutil
import sys
import time
from pathlib import Path

import pytest
from conftest import make_resources
from helpers.graph_runs import graph_metadata, materialize_graph

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


def _training(max_steps: int) -> dict:
    return {"ops": {"trained_checkpoint": {"config": {"max_steps": max_steps, "checkpoint_every": 4, "batch_size": 4}}}}


def _materialize(resources, instance, max_steps=8) -> dict[str, dict]:
    """Every source, then the tail: `asset[source]` or `asset` -> its metadata."""
    raw = Path(resources["settings"].raw_uri)
    per_source, tail = materialize_graph(raw, instance=instance, resources=resources, run_config=_training(max_steps))
    return graph_metadata(per_source, tail)


def _job_files(state: Path) -> dict[str, int]:
    return {str(p): p.stat().st_mtime_ns for p in (state / "lake" / "_jobs").rglob("*") if p.is_file()}


class ImageReads:
    """Records every open() of a raw image in this process (audit hooks cannot be removed: gate them)."""

    active: "ImageReads | None" = None

    def __init__(self, raw_root: Path) -> None:
        self.raw_root, self.paths = str(raw_root), []

    def __enter__(self):
        ImageReads.active = self
        return self

    def __exit__(self, *exc):
        ImageReads.active = None


def _audit(event, args):
    watcher = ImageReads.active
    if watcher is not None and event == "open" and isinstance(args[0], (str, os.PathLike)):
        path = str(args[0])
        if path.startswith(watcher.raw_root) and path.lower().endswith(IMAGE_SUFFIXES):
            watcher.paths.append(path)


sys.addaudithook(_audit)


@pytest.fixture
def raw_copy(tiny_raw_root, tmp_path):
    root = tmp_path / "raw"
    shutil.copytree(tiny_raw_root, root)
    return root


@pytest.mark.slow
def test_second_materialization_launches_nothing_and_reads_no_image(raw_copy, tmp_path, instance):
    state = tmp_path / "state"
    resources = make_resources(raw_copy, state)
    started = time.perf_counter()
    first = _materialize(resources, instance)
    first_wall = time.perf_counter() - started
    assert all(first[a]["cache"] == "miss" for a in first)
    jobs_before = _job_files(state)

    started = time.perf_counter()
    with ImageReads(raw_copy) as reads:
        second = _materialize(resources, instance)
    second_wall = time.perf_counter() - started
    assert {a: second[a]["cache"] for a in first} == {a: "hit" for a in first}
    assert all(second[a]["dagster/uri"] == first[a]["dagster/uri"] for a in first), "the reused outputs are reported"
    assert all("same input fingerprint" in second[a]["cache_reason"] for a in first)
    assert _job_files(state) == jobs_before, "no job was launched: no job folder was touched"
    assert reads.paths == [], f"no image bytes are read to decide: {reads.paths[:3]}"
    print(
        f"noop rematerialize: first {first_wall:.1f}s, second {second_wall:.1f}s, ratio {second_wall / first_wall:.3f}"
    )


@pytest.mark.slow
def test_changes_rerun_exactly_what_depends_on_them(raw_copy, tmp_path, instance):
    resources = make_resources(raw_copy, tmp_path / "state")
    _materialize(resources, instance)

    training_only = _materialize(resources, instance, max_steps=10)
    assert {a: training_only[a]["cache"] for a in training_only} == {
        a: "miss" if a in ("trained_checkpoint", "map_report") else "hit" for a in training_only
    }
    assert "config max_steps: 8 -> 10" in training_only["trained_checkpoint"]["cache_reason"]
    assert "upstream trained_checkpoint changed" in training_only["map_report"]["cache_reason"]

    image = sorted(p for p in raw_copy.rglob("*.png") if "lot_900" not in str(p))[0]
    image.write_bytes(image.read_bytes() + b"\0")  # one raw image changes (a trailing byte PNG decoders ignore)
    source = image.relative_to(raw_copy).parts[0]
    changed = _materialize(resources, instance, max_steps=10)
    assert changed[f"raw_image_index[{source}]"]["cache"] == "miss"
    assert "upstream raw_image_index changed" in changed[f"validated_images[{source}]"]["cache_reason"]
    # Only that source's assets and the tail rebuild; the other sources are hits.
    expected = {a: "miss" if "[" not in a or a.endswith(f"[{source}]") else "hit" for a in changed}
    assert {a: changed[a]["cache"] for a in changed} == expected
    assert f"upstream validated_images[{source}] changed" in changed["training_set"]["cache_reason"]
    assert "upstream training_set changed" in changed["arrow_shards"]["cache_reason"]


@pytest.mark.slow
def test_output_deleted_behind_dagsters_back_is_rebuilt(raw_copy, tmp_path, instance):
    resources = make_resources(raw_copy, tmp_path / "state")
    first = _materialize(resources, instance)
    shards = "arrow_shards"
    shutil.rmtree(first[shards]["dagster/uri"])
    again = _materialize(resources, instance)
    assert again[shards]["cache"] == "miss"
    assert "missing or incomplete" in again[shards]["cache_reason"]
    assert Path(again[shards]["dagster/uri"], "manifest.json").is_file()
    # The rebuild writes the same bytes, so nothing downstream goes stale.
    assert (
        again["training_set"]["cache"]
        == again["fsx_warm_state"]["cache"]
        == again["trained_checkpoint"]["cache"]
        == "hit"
    )
