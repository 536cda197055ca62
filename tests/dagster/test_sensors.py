"""The raw-data sensor, ticked as the daemon does against a real instance: new sources become
partitions, each changed source gets one raw_image_index run and a raw_data observation, the others
nothing. Events come from a real SQS-compatible server (moto) the way S3 sends them; local roots are
listed per source."""

import json
import os
import shutil

import pytest
from dagster import AssetKey, RunsFilter
from dagster._core.storage.tags import PARTITION_NAME_TAG
from helpers.sensor_ticks import SensorDaemon, s3_message, s3_record
from helpers.sqs_server import queue_counts, sqs

from zero_assets.core.settings import ZeroSettings

RAW = "s3://zero-raw/plant"


class Bucket:
    """Puts events on the queue as S3 would for writes and deletes under the raw root."""

    def __init__(self, queue_url):
        self.queue_url, self.sequence = queue_url, 0

    def event(self, event: str, *keys: str) -> None:
        for key in keys:
            self.sequence += 1
            record = s3_record(event, "zero-raw", f"plant/{key}", sequencer=f"{self.sequence:016X}")
            sqs().send_message(QueueUrl=self.queue_url, MessageBody=s3_message(record, sns=self.sequence % 2 == 0))


@pytest.fixture
def queue_daemon(instance, queue, monkeypatch):
    monkeypatch.setattr("zero_assets.defs.sensors.QUEUE_WAIT_S", 1.0)  # an empty queue's tick waits 1 s, not 5
    return SensorDaemon(instance, ZeroSettings(raw_uri=RAW, raw_events_queue_url=queue)), Bucket(queue)


def _partitions(launched) -> list[str]:
    return sorted(request.partition_key for request in launched)


def test_a_new_source_on_the_queue_becomes_a_partition_and_runs_alone(queue_daemon, instance):
    daemon, bucket = queue_daemon
    bucket.event("ObjectCreated:Put", "cam_a/lot_0/1.jpg", "cam_b/lot_0/1.jpg", "cam_c/lot_0/1.jpg")
    _, launched = daemon.tick()
    assert daemon.sources() == ["cam_a", "cam_b", "cam_c"] and _partitions(launched) == ["cam_a", "cam_b", "cam_c"]

    bucket.event("ObjectCreated:Put", "new_plant/lot_0/1.jpg", "new_plant/lot_0/2.jpg", "new_plant/annotations.json")
    result, launched = daemon.tick()
    assert daemon.sources() == ["cam_a", "cam_b", "cam_c", "new_plant"], "the new source is a partition"
    assert _partitions(launched) == ["new_plant"], "a run for the new source only, none for the others"
    assert (
        launched[0].asset_selection == [AssetKey("raw_image_index")]
        and launched[0].tags["zero/trigger"] == "new source"
    )
    assert daemon.raw_data_version("new_plant") == launched[0].tags["zero/raw_version"], (
        "raw_data observed with the change's version"
    )
    runs = instance.get_runs(RunsFilter(tags={PARTITION_NAME_TAG: "new_plant"}))
    assert len(runs) == 1


def test_an_annotation_edit_and_a_removal_trigger_their_source_only(queue_daemon):
    daemon, bucket = queue_daemon
    bucket.event("ObjectCreated:Put", "cam_a/lot_0/1.jpg", "cam_b/lot_0/1.jpg", "cam_c/lot_0/1.jpg")
    daemon.tick()
    bucket.event("ObjectCreated:Put", "cam_b/annotations.json")
    assert _partitions(daemon.tick()[1]) == ["cam_b"], "a label fix reindexes its source only"
    bucket.event("ObjectRemoved:Delete", "cam_c/lot_0/1.jpg")
    assert _partitions(daemon.tick()[1]) == ["cam_c"], "a removed image is a change of its source"
    assert daemon.tick()[1] == [], "nothing new on the queue: no run"


def test_messages_are_deleted_and_a_malformed_one_is_reported_not_fatal(queue_daemon, queue, capfd):
    daemon, bucket = queue_daemon
    sqs().send_message(QueueUrl=queue, MessageBody="<not an S3 event>")
    bucket.event("ObjectCreated:Put", "cam_a/lot_0/1.jpg", "cam_a/lot_0/../../escape.jpg", "../outside.jpg")
    result, launched = daemon.tick()
    assert _partitions(launched) == ["cam_a"], "the hostile key inside cam_a maps to cam_a; '..' is no source"
    warnings = [line for line in capfd.readouterr().err.splitlines() if " - WARNING - " in line]  # the sensor's log
    assert any("skipped" in w and "not JSON" in w for w in warnings), warnings
    assert any("../outside.jpg" in w for w in warnings), warnings
    assert len(result.cursor) < 400
    daemon.tick()  # the tick after a committed one deletes its messages
    assert sum(queue_counts(queue)) == 1, "all but the malformed message (left for the dead-letter queue) are deleted"


def test_hostile_events_never_stop_the_sensor(queue_daemon, queue):
    daemon, bucket = queue_daemon
    for body in [
        "",
        "null",
        "[]",
        '{"Records": "x"}',
        '{"Records": [{"eventName": 5}]}',
        json.dumps({"Records": [{"eventName": "ObjectCreated:Put", "s3": []}]}),
    ]:
        sqs().send_message(QueueUrl=queue, MessageBody=body or " ")
    bucket.event("ObjectCreated:Put", "cam\u2028/x.jpg", "cam_a/a\nb.jpg", "cam_a/%ff.jpg", "/abs.jpg", "a...b/x.jpg")
    result, launched = daemon.tick()
    assert _partitions(launched) == sorted(["cam\u2028", "cam_a"]), (
        "odd but safe names are sources; the rest are reported"
    )


# --- local raw roots: a listing digest per source ---


@pytest.fixture
def raw_root(tiny_raw_root, tmp_path):
    root = tmp_path / "raw"
    shutil.copytree(tiny_raw_root, root)
    return root


@pytest.fixture
def local_daemon(instance, raw_root):
    return SensorDaemon(instance, ZeroSettings(raw_uri=str(raw_root)))


def test_first_tick_registers_every_source_and_an_unchanged_root_requests_nothing(local_daemon):
    _, launched = local_daemon.tick()
    assert _partitions(launched) == local_daemon.sources() == ["line_a_camera", "line_b_camera", "warehouse_scanner"]
    result, launched = local_daemon.tick()
    assert launched == [] and result.skip_message


@pytest.mark.parametrize(
    "change, source",
    [
        ("added", "warehouse_scanner"),
        ("modified_in_place", "line_a_camera"),
        ("sorts_before_cursor", "aaa_first_source"),
        ("removed", "line_a_camera"),
        ("annotations_edited", "line_b_camera"),
    ],
)
def test_every_kind_of_change_runs_its_source_only(local_daemon, raw_root, change, source):
    local_daemon.tick()
    some_image = sorted(p for p in (raw_root / "line_a_camera").rglob("*") if p.suffix in (".png", ".jpg"))[0]
    if change == "added":
        shutil.copy(some_image, raw_root / "warehouse_scanner" / "lot_000" / f"zz_new{some_image.suffix}")
    elif change == "modified_in_place":  # same key, same size, new bytes and mtime
        data = bytearray(some_image.read_bytes())
        data[-3] ^= 0xFF
        some_image.write_bytes(bytes(data))
        stat = some_image.stat()
        os.utime(some_image, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    elif change == "sorts_before_cursor":  # a new source that sorts before everything listed
        (raw_root / "aaa_first_source").mkdir()
        shutil.copy(some_image, raw_root / "aaa_first_source" / f"a{some_image.suffix}")
    elif change == "removed":
        some_image.unlink()
    else:  # a label fix: annotations.json changes, no image does
        annotations = raw_root / "line_b_camera" / "annotations.json"
        annotations.write_text(annotations.read_text() + "\n")
    _, launched = local_daemon.tick()
    assert _partitions(launched) == [source], change


# --- the real daemon: the code location in its own process, the sensor daemon's iteration ---


def test_the_daemon_adds_partitions_observes_and_queues_one_run_per_changed_source(queue, monkeypatch, tmp_path):
    """Through Dagster's own sensor daemon and a code server process loading `zero_assets.definitions`:
    what the daemon does with the result (partitions, observations, run keys, cursor) is Dagster's."""
    import logging
    import time as clock
    from pathlib import Path

    from dagster import instance_for_test
    from dagster._core.test_utils import create_test_daemon_workspace_context, freeze_time
    from dagster._core.workspace.load_target import ModuleTarget
    from dagster._daemon.sensor import execute_sensor_iteration

    monkeypatch.setenv("ZERO_RAW_URI", RAW)
    monkeypatch.setenv("ZERO_RAW_EVENTS_QUEUE_URL", queue)
    monkeypatch.setenv("ZERO_LAKE_URI", str(tmp_path / "lake"))
    bucket = Bucket(queue)
    queued = {"run_coordinator": {"module": "dagster._core.run_coordinator", "class": "QueuedRunCoordinator"}}
    target = ModuleTarget(
        module_name="zero_assets.definitions",
        attribute="defs",
        working_directory=str(Path(__file__).parents[2]),
        location_name="zero_assets",
    )
    with (
        instance_for_test(overrides=queued) as instance,
        create_test_daemon_workspace_context(target, instance) as workspace,
    ):
        location = next(iter(workspace.create_request_context().get_code_location_entries().values()))
        assert location.code_location, location.load_error
        repository = next(iter(location.code_location.get_repositories().values()))
        instance.start_sensor(repository.get_sensor("new_raw_data_sensor"))
        now = clock.time()

        def tick():
            nonlocal now
            now += 61  # past the sensor's minimum interval
            with freeze_time(now):
                list(execute_sensor_iteration(workspace, logging.getLogger("test"), None, None))

        bucket.event("ObjectCreated:Put", "cam_a/lot_0/1.jpg", "cam_b/lot_0/1.jpg", "cam_b/annotations.json")
        tick()
        assert sorted(instance.get_dynamic_partitions("raw_sources")) == ["cam_a", "cam_b"]
        assert sorted(run.tags[PARTITION_NAME_TAG] for run in instance.get_runs()) == ["cam_a", "cam_b"]

        bucket.event("ObjectCreated:Put", "new_plant/lot_0/1.jpg")
        tick()
        runs = instance.get_runs()
        assert sorted(run.tags[PARTITION_NAME_TAG] for run in runs) == ["cam_a", "cam_b", "new_plant"], (
            "one run for the new source only"
        )
        assert runs[0].asset_selection == {AssetKey("raw_image_index")}
        observed = instance.fetch_observations(AssetKey("raw_data"), limit=10).records
        assert sorted(r.asset_observation.partition for r in observed) == ["cam_a", "cam_b", "new_plant"]

        tick()  # a tick after a committed one deletes that one's messages
        assert sum(queue_counts(queue)) == 0
        assert len(instance.get_runs()) == 3
