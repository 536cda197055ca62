"""`sensor_tick`: one tick of the raw-data sensor with a 1,000,000-key lake over the same tick with a
10,000-key lake, the same 100 new objects arriving on the queue (goal <= 1.5).

The real sensor and definitions on a real Dagster instance, events from moto's SQS server on loopback;
also prints seconds per tick, per event, per changed source and per inventory key.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import logging
import os
import tempfile
import time
from pathlib import Path
from unittest import mock

from dagster import DagsterRun, RunsFilter, build_sensor_context, instance_for_test
from dagster._core.storage.tags import PARTITION_NAME_TAG, RUN_KEY_TAG, SENSOR_NAME_TAG
from moto.server import ThreadedMotoServer

from tests.helpers.local_s3 import LocalS3Server
from training_code.lib.aws_clients import client
from zero_assets.core.settings import ZeroSettings
from zero_assets.defs import sensors
from zero_assets.defs.change_detection.inventory_diff import detect_from_inventory
from zero_assets.defs.partitions import RAW_SOURCES

from .report import BenchResult

KEYS_PER_SOURCE = 100
SMALL_SOURCES, BIG_SOURCES = 100, 10_000
RUNS = 5
RAW = "s3://zero-bench-raw/raw"


def _inventory(s3, name: str, sources: int) -> str:
    """An S3 Inventory report (CSV, gzip, 10 data files) of `sources` x KEYS_PER_SOURCE keys; its manifest URI."""
    files, per_file = [], max(1, sources // 10)
    for part, start in enumerate(range(0, sources, per_file)):
        text = io.StringIO()
        writer = csv.writer(text)
        for source in range(start, min(sources, start + per_file)):
            writer.writerows(
                (
                    "zero-bench-raw",
                    f"raw/src_{source:05d}/lot_{k // 10}/img_{k:03d}.jpg",
                    50_000 + k,
                    f"{source:05d}{k:03d}",
                )
                for k in range(KEYS_PER_SOURCE)
            )
            writer.writerow(("zero-bench-raw", f"raw/src_{source:05d}/annotations.json", 1000, f"a{source}"))
        key = f"{name}/data/part-{part}.csv.gz"
        s3.put_object(
            Bucket="zero-bench-inventory", Key=key, Body=gzip.compress(text.getvalue().encode(), compresslevel=1)
        )
        files.append({"key": key, "size": 0, "MD5checksum": ""})
    manifest = {
        "sourceBucket": "zero-bench-raw",
        "destinationBucket": "arn:aws:s3:::zero-bench-inventory",
        "fileFormat": "CSV",
        "fileSchema": "Bucket, Key, Size, ETag",
        "creationTimestamp": "1764550800000",
        "files": files,
    }
    s3.put_object(Bucket="zero-bench-inventory", Key=f"{name}/manifest.json", Body=json.dumps(manifest).encode())
    return f"s3://zero-bench-inventory/{name}/manifest.json"


class Lake:
    """One lake: its instance (registered sources), queue, inventory report and sensor cursor."""

    def __init__(self, instance, sqs, queue_url: str, sources: int, inventory_uri: str) -> None:
        self.instance, self.sqs, self.queue_url, self.sources = instance, sqs, queue_url, sources
        self.settings = ZeroSettings(
            raw_uri=RAW, raw_events_queue_url=queue_url, raw_inventory_manifest_uri=inventory_uri
        )
        self.cursor, self.ticks = None, 0
        instance.add_dynamic_partitions(RAW_SOURCES.name, [f"src_{s:05d}" for s in range(sources)])

    def arrive(self, objects: int, changed_sources: int) -> None:
        """`objects` new images in `changed_sources` sources (the last one new), queued as S3 events."""
        self.ticks += 1
        names = [f"src_{s * (self.sources // changed_sources):05d}" for s in range(changed_sources - 1)] + [
            f"new_{self.ticks:04d}"
        ]
        bodies = []
        for i in range(objects):
            key = f"raw/{names[i % len(names)]}/lot_new/t{self.ticks:04d}_{i:04d}.jpg"
            record = {
                "eventName": "ObjectCreated:Put",
                "s3": {
                    "bucket": {"name": "zero-bench-raw"},
                    "object": {"key": key, "size": 50_000, "eTag": f"e{i}", "sequencer": f"{self.ticks:08X}{i:08X}"},
                },
            }
            bodies.append(json.dumps({"Records": [record]}))
        for start in range(0, len(bodies), 10):
            self.sqs.send_message_batch(
                QueueUrl=self.queue_url,
                Entries=[{"Id": str(j), "MessageBody": b} for j, b in enumerate(bodies[start : start + 10])],
            )

    def tick(self, definitions) -> int:
        """One daemon tick; returns the runs it launched."""
        context = build_sensor_context(
            cursor=self.cursor,
            instance=self.instance,
            instance_ref=self.instance.get_ref(),
            resources={"settings": self.settings},
            definitions=definitions,
        )
        result = sensors.new_raw_data_sensor.evaluate_tick(context)
        for event in result.asset_events:
            self.instance.report_runless_asset_event(event)
        for request in result.dynamic_partitions_requests or []:
            missing = [
                k
                for k in request.partition_keys
                if not self.instance.has_dynamic_partition(request.partitions_def_name, k)
            ]
            self.instance.add_dynamic_partitions(request.partitions_def_name, missing)
        launched = 0
        for request in result.run_requests or []:
            tags = {RUN_KEY_TAG: request.run_key, SENSOR_NAME_TAG: sensors.new_raw_data_sensor.name}
            if not self.instance.get_runs(RunsFilter(tags=tags), limit=1):
                self.instance.add_run(
                    DagsterRun(
                        job_name="__anonymous_asset_job_new_raw_data_sensor",
                        tags={**request.tags, **tags, PARTITION_NAME_TAG: request.partition_key},
                    )
                )
                launched += 1
        self.cursor = result.cursor
        return launched


def _timed_tick(lake: Lake, definitions, objects: int = 100, changed_sources: int = 10) -> float:
    lake.arrive(objects, changed_sources)
    started = time.perf_counter()
    launched = lake.tick(definitions)
    elapsed = time.perf_counter() - started
    if launched != changed_sources:
        raise AssertionError(f"a tick with {changed_sources} changed sources launched {launched} runs")
    return elapsed


def run() -> list[BenchResult]:
    from zero_assets.definitions import defs

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request log: one line a call
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    try:
        with (
            tempfile.TemporaryDirectory(prefix="zero-bench-sensor-") as tmp,
            LocalS3Server(Path(tmp) / "s3") as server,
            mock.patch.dict(
                os.environ, {**server.env(), "ZERO_SQS_ENDPOINT_URL": "http://{}:{}".format(*moto.get_host_and_port())}
            ),
            mock.patch.object(sensors, "QUEUE_WAIT_S", 1.0),
            instance_for_test() as small_instance,
            instance_for_test() as big_instance,
        ):
            s3 = server.client()
            s3.create_bucket(Bucket="zero-bench-inventory")
            sqs = client("sqs", endpoint_url=os.environ["ZERO_SQS_ENDPOINT_URL"])
            small_inventory, big_inventory = _inventory(s3, "small", SMALL_SOURCES), _inventory(s3, "big", BIG_SOURCES)
            small = Lake(
                small_instance, sqs, sqs.create_queue(QueueName="small")["QueueUrl"], SMALL_SOURCES, small_inventory
            )
            big = Lake(big_instance, sqs, sqs.create_queue(QueueName="big")["QueueUrl"], BIG_SOURCES, big_inventory)
            for lake in (small, big):  # warm: the first tick creates the client and leaves receipts and a cursor
                _timed_tick(lake, defs)
            small_s = big_s = float("inf")
            for _ in range(RUNS):
                small_s = min(small_s, _timed_tick(small, defs))
                big_s = min(big_s, _timed_tick(big, defs))
            many_sources_s = min(_timed_tick(big, defs, objects=100, changed_sources=100) for _ in range(3))

            inventory_s = {}
            for name, uri, sources, lake in (
                ("small", small_inventory, SMALL_SOURCES, small),
                ("big", big_inventory, BIG_SOURCES, big),
            ):
                started = time.perf_counter()
                found = detect_from_inventory(uri, RAW, None, lake.instance.run_storage)
                inventory_s[name] = time.perf_counter() - started
                if len(found.changed) != sources:
                    raise AssertionError(
                        f"the {name} report's diff found {len(found.changed)} sources, expected {sources}"
                    )
    finally:
        moto.stop()
    per_event_s = big_s / 100  # an upper bound: the tick's fixed costs are counted in
    per_source_s = (many_sources_s - big_s) / 90
    big_keys = BIG_SOURCES * (KEYS_PER_SOURCE + 1)
    return [
        BenchResult(
            "sensor_tick",
            big_s / small_s,
            "<=1.5",
            {
                "small_lake_keys": SMALL_SOURCES * (KEYS_PER_SOURCE + 1),
                "big_lake_keys": big_keys,
                "small_tick_s": small_s,
                "big_tick_s": big_s,
                "tick_100_sources_s": many_sources_s,
                "per_event_s": per_event_s,
                "per_changed_source_s": per_source_s,
                "inventory_diff_s": inventory_s["big"],
                "inventory_s_per_key": inventory_s["big"] / big_keys,
            },
        )
    ]
