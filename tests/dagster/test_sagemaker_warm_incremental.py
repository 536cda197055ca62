"""The SageMaker warm step in proportion to the change: a refreshed shard set imports only its new shards on
FSx, is laid out under the shard root without a shard copied, and its masked rows still mask.

The runner's warm step runs under the fakes (SageMaker, FSx: every request validated against botocore)
on a moto S3 lake; the warm job is the real training_code/warm.py. That the job restores and verifies
only shards without a holding verdict is tests/faults/test_fault_warm.py's (a file system that keeps
its verdicts between jobs).
"""

from __future__ import annotations

import json

from dagster import MaterializeResult, asset, materialize
from helpers.sagemaker_fakes import aws_env, fake_settings
from helpers.shard_sets import image_row, kept, pack, write_manifest
from test_lineage_s3 import FakeFsx, FsxSageMaker

from training_code.lib.aws_clients import client as aws_client
from training_code.lib.detection_samples import verified_split
from training_code.lib.storage import read_bytes
from zero_assets.backends.sagemaker import runner as sagemaker_runner
from zero_assets.backends.sagemaker.job_api import LEASE_TAG
from zero_assets.backends.sagemaker.runner import AwsClients, SageMakerJobRunner
from zero_assets.core.fingerprints import UpstreamOutput
from zero_assets.core.settings import REPO_ROOT, ZeroSettings

BUCKET = "zero-warm-io"
FILE_SYSTEM, MOUNT = "fs-0123456789abcdef0", "lustre1"
SOURCE = "cam"


def rows(first: int, count: int) -> list[dict]:
    return [image_row(SOURCE, index, 1024) for index in range(first, first + count)]


def test_a_refreshed_set_imports_only_its_new_shards_and_masks_what_it_masked(moto_endpoint, tmp_path, monkeypatch):
    for key, value in aws_env(moto_endpoint).items():
        monkeypatch.setenv(key, value)
    s3, logs = aws_client("s3", endpoint_url=moto_endpoint), aws_client("logs", endpoint_url=moto_endpoint)
    s3.create_bucket(Bucket=BUCKET)
    lake = f"s3://{BUCKET}/zero/lake"
    first = [e for n in range(3) for e in pack(lake, "a" * 16, "train", rows(4 * n, 4), 1 << 30)]
    first_uri = write_manifest(lake, "a" * 16, first)
    # The refresh keeps the three shards by reference, masks one row of them and packs one new shard.
    added = pack(lake, "b" * 16, "train", rows(12, 4), 1 << 30)
    listed = kept(first, "a" * 16) + added
    masked_key = rows(0, 1)[0]["key"]
    second_uri = write_manifest(lake, "b" * 16, listed, masked={listed[0]["path"]: [masked_key]})

    settings = ZeroSettings(raw_uri=f"s3://{BUCKET}/zero/raw", lake_uri=lake)
    aws = fake_settings(
        bucket=BUCKET,
        fsx_file_system_id=FILE_SYSTEM,
        fsx_mount_name=MOUNT,
        subnets=["subnet-0a1b2c3d"],
        security_group_ids=["sg-0123456789abcdef0"],
        poll_interval_s=0.3,
    )
    fsx = FakeFsx()
    fake = FsxSageMaker(tmp_path / "sm", s3, logs, {**aws_env(moto_endpoint), "PYTHONPATH": str(REPO_ROOT)}, fsx=fsx)
    monkeypatch.setattr(sagemaker_runner, "make_aws_clients", lambda region: AwsClients(fake, logs, s3, fsx))
    runner = SageMakerJobRunner(settings=settings, aws=aws)
    warmed = {}

    def warm(name: str, uri: str, version: str):
        @asset(name=name)
        def warming(context):  # no annotation: postponed annotations are strings Dagster cannot read
            lease = str(tmp_path / "jobs" / name / "lease.json")  # the step's, for an fsx:// output: on its host
            warmed[name] = runner.warm_shards(context, UpstreamOutput("arrow_shards", uri, version), lease)
            return MaterializeResult()

        assert materialize([warming]).success
        return warmed[name], fsx.tasks[max(fsx.tasks)]["Paths"]

    first_warm, first_paths = warm("first", first_uri, "1" * 64)
    folder = first_warm.details["training_set_folder"]
    assert first_warm.location == f"fsx://{FILE_SYSTEM}/{MOUNT}/arrow_shards/{folder}"
    assert first_paths == [f"arrow_shards/{folder}", *(f"arrow_shards/{'a' * 16}/{e['path']}" for e in first)]

    second_warm, second_paths = warm("second", second_uri, "2" * 64)
    folder = second_warm.details["training_set_folder"]
    # Only what the file system does not list yet: the set's folder and the one new shard.
    assert second_paths == [f"arrow_shards/{folder}", f"arrow_shards/{'b' * 16}/{added[0]['path']}"]
    assert second_warm.details["imported_new_shards"] == 1 and second_warm.shards == 4
    job = fake.jobs[second_warm.details["job_name"].value]["params"]
    assert job["InputDataConfig"][0]["DataSource"]["FileSystemDataSource"]["DirectoryPath"] == f"/{MOUNT}/arrow_shards"
    assert job["HyperParameters"]["training-set"] == folder
    # The job names the lease the warm step holds; that one is on the step's host, so no zero:lease tag: the
    # orphaned-job sensor never judges it (it once named its own request's lease on S3, which no run held,
    # and would have been stopped 10 minutes in).
    assert LEASE_TAG not in {tag["Key"] for tag in job["Tags"]}, job["Tags"]

    # Laid out, not copied: the set's manifest leads to the shards where arrow_shards wrote them, and the
    # masked row is still skipped through the rewritten paths.
    manifest = json.loads(read_bytes(f"{lake}/arrow_shards/{folder}/manifest.json"))
    assert [e["path"] for e in manifest["shards"]] == [f"../../{'a' * 16}/{e['path']}" for e in first] + [
        f"../../{'b' * 16}/{added[0]['path']}"
    ]
    local = tmp_path / "root"
    for obj in s3.list_objects_v2(Bucket=BUCKET, Prefix="zero/lake/arrow_shards/")["Contents"]:
        target = local / obj["Key"][len("zero/lake/arrow_shards/") :]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(s3.get_object(Bucket=BUCKET, Key=obj["Key"])["Body"].read())
    _, train = verified_split(local, "train", training_set_dir=folder)
    assert sum(ref.live_rows for ref in train) == 15 and train[0].masked == {masked_key}
    objects = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="zero/lake/arrow_shards/")["Contents"]]
    assert sum(key.endswith(".arrow") for key in objects) == 4, "no shard copied into the set's folder"
