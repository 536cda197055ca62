"""`sagemaker_refresh_bytes`: the bytes the rendered SageMaker requests of a 1% refresh ask to download,
against the source's bytes (goal: at most 5%).

A 1,000-photo source on the loopback S3 server goes through the real graph, then 1% new photos arrive;
the refresh's requests are what `render-jobs --from-instance` renders for it.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

from dagster import instance_for_test, materialize

from tests.helpers.local_s3 import LocalS3Server
from training_code.lib.read_list import ReadList
from zero_assets.backends.local.runner import LocalJobRunner
from zero_assets.backends.sagemaker.settings import sagemaker_settings_from_env
from zero_assets.core.settings import ZeroSettings
from zero_assets.defs.assets import PER_SOURCE_ASSETS, SOURCE_SPECS, arrow_shards, training_set
from zero_assets.defs.partitions import RAW_SOURCES
from zero_assets.ops.job_plan import instance_lookup, render_jobs

from .images import photo_jpeg, unique_copy
from .report import BenchResult

IMAGES, ADDED_FRACTION, SOURCE, BUCKET = 1000, 0.01, "cam", "zero-bench-refresh"
AWS_ENV = {
    "ZERO_SM_REGION": "us-east-1",
    "ZERO_SM_ROLE_ARN": "arn:aws:iam::123456789012:role/zero-jobs",
    "ZERO_SM_BUCKET": BUCKET,
    "ZERO_SM_TRAINING_IMAGE_URI": "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.5-gpu-py311",
    "ZERO_SM_PROCESSING_IMAGE_URI": "123456789012.dkr.ecr.us-east-1.amazonaws.com/zero-processing:1",
}
PACK = {"ops": {"arrow_shards": {"config": {"target_shard_bytes": 10_000_000}}}}


def _put_source(client, base: bytes, count: int) -> int:
    """`count` distinct photos under the source and an annotations.json naming all of them; their bytes."""
    total, document = 0, {"images": [], "annotations": [], "categories": [{"id": 1, "name": "part"}]}
    for n in range(count):
        name = f"lot_{n // 100:03d}/img_{n:05d}.jpg"
        data = unique_copy(base, f"photo {n}")
        client.put_object(Bucket=BUCKET, Key=f"zero/raw/{SOURCE}/{name}", Body=data)
        total += len(data)
        document["images"].append({"id": n + 1, "file_name": name, "width": 632, "height": 474})
        document["annotations"].append({"id": n + 1, "image_id": n + 1, "category_id": 1, "bbox": [20, 20, 90, 60]})
    annotations = json.dumps(document).encode()
    client.put_object(Bucket=BUCKET, Key=f"zero/raw/{SOURCE}/annotations.json", Body=annotations)
    return total + len(annotations)


def _materialize(instance, resources, assets, partition: str | None = None, run_config=None) -> None:
    if partition:
        instance.add_dynamic_partitions(RAW_SOURCES.name, [partition])
    result = materialize(
        [*SOURCE_SPECS, *PER_SOURCE_ASSETS, training_set, arrow_shards],
        selection=assets,
        partition_key=partition,
        resources=resources,
        instance=instance,
        run_config=run_config or {},
    )
    if not result.success:
        raise RuntimeError(f"materializing {[a.key.to_user_string() for a in assets]} failed")


def _asked(client, rendered, label: str, read_lists: dict[str, ReadList]) -> tuple[int, int]:
    """(bytes the requests of `label` ask to download, instances of its largest stage)."""
    total, instances = 0, 0
    for asset, _, operation, params in rendered:
        if asset.split("-")[0] != label or operation != "CreateProcessingJob":
            continue
        instances = max(instances, params["ProcessingResources"]["ClusterConfig"]["InstanceCount"])
        for item in params["ProcessingInputs"]:
            if item["InputName"] == "code":
                continue
            bucket, _, prefix = item["S3Input"]["S3Uri"][len("s3://") :].partition("/")
            pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            total += sum(o["Size"] for page in pages for o in page.get("Contents", []))
        total += _previous_read(client, params["AppSpecification"].get("ContainerArguments", []))
    return total + read_lists[label].read_bytes, instances


# What each job reads by key of its previous output (`--previous`, read where it is, not an input).
PREVIOUS_FILES = ("manifest.json", "verdicts.parquet", "rows.parquet", "masked.parquet")


def _previous_read(client, arguments: list[str]) -> int:
    """The bytes a job reads of its previous output: validation its manifest and verdicts, packing its
    manifest, rows and masks (those of PREVIOUS_FILES the folder holds)."""
    if "--previous" not in arguments:
        return 0
    bucket, _, prefix = arguments[arguments.index("--previous") + 1][len("s3://") :].partition("/")
    listed = client.list_objects_v2(Bucket=bucket, Prefix=f"{prefix.rstrip('/')}/", Delimiter="/")
    return sum(o["Size"] for o in listed.get("Contents", []) if o["Key"].rsplit("/", 1)[-1] in PREVIOUS_FILES)


def run() -> list[BenchResult]:
    base = photo_jpeg(seed=7, megapixels=0.3)
    with tempfile.TemporaryDirectory(prefix="bench-sm-refresh-") as tmp, LocalS3Server(Path(tmp) / "s3") as s3:
        saved = {key: os.environ.get(key) for key in s3.env()}
        os.environ.update(s3.env())
        try:
            client = s3.client()
            client.create_bucket(Bucket=BUCKET)
            source_bytes = _put_source(client, base, IMAGES)
            settings = ZeroSettings(raw_uri=f"s3://{BUCKET}/zero/raw", lake_uri=f"s3://{BUCKET}/zero/lake")
            resources = {"settings": settings, "jobs": LocalJobRunner(settings=settings)}
            aws = sagemaker_settings_from_env(AWS_ENV)
            (Path(tmp) / "dagster").mkdir()
            with instance_for_test(temp_dir=str(Path(tmp) / "dagster")) as instance:
                started = time.perf_counter()
                _materialize(instance, resources, PER_SOURCE_ASSETS, SOURCE)
                _materialize(instance, resources, [training_set, arrow_shards], run_config=PACK)
                first_s = time.perf_counter() - started

                added = int(IMAGES * ADDED_FRACTION)
                source_bytes = _put_source(client, base, IMAGES + added)  # the earlier photos' bytes as they were
                lists: dict[str, ReadList] = {}
                _materialize(instance, resources, [PER_SOURCE_ASSETS[0]], SOURCE)  # the refresh's index
                rendered = render_jobs(settings, aws, instance_lookup(instance), SOURCE, PACK, read_lists=lists)
                validation, validation_instances = _asked(client, rendered, "validated_images", lists)
                validation_objects = lists["validated_images"].objects
                annotations = client.head_object(Bucket=BUCKET, Key=f"zero/raw/{SOURCE}/annotations.json")
                validation += annotations["ContentLength"]  # the job fetches it by key too
                _materialize(instance, resources, [PER_SOURCE_ASSETS[1]], SOURCE)
                _materialize(instance, resources, [training_set])  # the refresh's selection
                rendered = render_jobs(settings, aws, instance_lookup(instance), SOURCE, PACK, read_lists=lists)
                packing, packing_instances = _asked(client, rendered, "arrow_shards", lists)
                packing_objects = lists["arrow_shards"].objects
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
    if (validation_objects, packing_objects) != (added, added):
        raise AssertionError(
            f"the refresh's read lists name {validation_objects} images to decode and {packing_objects} to pack; "
            f"{added} are new"
        )
    asked = validation + packing
    return [
        BenchResult(
            "sagemaker_refresh_bytes",
            asked / source_bytes,
            "<=0.05",
            {
                "asked_bytes": asked,
                "validation_bytes": validation,
                "packing_bytes": packing,
                "source_bytes": source_bytes,
                "whole_source_bytes": 2 * source_bytes,
                "images": IMAGES,
                "added": added,
                "validation_instances": validation_instances,
                "packing_instances": packing_instances,
                "first_run_s": first_s,
            },
        )
    ]
