"""The raw-data sensor requests a run for every kind of change (images or annotations) and none without one."""

import os
import shutil

import pytest
from dagster import DagsterInstance, RunRequest, SkipReason, build_sensor_context

from zero_assets.resources import ZeroSettings
from zero_assets.sensors import new_raw_data_sensor


@pytest.fixture
def raw_root(tiny_raw_root, tmp_path):
    root = tmp_path / "raw"
    shutil.copytree(tiny_raw_root, root)
    return root


def _tick(raw_root, cursor):
    context = build_sensor_context(
        cursor=cursor, instance=DagsterInstance.ephemeral(), resources={"settings": ZeroSettings(raw_uri=str(raw_root))}
    )
    return new_raw_data_sensor(context), context.cursor


def test_first_tick_requests_a_run_and_an_unchanged_root_requests_none(raw_root):
    first, cursor = _tick(raw_root, None)
    assert isinstance(first, RunRequest)
    second, same_cursor = _tick(raw_root, cursor)
    assert isinstance(second, SkipReason) and same_cursor == cursor


@pytest.mark.parametrize("change", ["added", "modified_in_place", "sorts_before_cursor", "removed", "annotations_edited"])
def test_every_kind_of_change_requests_a_run(raw_root, change):
    _, cursor = _tick(raw_root, None)
    some_image = next(raw_root.glob("line_a_camera/lot_000/*.png"), None) or next(raw_root.glob("line_a_camera/lot_000/*.jpg"))
    if change == "added":
        shutil.copy(some_image, raw_root / "warehouse_scanner" / "lot_000" / f"zz_new{some_image.suffix}")
    elif change == "modified_in_place":  # same key, same size, new bytes and mtime
        data = bytearray(some_image.read_bytes())
        data[-3] ^= 0xFF
        some_image.write_bytes(bytes(data))
        stat = some_image.stat()
        os.utime(some_image, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    elif change == "sorts_before_cursor":  # a key that sorts before everything already listed
        (raw_root / "aaa_first_source").mkdir()
        shutil.copy(some_image, raw_root / "aaa_first_source" / f"a{some_image.suffix}")
    elif change == "removed":
        some_image.unlink()
    else:  # a label fix: annotations.json changes, no image does
        annotations = raw_root / "line_a_camera" / "annotations.json"
        annotations.write_text(annotations.read_text() + "\n")
    result, new_cursor = _tick(raw_root, cursor)
    assert isinstance(result, RunRequest), change
    assert new_cursor != cursor, "the cursor moves so the same change is not requested twice"

