"""Versions and triggers: a code edit rebuilds the raw index under a new folder and data version, and
the raw-data sensor requests exactly one run per change of a source, with a run key Dagster has not seen.

The code-version test edits a real copy of the package and materializes in fresh subprocesses, as a
redeployed code location would; the sensor test ticks against a real instance and a raw root on disk.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from dagster._core.storage.tags import RUN_KEY_TAG
from helpers.sensor_ticks import SensorDaemon

from zero_assets.core.settings import ZeroSettings

REPO = Path(__file__).resolve().parents[2]

MATERIALIZE_INDEX = """
import json, sys
import zero_assets
from dagster import AssetKey, DagsterInstance, materialize
from zero_assets.defs.assets.raw_image_index import raw_image_index
from zero_assets.backends.local.runner import LocalJobRunner
from zero_assets.core.settings import ZeroSettings

raw, lake = sys.argv[1:3]
source = "line_a_camera"  # the index is per source: one partition is enough to see the code version
with DagsterInstance.get() as instance:
    settings = ZeroSettings(raw_uri=raw, lake_uri=lake)
    if not instance.has_dynamic_partition("raw_sources", source):
        instance.add_dynamic_partitions("raw_sources", [source])
    materialize(
        [raw_image_index],
        instance=instance,
        resources={"settings": settings, "jobs": LocalJobRunner(settings=settings)},
        partition_key=source,
        raise_on_error=True,
    )
    event = instance.get_latest_materialization_event(AssetKey("raw_image_index")).asset_materialization
print(json.dumps({"package": zero_assets.__file__, "dagster/uri": event.metadata["dagster/uri"].value,
                  "cache": event.metadata["cache"].value, "data_version": event.tags["dagster/data_version"]}))
"""


@pytest.fixture
def package_copy(tmp_path) -> Path:
    """The project's code copied to a folder of its own, so a test can edit it like a developer would."""
    code = tmp_path / "code"
    for package in ("zero_assets", "training_code"):
        shutil.copytree(REPO / package, code / package, ignore=shutil.ignore_patterns("__pycache__"))
    return code


def _materialize_index(code: Path, raw: Path, lake: Path, home: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(code), "DAGSTER_HOME": str(home)}
    done = subprocess.run(
        [sys.executable, "-c", MATERIALIZE_INDEX, str(raw), str(lake)],
        cwd=code,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["package"].startswith(str(code)), "the subprocess must run the copied (edited) code"
    return result


def test_editing_the_index_code_changes_its_folder_and_data_version(package_copy, tiny_raw_root, tmp_path):
    home, lake = tmp_path / "dagster_home", tmp_path / "lake"
    home.mkdir()
    first = _materialize_index(package_copy, tiny_raw_root, lake, home)
    again = _materialize_index(package_copy, tiny_raw_root, lake, home)
    assert (again["cache"], again["dagster/uri"], again["data_version"]) == (
        "hit",
        first["dagster/uri"],
        first["data_version"],
    )

    # A comment is enough: the code version is derived from the source files, not typed by hand.
    raw_index = package_copy / "training_code" / "lib" / "raw_index.py"  # what both the asset and the index job run
    raw_index.write_text(raw_index.read_text() + "\n# reviewed: no behaviour change\n")
    edited = _materialize_index(package_copy, tiny_raw_root, lake, home)
    assert edited["cache"] == "miss"
    assert edited["dagster/uri"] != first["dagster/uri"], (
        "an index built by other code must not share the old output folder"
    )
    assert edited["data_version"] != first["data_version"], "downstream must see the index as changed"
    assert (Path(edited["dagster/uri"]) / "index.parquet").is_file() and (
        Path(first["dagster/uri"]) / "index.parquet"
    ).is_file()


@pytest.fixture
def raw_root(tiny_raw_root, tmp_path) -> Path:
    root = tmp_path / "raw"
    shutil.copytree(tiny_raw_root, root)
    return root


def test_every_change_launches_one_run_per_changed_source_and_a_return_to_an_earlier_state_is_not_dropped(
    instance, raw_root
):
    # SensorDaemon (tests/helpers/sensor_ticks.py) drops a request whose run key was used before, as Dagster does.
    daemon = SensorDaemon(instance, ZeroSettings(raw_uri=str(raw_root)))
    first, launched = daemon.tick()
    assert sorted(r.partition_key for r in launched) == ["line_a_camera", "line_b_camera", "warehouse_scanner"], (
        "one run per source"
    )
    first_versions = {r.partition_key: r.tags["zero/raw_version"] for r in launched}
    assert daemon.tick()[1] == [] and daemon.tick()[0].skip_message, "an unchanged root launches nothing"

    some_image = sorted(p for p in (raw_root / "line_a_camera").rglob("*") if p.suffix in (".png", ".jpg"))[0]
    added = raw_root / "warehouse_scanner" / f"zz_added{some_image.suffix}"
    shutil.copy(some_image, added)
    _, launched = daemon.tick()
    assert [r.partition_key for r in launched] == ["warehouse_scanner"], "an added image runs its source only"

    added.unlink()  # back to the first state: its version was seen before
    _, launched = daemon.tick()
    assert [r.partition_key for r in launched] == ["warehouse_scanner"], (
        "removing the image is a change too; Dagster must not drop its run"
    )
    assert launched[0].tags["zero/raw_version"] == first_versions["warehouse_scanner"], (
        "the same state has the same data version"
    )

    annotations = raw_root / "line_b_camera" / "annotations.json"
    coco = json.loads(annotations.read_text())
    coco["annotations"][0]["bbox"][0] += 1  # a label fix: no image changes
    annotations.write_text(json.dumps(coco))
    cursor_before_edit = daemon.cursor
    edited, launched = daemon.tick()
    assert [r.partition_key for r in launched] == ["line_b_camera"], "an annotations.json edit alone runs its source"

    assert daemon.tick()[1] == [], "nothing changed since: no run"
    retried, relaunched = daemon.tick(cursor_before_edit, keep_cursor=False)
    assert [r.run_key for r in retried.run_requests] == [r.run_key for r in edited.run_requests] and relaunched == [], (
        "a retried tick (same cursor) repeats its run keys, so a daemon restart never launches a change twice"
    )
    keys = [run.tags[RUN_KEY_TAG] for run in instance.get_runs()]
    assert len(keys) == len(set(keys)) == 6
