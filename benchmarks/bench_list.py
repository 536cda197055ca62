"""`list`: indexing every source of a raw root on S3 against a bare paginated `list_objects_v2` loop over it.

Runs on the local S3-compatible server; the baseline lists with a plain `boto3.client("s3")`.
"""

from __future__ import annotations

import json
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from unittest import mock

import boto3

from tests.helpers.local_s3 import LocalS3Server
from training_code.lib.raw_index import write_source_index

from .images import best_of_interleaved
from .report import BenchResult

SOURCES, KEYS_PER_SOURCE, RUNS = 20, 1000, 5
# Sources indexed side by side, as a few concurrent partition runs are; more threads than this only
# contend for the GIL over botocore's response parsing (measured: 20 threads 0.75, 4 threads 0.82).
WORKERS = 4
BUCKET = "zero-bench-raw"


def _upload(client) -> None:
    client.create_bucket(Bucket=BUCKET)
    objects = [
        (f"raw/src_{s:02d}/lot_{k // 100:02d}/img_{k:05d}.jpg", b"x" * 64)
        for s in range(SOURCES)
        for k in range(KEYS_PER_SOURCE)
    ]
    coco = {"images": [], "annotations": [], "categories": [{"id": 1, "name": "part"}]}
    objects += [(f"raw/src_{s:02d}/annotations.json", json.dumps(coco).encode()) for s in range(SOURCES)]
    with ThreadPoolExecutor(32) as pool:
        list(pool.map(lambda item: client.put_object(Bucket=BUCKET, Key=item[0], Body=item[1]), objects))


def run() -> list[BenchResult]:
    with tempfile.TemporaryDirectory(prefix="bench-list-") as tmp, LocalS3Server(Path(tmp) / "s3") as server:
        _upload(server.client())
        plain = boto3.client(
            "s3",
            endpoint_url=server.endpoint_url,
            region_name=server.region,
            aws_access_key_id=server.access_key,
            aws_secret_access_key=server.secret_key,
        )

        def baseline() -> int:
            keys = 0
            for page in plain.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix="raw/"):
                keys += len(page.get("Contents", []))
            return keys

        def project() -> int:
            sources = [f"src_{s:02d}" for s in range(SOURCES)]
            with ThreadPoolExecutor(WORKERS) as pool:
                manifests = pool.map(
                    lambda source: write_source_index(f"s3://{BUCKET}/raw", source, Path(tmp) / "index" / source),
                    sources,
                )
                return sum(manifest["images"] for manifest in manifests)

        with mock.patch.dict(os.environ, server.env()):
            listed = project()
            if listed != SOURCES * KEYS_PER_SOURCE:
                raise AssertionError(f"the index lists {listed} images, expected {SOURCES * KEYS_PER_SOURCE}")
            baseline()
            baseline_s, project_s = best_of_interleaved(RUNS, baseline, project)
    return [
        BenchResult(
            "list",
            baseline_s / project_s,
            ">=0.8",
            {"baseline_s": baseline_s, "project_s": project_s, "keys": SOURCES * KEYS_PER_SOURCE, "sources": SOURCES},
        )
    ]
