"""The SageMaker backend's S3 data path against a real S3-compatible server (SeaweedFS on loopback):
raw root and lake on S3, the code package uploaded once, Pipes context and messages through S3.
SageMaker itself is the fake from sagemaker_fakes; CloudWatch Logs is a moto server."""

from __future__ import annotations

import pytest
from dagster import AssetKey
from graph_runs import materialize_source
from moto.server import ThreadedMotoServer

from sagemaker_fakes import FakeSageMaker
from training_code.lib.aws_clients import client as aws_client
from training_code.lib.storage import publish_folder
from zero_assets.assets import raw_image_index, validated_images
from zero_assets.local_s3 import LocalS3Server
from zero_assets.resources import SageMakerJobRunner, SageMakerSettings, ZeroSettings
from zero_assets.resources import sagemaker_runner
from zero_assets.resources.sagemaker_runner import AwsClients
from zero_assets.resources.sagemaker_settings import JobCompute
from zero_assets.resources.settings import REPO_ROOT
from zero_assets.sagemaker.code_package import MARKER, build_code_package

SOURCE = "line_a_camera"

BUCKET = "zero-ml"


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory):
    with LocalS3Server(tmp_path_factory.mktemp("seaweed")) as server:
        server.client().create_bucket(Bucket=BUCKET)
        yield server


@pytest.fixture(scope="module")
def cloudwatch():
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield aws_client("logs", endpoint_url=f"http://{host}:{port}", region="us-east-1", access_key="testing", secret_key="testing")
    server.stop()


@pytest.mark.parametrize("instances", [1, 2])
def test_validation_job_runs_on_the_s3_path(seaweed, cloudwatch, tiny_raw_root, instance, tmp_path, monkeypatch, instances):
    for key, value in seaweed.env().items():
        monkeypatch.setenv(key, value)
    publish_folder(tiny_raw_root, f"s3://{BUCKET}/raw")
    lake = f"s3://{BUCKET}/zero/lake-{instances}"  # its own lake per case: the other case's output must not be found
    settings = ZeroSettings(raw_uri=f"s3://{BUCKET}/raw", lake_uri=lake, backend="sagemaker")
    aws = SageMakerSettings(
        region="us-east-1", role_arn="arn:aws:iam::123456789012:role/zero-jobs", bucket=BUCKET,
        training_image_uri="763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.5-gpu-py311",
        processing_image_uri="123456789012.dkr.ecr.us-east-1.amazonaws.com/zero-processing:1",
        validated_images=JobCompute(instance_type="ml.m5.xlarge", instance_count=instances), poll_interval_s=0.3,
    )
    fake = FakeSageMaker(tmp_path / "sm", seaweed.client(), cloudwatch, {**seaweed.env(), "PYTHONPATH": str(REPO_ROOT), "ZERO_PIPES_FLUSH_S": "0.3"})
    monkeypatch.setattr(sagemaker_runner, "make_aws_clients", lambda region: AwsClients(fake, cloudwatch, seaweed.client(), None))
    jobs = SageMakerJobRunner(settings=settings, aws=aws)

    result = materialize_source(SOURCE, instance=instance, resources={"settings": settings, "jobs": jobs},
                                assets=[raw_image_index, validated_images])
    assert result.success
    metadata = instance.get_latest_materialization_event(AssetKey("validated_images")).asset_materialization.metadata
    assert metadata["backend"].value == "sagemaker" and metadata["job_status"].value == "Completed"
    assert metadata["accepted"].value > 0  # reported by the script through S3 Pipes messages
    assert str(metadata["uri"].value).startswith(f"{lake}/validated_images/{SOURCE}/")
    s3 = seaweed.client()
    output = str(metadata["uri"].value)[len(f"s3://{BUCKET}/"):]
    assert s3.head_object(Bucket=BUCKET, Key=f"{output}/manifest.json")["ContentLength"] > 0
    digest = build_code_package().digest
    assert s3.head_object(Bucket=BUCKET, Key=f"zero/code/{digest}/{MARKER}")
    name = metadata["job_name"].value
    assert s3.list_objects_v2(Bucket=BUCKET, Prefix=f"zero/pipes/{name}/messages/")["KeyCount"] >= 1

    launched = [c for c in fake.calls if c[0] == "CreateProcessingJob"]
    # Only the source's raw folder is handed to the job, landing where the script reads the raw layout.
    raw_input = next(i["S3Input"] for i in fake.jobs[name]["params"]["ProcessingInputs"] if i["InputName"] == "raw") if instances == 1 else \
        next(i["S3Input"] for i in fake.jobs[metadata["map_job_name"].value]["params"]["ProcessingInputs"] if i["InputName"] == "raw")
    assert raw_input["S3Uri"] == f"s3://{BUCKET}/raw/{SOURCE}/" and raw_input["LocalPath"].endswith(f"/input/raw/{SOURCE}")
    if instances == 2:
        # Map on two instances, each given half the raw objects by key, then the reduce on one.
        map_name = metadata["map_job_name"].value
        assert launched == [("CreateProcessingJob", map_name), ("CreateProcessingJob", name)]
        assert fake.jobs[map_name]["params"]["ProcessingResources"]["ClusterConfig"]["InstanceCount"] == 2
        parts = s3.list_objects_v2(Bucket=BUCKET, Prefix=f"{output}-map/verdicts-")["Contents"]
        assert sorted(part["Key"].rsplit("/", 1)[1] for part in parts) == ["verdicts-algo-1.parquet", "verdicts-algo-2.parquet"]
        streams = cloudwatch.describe_log_streams(logGroupName="/aws/sagemaker/ProcessingJobs", logStreamNamePrefix=f"{map_name}/")["logStreams"]
        assert {stream["logStreamName"].split("/")[1].rsplit("-", 1)[0] for stream in streams} == {"algo-1", "algo-2"}
    else:
        assert launched == [("CreateProcessingJob", name)]

    # Same inputs again: the finished job is found by name, nothing new is launched.
    assert materialize_source(SOURCE, instance=instance, resources={"settings": settings, "jobs": jobs}, assets=[validated_images]).success
    assert [c for c in fake.calls if c[0] == "CreateProcessingJob"] == launched
