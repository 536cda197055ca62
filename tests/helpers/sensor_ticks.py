"""Ticking the raw-data sensor in tests as Dagster's daemon does, and the S3 events it reads.

`SensorDaemon.tick` evaluates the real sensor against a real instance, then applies the result the
way the daemon does: observations recorded, new partitions added, and a run added for each request
whose run key this sensor has not used yet (Dagster's idempotence rule). The definitions hold the
real sensor beside stand-ins for `raw_data` and `raw_image_index` with the real partitions, so these
tests target the asset keys without materializing anything.
"""

from __future__ import annotations

import json
from urllib.parse import quote_plus

from dagster import AssetKey, AssetSpec, DagsterRun, Definitions, RunsFilter, asset, build_sensor_context
from dagster._core.storage.tags import PARTITION_NAME_TAG, RUN_KEY_TAG, SENSOR_NAME_TAG

from zero_assets.defs.partitions import RAW_SOURCES
from zero_assets.defs.sensors import new_raw_data_sensor


@asset(name="raw_image_index", partitions_def=RAW_SOURCES, deps=["raw_data"])
def raw_image_index_stand_in() -> None:
    raise AssertionError("sensor tests request runs; they never materialize")


def sensor_definitions(settings) -> Definitions:
    return Definitions(
        assets=[AssetSpec("raw_data", partitions_def=RAW_SOURCES), raw_image_index_stand_in],
        sensors=[new_raw_data_sensor],
        resources={"settings": settings},
    )


class SensorDaemon:
    def __init__(self, instance, settings):
        self.instance, self.settings, self.cursor = instance, settings, None

    def tick(self, cursor: str | None = None, *, keep_cursor: bool = True):
        """One tick from the kept cursor (or `cursor`); returns the result and the run requests launched."""
        context = build_sensor_context(
            cursor=self.cursor if cursor is None else cursor,
            instance=self.instance,
            instance_ref=self.instance.get_ref(),
            resources={"settings": self.settings},
            definitions=sensor_definitions(self.settings),
        )
        result = new_raw_data_sensor.evaluate_tick(context)
        for event in result.asset_events:
            self.instance.report_runless_asset_event(event)
        for request in result.dynamic_partitions_requests or []:
            self.instance.add_dynamic_partitions(
                request.partitions_def_name,
                [
                    key
                    for key in request.partition_keys
                    if not self.instance.has_dynamic_partition(request.partitions_def_name, key)
                ],
            )
        launched = []
        for request in result.run_requests or []:
            tags = {RUN_KEY_TAG: request.run_key, SENSOR_NAME_TAG: new_raw_data_sensor.name}
            if self.instance.get_runs(RunsFilter(tags=tags)):
                continue
            self.instance.add_run(
                DagsterRun(
                    job_name="__anonymous_asset_job_new_raw_data_sensor",
                    tags={**request.tags, **tags, PARTITION_NAME_TAG: request.partition_key},
                )
            )
            launched.append(request)
        if keep_cursor:
            self.cursor = result.cursor
        return result, launched

    def sources(self) -> list[str]:
        return sorted(self.instance.get_dynamic_partitions(RAW_SOURCES.name))

    def raw_data_version(self, source: str) -> str | None:
        record = self.instance.fetch_observations(AssetKey("raw_data"), limit=100).records
        versions = [
            r.asset_observation.tags.get("dagster/data_version")
            for r in record
            if r.asset_observation.partition == source
        ]
        return versions[0] if versions else None


def s3_record(event: str, bucket: str, key: str, *, size: int = 100, etag: str = "e0", sequencer: str = "0A") -> dict:
    """One record as S3 writes it: the key URL-encoded with '+' for a space."""
    return {
        "eventVersion": "2.1",
        "eventSource": "aws:s3",
        "awsRegion": "us-east-1",
        "eventName": event,
        "s3": {
            "s3SchemaVersion": "1.0",
            "bucket": {"name": bucket, "arn": f"arn:aws:s3:::{bucket}"},
            "object": {"key": quote_plus(key, safe="/"), "size": size, "eTag": etag, "sequencer": sequencer},
        },
    }


def s3_message(*records: dict, sns: bool = False) -> str:
    body = json.dumps({"Records": list(records)})
    return (
        json.dumps({"Type": "Notification", "TopicArn": "arn:aws:sns:us-east-1:123456789012:raw", "Message": body})
        if sns
        else body
    )
