"""What the UI shows of a materialization leads somewhere: every path in the metadata names a file or
folder that exists after the run (the published output, never the job's staging folder), and a cache
hit says so first, naming the run and job that built the output, with its own wall time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import make_resources
from dagster import MetadataValue, PathMetadataValue, TextMetadataValue, UrlMetadataValue, instance_for_test
from helpers.graph_runs import materialize_graph, materialize_source, materialize_tail

from zero_assets.defs.assets import PER_SOURCE_ASSETS, TAIL_ASSETS
from zero_assets.launch.metadata import BUILD_KEYS, cache_first, hit_metadata, published_paths, rounded_for_display
from zero_assets.launch.upstream import latest_materializations

SOURCES = ["line_a_camera", "warehouse_scanner"]
FAST_TRAINING = {
    "ops": {"trained_checkpoint": {"config": {"max_steps": 4, "checkpoint_every": 4, "batch_size": 2, "processes": 1}}}
}


@pytest.mark.parametrize(
    ("reported", "outputs", "published"),
    [
        # the local backend's layout: the run's folder, then SageMaker's /opt/ml
        (
            "/lake/_jobs/map_report/ab/runs/r1/job/opt/ml/processing/output/out/metrics.json",
            {"out": "/lake/m/ab"},
            "/lake/m/ab/metrics.json",
        ),
        (
            "/lake/_jobs/t/ab/runs/r1/job/opt/ml/model/model.pt",
            {"out": "s3://b/lake/t/ab/"},
            "s3://b/lake/t/ab/model.pt",
        ),
        ("/opt/ml/model", {"out": "/lake/t/ab"}, "/lake/t/ab"),
        ("/opt/ml/processing/output/out/sub/a.png", {"out": "/lake/m/ab"}, "/lake/m/ab/sub/a.png"),
    ],
)
def test_a_path_in_the_staged_output_names_the_published_file(reported, outputs, published):
    for value in (reported, MetadataValue.text(reported), MetadataValue.path(reported)):
        assert published_paths({"p": value}, outputs) == {"p": MetadataValue.path(published)}


@pytest.mark.parametrize(
    "kept",
    [
        "/lake/_jobs/t/ab/runs/r1/job/opt/ml/output/job.log",  # the job's log stays in the run's folder
        "/lake/_jobs/t/ab/runs/r1/job/opt/ml/output/data/wandb",
        "/opt/ml/processing/output/other/x.json",  # an output this materialization does not publish
        "/lake/t/ab/model.pt",
        "opt/ml/modelling",
    ],
)
def test_other_paths_and_values_are_left_as_reported(kept):
    metadata = {"p": MetadataValue.path(kept), "t": kept, "n": 3, "j": MetadataValue.json({"a": kept})}
    assert published_paths(metadata, {"out": "/lake/t/cd"}) == metadata


def test_a_hit_says_so_first_and_names_the_build_it_reuses():
    earlier = {
        "dagster/uri": MetadataValue.path("/lake/v/ab"),
        "accepted": 12,
        "job_name": "zero-validated-images-ab-a1",
        "job_wall_s": 15.9,
        "instance_seconds": 15.9,
        "job_logs": MetadataValue.path("/lake/_jobs/v/ab/runs/r1/job/opt/ml/output/job.log"),
        "map_job_name": "zero-validated-images-map-ab-a1",
        "cache": "miss",
        "cache_reason": "first materialization",
        "built_by_run": "r1",
        "built_by_job": "zero-validated-images-ab-a1",
        "step_wall_s": 17.0,
    }
    hit = cache_first({**hit_metadata(earlier, "same inputs as run r1", "r1"), "step_wall_s": 0.2})
    assert list(hit)[:5] == ["cache", "cache_reason", "built_by_run", "built_by_job", "step_wall_s"]
    assert (hit["cache"], hit["cache_reason"], hit["built_by_run"], hit["step_wall_s"]) == (
        "hit",
        "same inputs as run r1",
        "r1",
        0.2,
    )
    assert hit["built_by_job"] == "zero-validated-images-ab-a1"
    assert not {"job_name", "job_wall_s", "instance_seconds", "job_logs", "map_job_name"} & set(hit)
    assert hit["built_job_wall_s"] == 15.9 and hit["built_job_logs"] == earlier["job_logs"]
    assert hit["accepted"] == 12 and hit["dagster/uri"] == earlier["dagster/uri"]
    # A hit on that hit still names the run that built the output, not the one that reused it.
    again = hit_metadata(hit, "same inputs as run r2", "r2")
    assert (again["built_by_run"], again["built_by_job"], again["built_job_wall_s"]) == (
        "r1",
        hit["built_by_job"],
        15.9,
    )
    assert "built_built_job_wall_s" not in again
    # In-process builds name no job; a hit found through the marker alone knows neither.
    assert hit_metadata({"accepted": 1}, "same", "r1")["built_by_job"] == "none: built in the Dagster step"
    assert not {"built_by_run", "built_by_job"} & set(hit_metadata({"accepted": 1}, "same", None, recorded=False))


def test_numbers_are_rounded_for_display_and_nothing_else_is():
    metadata = {"mAP": 0.6324876543210987, "loss": MetadataValue.float(0.000123456789), "steps": 200, "ok": True}
    shown = rounded_for_display({**metadata, "name": "x", "nan": float("nan")})
    assert shown["mAP"] == MetadataValue.float(0.6325) and shown["loss"] == MetadataValue.float(0.0001235)
    assert (shown["steps"], shown["ok"], shown["name"]) == (200, True, "x") and shown["nan"] != shown["nan"]


def _latest(instance) -> dict[str, tuple[str, dict]]:
    """`asset[source]` or `asset` -> (run id, metadata entries) of its latest materialization."""

    def record(asset, source=None):
        [found] = latest_materializations(instance, asset, source)
        return found.run_id, dict(found.asset_materialization.metadata)

    per_source = {
        f"{a.key.to_user_string()}[{s}]": record(a.key.to_user_string(), s) for a in PER_SOURCE_ASSETS for s in SOURCES
    }
    return per_source | {a.key.to_user_string(): record(a.key.to_user_string()) for a in TAIL_ASSETS}


def _dangling(entries: dict, state: Path) -> list[str]:
    """Entries naming a file or folder that is not there: every path and file URL, and any text naming
    a path under the test's state folder (a path reported as plain text must lead somewhere too)."""
    missing = []
    for key, value in entries.items():
        if isinstance(value, PathMetadataValue):
            where = value.value
        elif isinstance(value, UrlMetadataValue):
            if not value.value.startswith("file://"):
                continue  # nothing outside this machine is reached from a test
            where = value.value.removeprefix("file://")
        elif isinstance(value, TextMetadataValue) and value.value.startswith(str(state)):
            where = value.value
        else:
            continue
        if not Path(where).exists():
            missing.append(f"{key}: {where}")
    return missing


@pytest.fixture(scope="module")
def graph(tiny_raw_root, tmp_path_factory):
    """The demo graph (two sources, a short training) materialized once, then once more: all hits."""
    state = tmp_path_factory.mktemp("links")
    resources = make_resources(tiny_raw_root, state / "state")
    with instance_for_test(temp_dir=str(state)) as instance:
        per_source, tail = materialize_graph(
            tiny_raw_root, instance=instance, resources=resources, run_config=FAST_TRAINING, sources=SOURCES
        )
        assert all(r.success for r in per_source.values()) and tail.success
        built = _latest(instance)
        for source in SOURCES:
            assert materialize_source(source, instance=instance, resources=resources).success
        assert materialize_tail(instance=instance, resources=resources, run_config=FAST_TRAINING).success
        yield state / "state", built, _latest(instance)


@pytest.mark.slow
def test_every_path_in_every_materialization_exists_after_the_run(graph):
    state, built, reused = graph
    for label, (_, entries) in [*built.items(), *((f"{k} (hit)", v) for k, v in reused.items())]:
        assert not _dangling(entries, state), f"{label} names paths that do not exist: {_dangling(entries, state)}"
    # The job-reported files are links to the published output.
    for asset, key, name in [
        ("map_report", "metrics_path", "metrics.json"),
        ("trained_checkpoint", "model_path", "model.pt"),
    ]:
        value = built[asset][1][key]
        assert isinstance(value, PathMetadataValue), (asset, key, value)
        assert value.value == f"{built[asset][1]['dagster/uri'].value}/{name}"
    # The source without a drawable quarantined image says which source has a contact sheet.
    sheets = reused["validated_images[warehouse_scanner]"][1]["quarantine_contact_sheets"].value
    assert "| line_a_camera | 1 of 2 on its contact sheet |" in sheets, sheets
    assert "| warehouse_scanner (this source) | 1 quarantined, none that still decodes: no sheet |" in sheets, sheets
    # mAP shows 4 digits; metrics.json, which the entry links, keeps the full value.
    report = built["map_report"][1]
    full = json.loads(Path(report["metrics_path"].value).read_text())
    for key in ("mAP", "mAP_50", "AR_100"):
        assert report[key].value == float(f"{full[key]:.4g}"), (key, report[key].value, full[key])


@pytest.mark.slow
def test_a_hit_names_the_run_and_job_that_built_the_output_and_times_itself(graph):
    _, built, reused = graph
    for label, (run_id, entries) in reused.items():
        first = list(entries)[:5]
        assert first[:2] == ["cache", "cache_reason"], (label, first)
        assert entries["cache"].value == "hit", (label, entries["cache_reason"].value)
        built_run, built_entries = built[label]
        assert run_id != built_run, label
        assert entries["built_by_run"].value == built_run, label
        job = built_entries.get("job_name")
        assert entries["built_by_job"].value == (job.value if job else "none: built in the Dagster step"), label
        assert not BUILD_KEYS & set(entries), f"{label} repeats its builder's {sorted(BUILD_KEYS & set(entries))}"
        if "job_wall_s" in built_entries:
            assert entries["built_job_wall_s"] == built_entries["job_wall_s"], label
            assert entries["step_wall_s"].value < built_entries["job_wall_s"].value, label
        # The miss says who built it too: this run, and its job.
        assert built_entries["built_by_run"].value == built_run and list(built_entries)[:2] == ["cache", "cache_reason"]
