"""A new source arriving through S3 events is indexed, validated and sharded as a partition of its own.

Real parts end to end: the raw objects on the local S3-compatible server, S3 Event Notifications on a
real SQS-compatible queue (moto), the real sensor ticked as the daemon ticks it, each requested run
executed as the daemon would launch it, and Declarative Automation (the daemon's evaluation) deciding
what follows the index. The source already there gets no new materialization.
"""

import datetime as dt

import pytest
from dagster import AssetKey, evaluate_automation_conditions, materialize
from helpers.sensor_ticks import SensorDaemon, s3_message, s3_record
from helpers.sqs_server import sqs

from zero_assets.backends.local.runner import LocalJobRunner
from zero_assets.core.settings import ZeroSettings
from zero_assets.definitions import defs
from zero_assets.defs.assets import ALL_ASSETS, SOURCE_SPECS

BUCKET, PREFIX = "zero-raw", "plant"
PER_SOURCE = ("raw_image_index", "validated_images")  # arrow_shards packs the training set, unpartitioned
OLD, NEW = "line_a_camera", "warehouse_scanner"


def _upload_source(client, root, source) -> list[str]:
    keys = []
    for path in sorted((root / source).rglob("*")):
        if path.is_file():
            key = f"{source}/{path.relative_to(root / source).as_posix()}"
            client.upload_file(str(path), BUCKET, f"{PREFIX}/{key}")
            keys.append(key)
    return keys


def _announce(queue_url: str, keys: list[str]) -> None:
    """What S3 sends the queue for each object written (ten records a message, as S3 batches them)."""
    for start in range(0, len(keys), 10):
        records = [
            s3_record("ObjectCreated:Put", BUCKET, f"{PREFIX}/{key}", sequencer=f"{start + n:016X}")
            for n, key in enumerate(keys[start : start + 10])
        ]
        sqs().send_message(QueueUrl=queue_url, MessageBody=s3_message(*records))


class Daemon:
    """Launches what the sensor and the automation evaluation request, one run each, as the daemon does."""

    def __init__(self, instance, settings):
        self.instance, self.cursor, self.clock = instance, None, dt.datetime(2026, 12, 1, 1, tzinfo=dt.UTC)
        self.sensor = SensorDaemon(instance, settings)
        self.resources = {"settings": settings, "jobs": LocalJobRunner(settings=settings)}
        self.evaluate()  # the automation sensor's first tick, before any data: later ticks compare with it

    def evaluate(self):
        self.clock += dt.timedelta(minutes=1)
        evaluation = evaluate_automation_conditions(
            defs=defs, instance=self.instance, cursor=self.cursor, evaluation_time=self.clock
        )
        self.cursor = evaluation.cursor
        return evaluation

    def run(self, assets: list[str], partition: str) -> None:
        result = materialize(
            [*SOURCE_SPECS, *ALL_ASSETS],
            selection=assets,
            partition_key=partition,
            resources=self.resources,
            instance=self.instance,
        )
        assert result.success

    def tick(self) -> list[str]:
        """One sensor tick, then automation until it requests nothing more of the per-source assets."""
        _, launched = self.sensor.tick()
        for request in launched:
            self.run([key.to_user_string() for key in request.asset_selection], request.partition_key)
        while True:
            evaluation = self.evaluate()
            requested = {a: evaluation.get_requested_partitions(AssetKey(a)) for a in PER_SOURCE}
            if not any(requested.values()):
                return sorted(request.partition_key for request in launched)
            for partition in sorted(set().union(*requested.values())):
                self.run([a for a in PER_SOURCE if partition in requested[a]], partition)

    def materializations(self, asset: str, source: str) -> int:
        from dagster import AssetRecordsFilter

        records = self.instance.fetch_materializations(
            AssetRecordsFilter(asset_key=AssetKey(asset), asset_partitions=[source]), limit=100
        )
        return len(records.records)


@pytest.mark.slow
def test_a_new_source_on_the_queue_becomes_a_partition_and_is_materialized_alone(
    s3_env, sqs_endpoint, tiny_raw_root, instance, tmp_path, monkeypatch
):
    queue_url = sqs().create_queue(QueueName="raw-events")["QueueUrl"]
    client = s3_env.client()
    client.create_bucket(Bucket=BUCKET)
    (tmp_path / "fsx").mkdir()
    settings = ZeroSettings(
        raw_uri=f"s3://{BUCKET}/{PREFIX}",
        lake_uri=str(tmp_path / "lake"),
        fsx_mount=str(tmp_path / "fsx"),
        raw_events_queue_url=queue_url,
    )
    monkeypatch.setattr("zero_assets.defs.sensors.QUEUE_WAIT_S", 1.0)
    daemon = Daemon(instance, settings)

    _announce(queue_url, _upload_source(client, tiny_raw_root, OLD))
    assert daemon.tick() == [OLD]
    before = {a: daemon.materializations(a, OLD) for a in PER_SOURCE}
    assert before == {a: 1 for a in PER_SOURCE}, "the first source went through index and validation"

    _announce(queue_url, _upload_source(client, tiny_raw_root, NEW))
    assert daemon.tick() == [NEW], "one run, for the new source only"
    assert daemon.sensor.sources() == [OLD, NEW], "the new source is a partition"
    assert {a: daemon.materializations(a, NEW) for a in PER_SOURCE} == {a: 1 for a in PER_SOURCE}
    assert {a: daemon.materializations(a, OLD) for a in PER_SOURCE} == before, "the other source was not touched"
    assert daemon.tick() == [], "nothing new on the queue: nothing runs"
