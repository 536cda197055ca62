"""SageMaker I/O in proportion to the change (issue 20, done-when 2): the requests of a 1% refresh name only
the new images as inputs, fan out when the work is large, and size their volumes from the bytes.

The code location's resources on the SageMaker backend run the real job scripts under the fake (each
Create*Job validated against botocore's model), on a moto S3 raw root and lake. The sizing rules are
checked on their own too: the instance count from the work, each volume from its busiest host's bytes,
and a job that cannot fit refused before launch, naming the setting.
"""

from __future__ import annotations

import io
import json
import math
import os
from dataclasses import replace

import numpy as np
import pytest
from helpers.graph_runs import materialize_source, materialize_tail
from helpers.sagemaker_fakes import FakeSageMaker, aws_env
from PIL import Image

from training_code.lib.aws_clients import client as aws_client
from training_code.lib.read_list import read_read_list
from zero_assets.backends.from_env import resources_from_env
from zero_assets.backends.sagemaker import runner as sagemaker_runner
from zero_assets.backends.sagemaker.code_package import build_code_package
from zero_assets.backends.sagemaker.job_params import build_job_params
from zero_assets.backends.sagemaker.runner import AwsClients
from zero_assets.backends.sagemaker.settings import DEFAULT_COMPUTE, JobCompute, sagemaker_settings_from_env
from zero_assets.backends.sagemaker.work_sizing import GIB, instances_for, request_instance_type, request_volume_gb
from zero_assets.core.job_request import JobRequest, Reads, TableScan, Work
from zero_assets.core.settings import REPO_ROOT
from zero_assets.defs.assets import arrow_shards, raw_image_index, training_set, validated_images

SOURCE = "cam"
BUCKET = "zero-refresh-io"
IMAGES = 200  # a refresh adds 1% of them
SM_ENV = {
    "ZERO_BACKEND": "sagemaker",
    "ZERO_SM_REGION": "us-east-1",
    "ZERO_SM_ROLE_ARN": "arn:aws:iam::123456789012:role/zero-jobs",
    "ZERO_SM_BUCKET": BUCKET,
    "ZERO_SM_TRAINING_IMAGE_URI": "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.5-gpu-py311",
    "ZERO_SM_PROCESSING_IMAGE_URI": "123456789012.dkr.ecr.us-east-1.amazonaws.com/zero-processing:1",
    "ZERO_SM_POLL_INTERVAL_S": "0.3",
    # 100 images (3 MB to pack) an instance: the first run (200 images, ~4.7 MB) fans out over two, the
    # refresh (2 images) runs on one.
    "ZERO_SM_VALIDATED_IMAGES_IMAGES_PER_INSTANCE": "100",
    "ZERO_SM_ARROW_SHARDS_BYTES_PER_INSTANCE": "3000000",
    "ZERO_REHEARSAL_GATE": "off",
}


def jpeg(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (160, 160, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def put_source(s3, names: list[str]) -> dict[str, bytes]:
    """The source's images and its annotations.json (one box an image) under `raw/`; returns the images."""
    images = {name: jpeg(n) for n, name in enumerate(names)}
    document = {"images": [], "annotations": [], "categories": [{"id": 1, "name": "part"}]}
    for n, name in enumerate(names, start=1):
        document["images"].append({"id": n, "file_name": name, "width": 160, "height": 160})
        document["annotations"].append({"id": n, "image_id": n, "category_id": 1, "bbox": [10, 10, 40, 40]})
    for name, data in images.items():
        s3.put_object(Bucket=BUCKET, Key=f"zero/raw/{SOURCE}/{name}", Body=data)
    s3.put_object(Bucket=BUCKET, Key=f"zero/raw/{SOURCE}/annotations.json", Body=json.dumps(document).encode())
    return images


def new_jobs(fake: FakeSageMaker, before: set[str]) -> dict[str, dict]:
    return {name: job["params"] for name, job in fake.jobs.items() if name not in before}


def download_bytes(s3, params: dict) -> int:
    """What a Processing request asks SageMaker to download (every object under each S3Prefix input but
    the code package), plus what its read list names, which the job fetches by key."""
    total = 0
    for item in params["ProcessingInputs"]:
        if item["InputName"] == "code":
            continue
        bucket, _, prefix = item["S3Input"]["S3Uri"][len("s3://") :].partition("/")
        listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
        total += sum(o["Size"] for o in listed)
        if item["InputName"] == "reads":
            total += read_read_list(item["S3Input"]["S3Uri"]).read_bytes
    return total


def test_a_one_percent_refresh_reads_only_the_new_images_on_sagemaker(moto_endpoint, instance, tmp_path, monkeypatch):
    """Validation, then the selection and the pack, twice: everything, then a refresh of 1% new images."""
    for key in [k for k in os.environ if k.startswith("ZERO_")]:
        monkeypatch.delenv(key)
    aws = aws_env(moto_endpoint)
    for key, value in {**aws, **SM_ENV, "DAGSTER_HOME": instance.root_directory}.items():
        monkeypatch.setenv(key, value)
    s3, logs = aws_client("s3", endpoint_url=moto_endpoint), aws_client("logs", endpoint_url=moto_endpoint)
    s3.create_bucket(Bucket=BUCKET)
    images = put_source(s3, [f"lot_{n % 4}/img_{n:04d}.jpg" for n in range(IMAGES)])
    fake = FakeSageMaker(tmp_path / "sm", s3, logs, {**aws, "PYTHONPATH": str(REPO_ROOT), "ZERO_PIPES_FLUSH_S": "0.2"})
    monkeypatch.setattr(sagemaker_runner, "make_aws_clients", lambda region: AwsClients(fake, logs, s3, None))
    resources = resources_from_env()
    assets = [raw_image_index, validated_images]

    assert materialize_source(SOURCE, instance=instance, resources=resources, assets=assets).success
    pack = {"ops": {"arrow_shards": {"config": {"target_shard_bytes": 500_000}}}}  # shards of ~20 images
    assert materialize_tail(
        instance=instance, resources=resources, assets=[training_set, arrow_shards], run_config=pack
    ).success
    first = new_jobs(fake, set())
    for asset in ("validated-images", "arrow-shards"):  # both passes spread over two instances
        mapped = next(params for name, params in first.items() if name.startswith(f"zero-{asset}-map-"))
        assert mapped["ProcessingResources"]["ClusterConfig"]["InstanceCount"] == 2, asset
        assert read_read_list(input_uri(mapped, "reads")).objects == IMAGES, asset

    added = put_source(s3, [*images, "lot_9/new_a.jpg", "lot_9/new_b.jpg"])  # 1% new, the rest as it was
    new = {f"{SOURCE}/{name}": data for name, data in added.items() if name not in images}
    result = materialize_source(SOURCE, instance=instance, resources=resources, assets=assets)
    tail = materialize_tail(
        instance=instance, resources=resources, assets=[training_set, arrow_shards], run_config=pack
    )
    refresh = new_jobs(fake, set(first))
    assert len(refresh) == 3 and all("-map-" not in name for name in refresh), "2 images: one instance each"
    params = next(p for name, p in refresh.items() if name.startswith("zero-validated-images-"))  # botocore-valid
    inputs = {item["InputName"]: item["S3Input"] for item in params["ProcessingInputs"]}
    assert set(inputs) == {"code", "index", "reads"}, "no raw prefix among the inputs, nor the previous output"
    assert all("/zero/raw" not in item["S3Uri"] for item in inputs.values())
    # The previous output is read where it is, its manifest and verdicts only (never its other tables or
    # its contact sheet, which SageMaker would download whole as an input).
    arguments = params["AppSpecification"]["ContainerArguments"]
    previous = arguments[arguments.index("--previous") + 1]
    assert previous.startswith(f"s3://{BUCKET}/zero/lake/validated_images/{SOURCE}/"), previous
    previous_prefix = previous[len(f"s3://{BUCKET}/") :].rstrip("/")
    previous_read = sum(
        s3.head_object(Bucket=BUCKET, Key=f"{previous_prefix}/{name}")["ContentLength"]
        for name in ("manifest.json", "verdicts.parquet")
    )
    reads = read_read_list(inputs["reads"]["S3Uri"])
    assert reads.keys() == sorted(new) and reads.raw_uri == f"s3://{BUCKET}/zero/raw"
    assert reads.read_bytes == sum(map(len, new.values()))
    # The volume: the configured base plus the bytes it fetches, rounded up to a GiB.
    assert params["ProcessingResources"]["ClusterConfig"]["VolumeSizeInGB"] == 30 + 1
    event = result.asset_materializations_for_node("validated_images")[0]
    metadata = {key: value.value for key, value in event.metadata.items()}
    assert (metadata["decoded"], metadata["reused"]) == (2, IMAGES)
    # What it fetched by key: the images its list names, and the annotations.json it takes the labels from.
    annotations = s3.head_object(Bucket=BUCKET, Key=f"zero/raw/{SOURCE}/annotations.json")["ContentLength"]
    assert (metadata["fetched_objects"], metadata["fetched_bytes"]) == (3, reads.read_bytes + annotations)
    source_bytes = sum(map(len, added.values())) + annotations
    asked = download_bytes(s3, params) + annotations + previous_read

    # The pack of the refresh: handed the selection and its read list (the two new rows; the earlier shard
    # set is read where it is, never downloaded), it fetches exactly those and packs them into a new shard.
    packing = next(p for name, p in refresh.items() if name.startswith("zero-arrow-shards-"))
    inputs = {item["InputName"]: item["S3Input"] for item in packing["ProcessingInputs"]}
    assert set(inputs) == {"code", "selection", "reads"}
    assert read_read_list(inputs["reads"]["S3Uri"]).keys() == sorted(new)
    assert packing["ProcessingResources"]["ClusterConfig"]["VolumeSizeInGB"] == 30 + 1  # twice 47 KB, rounded up
    packed = {
        key: value.value for key, value in tail.asset_materializations_for_node("arrow_shards")[0].metadata.items()
    }
    assert (packed["rows_packed"], packed["fetched_objects"]) == (2, 2) and packed["shards_kept"] >= 1
    asked += download_bytes(s3, packing)

    # The selection: handed its plan (the validated set by reference), on the smallest memory-optimised
    # instance for its rows. It reads that set's tables by key: every row of the source, and no image.
    selecting = next(p for name, p in refresh.items() if name.startswith("zero-training-set-"))
    assert {item["InputName"] for item in selecting["ProcessingInputs"]} == {"code", "plan"}
    assert selecting["ProcessingResources"]["ClusterConfig"]["InstanceType"] == "ml.r5.large"
    assert asked <= 0.05 * source_bytes, (asked, source_bytes)
    validated = metadata["dagster/uri"][len(f"s3://{BUCKET}/") :]
    tables = ("accepted.parquet", "verdicts.parquet", "categories.json", "manifest.json")
    table_bytes = sum(s3.head_object(Bucket=BUCKET, Key=f"{validated}/{name}")["ContentLength"] for name in tables)
    assert download_bytes(s3, selecting) < 64 * 1024 and table_bytes < 0.1 * source_bytes, (table_bytes, source_bytes)


def input_uri(params: dict, name: str) -> str:
    return next(i["S3Input"]["S3Uri"] for i in params["ProcessingInputs"] if i["InputName"] == name)


def work(objects: int, bytes_each: int) -> Work:
    return Work(objects, objects * bytes_each, lambda hosts: math.ceil(objects / hosts) * bytes_each)


def test_the_instance_count_comes_from_the_work_within_its_bounds():
    compute = JobCompute(instance_type="ml.c5.4xlarge", volume_size_gb=30, images_per_instance=250_000)
    assert instances_for("validated_images", compute, work(10_000, 200_000)) == 1  # a refresh
    assert instances_for("validated_images", compute, work(1_000_000, 200_000)) == 4  # a million-image source
    assert instances_for("validated_images", compute, work(40_000_000, 20_000)) == 16  # at the cap
    rehearsal = compute.model_copy(update={"instance_count": 2})
    assert instances_for("validated_images", rehearsal, work(3, 1000)) == 2, "at least instance_count"
    assert instances_for("validated_images", compute.model_copy(update={"max_instance_count": 1}), work(10**6, 1)) == 1
    # Bytes per instance, where set, count too: the busier measure wins.
    packing = JobCompute(instance_type="ml.c5.4xlarge", volume_size_gb=30, bytes_per_instance=100 * GIB)
    assert instances_for("arrow_shards", packing, work(1000, GIB)) == 10
    # A source whose busiest host cannot fit even on the most instances allowed: refused, naming the setting.
    with pytest.raises(
        ValueError,
        match="ZERO_SM_VALIDATED_IMAGES_MAX_INSTANCE_COUNT=16.*raise ZERO_SM_VALIDATED_IMAGES_MAX_INSTANCE_COUNT",
    ):
        instances_for("validated_images", compute, work(1_000_000, 300 * 1024**2))  # 286 TiB
    # A volume too small to read anything onto: bigger instances would not help either.
    lots = compute.model_copy(update={"images_per_instance": 1, "max_instance_count": 100})
    assert instances_for("validated_images", lots, work(64, 400 * GIB)) == 64  # 400 GiB each fits one volume
    with pytest.raises(ValueError, match="more than SageMaker's largest volume"):
        instances_for("validated_images", lots, work(1, 20_000 * GIB))


def test_each_volume_is_sized_from_the_bytes_its_busiest_host_reads():
    aws = sagemaker_settings_from_env(
        {key: value for key, value in SM_ENV.items() if key != "ZERO_SM_VALIDATED_IMAGES_IMAGES_PER_INSTANCE"}
    )
    request = JobRequest(
        asset="validated_images",
        kind="processing",
        module="training_code.validate",
        fingerprint="ab" * 32,
        inputs={"index": f"s3://{BUCKET}/zero/lake/raw_image_index/cam/x", "reads": f"s3://{BUCKET}/zero/reads/x"},
        outputs={"out": f"s3://{BUCKET}/zero/lake/validated_images/cam/abababababababab"},
        reads=Reads(f"s3://{BUCKET}/zero/reads/x", f"s3://{BUCKET}/zero/raw", 1_000_000, 600 * GIB, 600 * GIB),
    )
    _, params = build_job_params(
        request, aws, job_name="zero-validated-images-a1", code=build_code_package(), environment={}
    )
    assert params["ProcessingResources"]["ClusterConfig"]["VolumeSizeInGB"] == 30 + 600, "a 600 GiB source fits"
    _, small = build_job_params(
        JobRequest(**{**vars(request), "reads": request.reads.on(GIB // 2)}),
        aws,
        job_name="zero-validated-images-a1",
        code=build_code_package(),
        environment={},
    )
    assert small["ProcessingResources"]["ClusterConfig"]["VolumeSizeInGB"] == 31


def test_the_selection_instance_is_sized_from_the_rows_it_reads():
    compute = DEFAULT_COMPUTE["training_set"]  # ml.r5.large and up, 100 bytes of memory a row
    request = JobRequest("training_set", "processing", "training_code.selection", "0" * 64)

    def sized(rows: int, table_bytes: int = 0) -> tuple[str, int]:
        scanned = replace(request, scan=TableScan(rows, table_bytes))
        return request_instance_type(scanned, compute), request_volume_gb(scanned, compute)

    assert sized(4_000_000) == ("ml.r5.large", 30)  # 0.4 GB of rows: the smallest
    assert sized(1_000_000_000, 200 * GIB) == ("ml.r5.4xlarge", 30 + 600)  # 100 GB: 128 GiB; its tables thrice
    assert sized(20_000_000_000)[0] == "ml.r5.24xlarge", "the largest, spilling past its memory"
    larger = compute.model_copy(update={"instance_type": "ml.r5.2xlarge"})
    assert request_instance_type(replace(request, scan=TableScan(10, 0)), larger) == "ml.r5.2xlarge", "never smaller"
    assert request_instance_type(request, compute) == "ml.r5.large", "a job that reads no tables whole: as set"
