"""The SageMaker backend's S3 data path against a real S3-compatible server (SeaweedFS on loopback):
raw root and lake on S3, the code package uploaded once, Pipes context and messages through S3.
SageMaker itself is the fake from sagemaker_fakes; CloudWatch Logs is a moto server."""

from __future__ import annotations

import json

import pytest
from dagster import AssetKey
from helpers.graph_runs import materialize_source, materialize_tail
from helpers.local_s3 import LocalS3Server
from helpers.sagemaker_fakes import FakeSageMaker, fake_settings, moto_server

from training_code.lib.aws_clients import client as aws_client
from training_code.lib.detection_samples import iter_eval_samples, verified_split
from training_code.lib.read_list import read_read_list
from training_code.lib.shard_format import verify_shard_file
from training_code.lib.storage import publish_folder
from training_code.warm import listed_shards
from zero_assets.backends.sagemaker import runner as sagemaker_runner
from zero_assets.backends.sagemaker.code_package import MARKER, build_code_package
from zero_assets.backends.sagemaker.runner import AwsClients, SageMakerJobRunner
from zero_assets.backends.sagemaker.settings import JobCompute
from zero_assets.core.settings import REPO_ROOT, ZeroSettings
from zero_assets.defs.assets import raw_image_index, validated_images

SOURCE = "line_a_camera"

BUCKET = "zero-ml"


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory):
    with LocalS3Server(tmp_path_factory.mktemp("seaweed")) as server:
        server.client().create_bucket(Bucket=BUCKET)
        yield server


@pytest.fixture(scope="module")
def cloudwatch():
    with moto_server() as endpoint:
        yield aws_client("logs", endpoint_url=endpoint, region="us-east-1", access_key="testing", secret_key="testing")


@pytest.mark.parametrize("instances", [1, 2])
def test_validation_job_runs_on_the_s3_path(
    seaweed, cloudwatch, tiny_raw_root, instance, tmp_path, monkeypatch, instances
):
    for key, value in seaweed.env().items():
        monkeypatch.setenv(key, value)
    publish_folder(tiny_raw_root, f"s3://{BUCKET}/raw")
    lake = f"s3://{BUCKET}/zero/lake-{instances}"  # its own lake per case: the other case's output must not be found
    settings = ZeroSettings(raw_uri=f"s3://{BUCKET}/raw", lake_uri=lake)
    aws = fake_settings(
        bucket=BUCKET,
        validated_images=JobCompute(instance_type="ml.m5.xlarge", instance_count=instances),
        poll_interval_s=0.3,
    )
    fake = FakeSageMaker(
        tmp_path / "sm",
        seaweed.client(),
        cloudwatch,
        {**seaweed.env(), "PYTHONPATH": str(REPO_ROOT), "ZERO_PIPES_FLUSH_S": "0.3"},
    )
    monkeypatch.setattr(
        sagemaker_runner, "make_aws_clients", lambda region: AwsClients(fake, cloudwatch, seaweed.client(), None)
    )
    jobs = SageMakerJobRunner(settings=settings, aws=aws)

    result = materialize_source(
        SOURCE,
        instance=instance,
        resources={"settings": settings, "jobs": jobs},
        assets=[raw_image_index, validated_images],
    )
    assert result.success
    metadata = instance.get_latest_materialization_event(AssetKey("validated_images")).asset_materialization.metadata
    assert metadata["backend"].value == "sagemaker" and metadata["job_status"].value == "Completed"
    assert metadata["accepted"].value > 0  # reported by the script through S3 Pipes messages
    assert str(metadata["dagster/uri"].value).startswith(f"{lake}/validated_images/{SOURCE}/")
    s3 = seaweed.client()
    output = str(metadata["dagster/uri"].value)[len(f"s3://{BUCKET}/") :]
    assert s3.head_object(Bucket=BUCKET, Key=f"{output}/manifest.json")["ContentLength"] > 0
    digest = build_code_package().digest
    assert s3.head_object(Bucket=BUCKET, Key=f"zero/code/{digest}/{MARKER}")
    name = metadata["job_name"].value
    assert s3.list_objects_v2(Bucket=BUCKET, Prefix=f"zero/pipes/{name}/messages/")["KeyCount"] >= 1

    launched = [c for c in fake.calls if c[0] == "CreateProcessingJob"]
    # No raw prefix is handed to the job: its read list names the images it fetches by key (all of them, the
    # first time), every host gets the list and decodes its own part.
    staged = fake.jobs[name if instances == 1 else metadata["map_job_name"].value]["params"]["ProcessingInputs"]
    inputs = {i["InputName"]: i["S3Input"] for i in staged}
    assert "raw" not in inputs and inputs["reads"]["S3DataDistributionType"] == "FullyReplicated"
    reads = read_read_list(inputs["reads"]["S3Uri"])
    assert reads.raw_uri == f"s3://{BUCKET}/raw" and reads.objects == metadata["images_in"].value
    assert all(key.startswith(f"{SOURCE}/") for key in reads.keys())
    if instances == 2:
        # Map on two instances, each decoding its half of the read list, then the reduce on one.
        map_name = metadata["map_job_name"].value
        assert launched == [("CreateProcessingJob", map_name), ("CreateProcessingJob", name)]
        assert fake.jobs[map_name]["params"]["ProcessingResources"]["ClusterConfig"]["InstanceCount"] == 2
        parts = s3.list_objects_v2(Bucket=BUCKET, Prefix=f"{output}-map/verdicts-")["Contents"]
        assert sorted(part["Key"].rsplit("/", 1)[1] for part in parts) == [
            "verdicts-algo-1.parquet",
            "verdicts-algo-2.parquet",
        ]
        streams = cloudwatch.describe_log_streams(
            logGroupName="/aws/sagemaker/ProcessingJobs", logStreamNamePrefix=f"{map_name}/"
        )["logStreams"]
        assert {stream["logStreamName"].split("/")[1].rsplit("-", 1)[0] for stream in streams} == {"algo-1", "algo-2"}
    else:
        assert launched == [("CreateProcessingJob", name)]

    # Same inputs again: the finished job is found by name, nothing new is launched.
    assert materialize_source(
        SOURCE, instance=instance, resources={"settings": settings, "jobs": jobs}, assets=[validated_images]
    ).success
    assert [c for c in fake.calls if c[0] == "CreateProcessingJob"] == launched


FAST_TRAINING = {"max_steps": 4, "checkpoint_every": 2, "batch_size": 4}


@pytest.mark.slow  # every job of two sources' graph on the fake SageMaker: about 80 s here
def test_two_source_training_set_warms_trains_and_evaluates(
    seaweed, cloudwatch, tiny_raw_root, instance, tmp_path, monkeypatch
):
    """Two sources on the S3 path (no FSx): the warm step lays the shard set out under the shard root,
    manifest last; the real trainer and evaluator read it there (FastFile channel; ManifestFile input)."""
    monkeypatch.setenv("ZERO_REHEARSAL_GATE", "off")  # trains on SageMaker without a rehearsal: not the gate's test
    for key, value in seaweed.env().items():
        monkeypatch.setenv(key, value)
    publish_folder(tiny_raw_root, f"s3://{BUCKET}/raw-set")
    lake = f"s3://{BUCKET}/zero/lake-set"
    settings = ZeroSettings(raw_uri=f"s3://{BUCKET}/raw-set", lake_uri=lake)
    aws = fake_settings(bucket=BUCKET, poll_interval_s=0.3)
    fake = FakeSageMaker(
        tmp_path / "sm",
        seaweed.client(),
        cloudwatch,
        {**seaweed.env(), "PYTHONPATH": str(REPO_ROOT), "ZERO_PIPES_FLUSH_S": "0.3"},
    )
    monkeypatch.setattr(
        sagemaker_runner, "make_aws_clients", lambda region: AwsClients(fake, cloudwatch, seaweed.client(), None)
    )
    resources = {"settings": settings, "jobs": SageMakerJobRunner(settings=settings, aws=aws)}
    sources = ["line_a_camera", "line_b_camera"]
    for source in sources:
        assert materialize_source(source, instance=instance, resources=resources).success
    result = materialize_tail(
        instance=instance, resources=resources, run_config={"ops": {"trained_checkpoint": {"config": FAST_TRAINING}}}
    )
    assert result.success

    def metadata(asset: str) -> dict:
        return {
            k: v.value
            for k, v in instance.get_latest_materialization_event(
                AssetKey(asset)
            ).asset_materialization.metadata.items()
        }

    shards, warm, trained, report = (
        metadata("arrow_shards"),
        metadata("fsx_warm_state"),
        metadata("trained_checkpoint"),
        metadata("map_report"),
    )
    folder = warm["training_set_folder"]
    assert folder.startswith("_training_sets/") and warm["dagster/uri"] == f"{lake}/arrow_shards/{folder}"
    assert (
        warm["shards"] == shards["shards"]
        and warm["dagster/row_count"]
        == sum(
            json.loads(
                seaweed.client()
                .get_object(Bucket=BUCKET, Key=f"zero/lake-set/arrow_shards/{folder}/manifest.json")["Body"]
                .read()
            )["rows"].values()
        )
        + shards["masked_rows"]
    )
    # The warm state carries the shard set's data version: warming the same bytes again does not make training stale.
    versions = {
        asset: instance.get_latest_materialization_event(AssetKey(asset)).asset_materialization.tags[
            "dagster/data_version"
        ]
        for asset in ("arrow_shards", "fsx_warm_state")
    }
    assert versions["fsx_warm_state"] == versions["arrow_shards"]
    # The channel is the shard root; the trainer is told the set's folder there.
    training = fake.jobs[trained["job_name"]]["params"]
    assert training["InputDataConfig"][0]["DataSource"]["S3DataSource"]["S3Uri"] == f"{lake}/arrow_shards/"
    assert training["HyperParameters"]["training-set"] == folder
    s3 = seaweed.client()
    manifest = json.loads(
        s3.get_object(Bucket=BUCKET, Key=f"zero/lake-set/arrow_shards/{folder}/manifest.json")["Body"].read()
    )
    # Laid out, not copied: every path leads from the set's folder to the shard where arrow_shards wrote it.
    packed_in = str(shards["dagster/uri"]).rstrip("/").rpartition("/")[2]
    assert {entry["path"].rsplit("/", 2)[0] for entry in manifest["shards"]} == {f"../../{packed_in}"}
    # The evaluator got exactly the set's files from S3 (no FSx mount for Processing jobs) and scored
    # what the trainer's own reader yields there.
    evaluation = fake.jobs[report["job_name"]]["params"]
    listed = next(i["S3Input"] for i in evaluation["ProcessingInputs"] if i["InputName"] == "shards")
    assert listed["S3DataType"] == "ManifestFile"
    local = tmp_path / "shard_root"
    for obj in s3.list_objects_v2(Bucket=BUCKET, Prefix="zero/lake-set/arrow_shards/")["Contents"]:
        target = local / obj["Key"][len("zero/lake-set/arrow_shards/") :]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(s3.get_object(Bucket=BUCKET, Key=obj["Key"])["Body"].read())
    _, val_shards = verified_split(local, "val", training_set_dir=folder)
    assert sum(ref.live_rows for ref in val_shards) == manifest["rows"]["val"]
    assert report["val_images"] == sum(1 for _ in iter_eval_samples(val_shards)) <= manifest["rows"]["val"]
    _, train_shards = verified_split(local, "train", training_set_dir=folder)
    assert trained["dagster/row_count"] == sum(ref.live_rows for ref in train_shards) == manifest["rows"]["train"]
    # What the FSx warm job restores and verifies in that layout: every listed shard, inside the root.
    _, located, _ = listed_shards(local, folder)
    assert len(located) == warm["shards"] and all(where.is_relative_to(local / packed_in) for where, _ in located)
    for where, entry in located:
        verify_shard_file(where, entry)
