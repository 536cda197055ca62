"""`zero-assets lineage` on the production layout: raw root and lake on S3 (SeaweedFS on loopback),
every job on the SageMaker fakes, the shard set warmed on FSx for Lustre. The command runs as a user
runs it, in its own process, with the S3 endpoint and DAGSTER_HOME in its environment, and answers
from Dagster's provenance of each materialization, in the graph's order: checkpoint -> warm set ->
arrow_shards -> training_set (the selection) -> each source's validated set.

FSx is faked here the way it behaves for these jobs: a data repository association links the lake's
shard prefix to `/arrow_shards`, and a Training job's `FileSystemDataSource` sees that S3 prefix's files.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import botocore.session
import pandas as pd
import pytest
from botocore.validate import validate_parameters
from dagster import AssetKey, AssetMaterialization, MetadataValue
from helpers.graph_runs import materialize_source, materialize_tail
from helpers.sagemaker_fakes import FakeSageMaker, fake_settings, moto_server

from training_code.lib.aws_clients import client as aws_client
from training_code.lib.storage import join, publish_folder, read_bytes
from zero_assets.backends.sagemaker import runner as sagemaker_runner
from zero_assets.backends.sagemaker.runner import AwsClients, SageMakerJobRunner
from zero_assets.core.settings import REPO_ROOT, ZeroSettings

BUCKET = "zero-lineage"
FILE_SYSTEM, MOUNT = "fs-0123456789abcdef0", "lustre1"
FAST_TRAINING = {"ops": {"trained_checkpoint": {"config": {"max_steps": 4, "checkpoint_every": 2, "batch_size": 4}}}}
_FSX_MODEL = botocore.session.get_session().get_service_model("fsx")


class FakeFsx:
    """The FSx calls the warm step makes: associations are AVAILABLE and imports SUCCEEDED when first described."""

    def __init__(self) -> None:
        self.associations: dict[str, dict] = {}
        self.tasks: dict[str, dict] = {}
        self._ids = itertools.count(1)

    def create_data_repository_association(self, **params):
        validate_parameters(params, _FSX_MODEL.operation_model("CreateDataRepositoryAssociation").input_shape)
        association = {**params, "AssociationId": f"dra-{next(self._ids):017x}", "Lifecycle": "CREATING"}
        self.associations[association["AssociationId"]] = association
        return {"Association": association}

    def describe_data_repository_associations(self, AssociationIds: list[str]):
        for association_id in AssociationIds:
            self.associations[association_id]["Lifecycle"] = "AVAILABLE"
        return {"Associations": [self.associations[a] for a in AssociationIds]}

    def get_paginator(self, operation: str):
        assert operation == "describe_data_repository_associations", operation
        fsx = self

        class Paginator:
            def paginate(self, Filters: list[dict]):
                wanted = set(Filters[0]["Values"])
                yield {"Associations": [a for a in fsx.associations.values() if a["FileSystemId"] in wanted]}

        return Paginator()

    def create_data_repository_task(self, **params):
        validate_parameters(params, _FSX_MODEL.operation_model("CreateDataRepositoryTask").input_shape)
        task = {**params, "TaskId": f"task-{next(self._ids):017x}", "Lifecycle": "PENDING"}
        self.tasks[task["TaskId"]] = task
        return {"DataRepositoryTask": task}

    def describe_data_repository_tasks(self, TaskIds: list[str]):
        for task_id in TaskIds:
            self.tasks[task_id]["Lifecycle"] = "SUCCEEDED"
        return {"DataRepositoryTasks": [self.tasks[t] for t in TaskIds]}

    def s3_behind(self, file_system_id: str, directory_path: str) -> str:
        """The S3 prefix a `FileSystemDataSource.DirectoryPath` (`/<mount>/<path>`) shows through an association."""
        path = "/" + directory_path.strip("/").partition("/")[2]
        for association in self.associations.values():
            linked = association["FileSystemPath"]
            if association["FileSystemId"] == file_system_id and (path == linked or path.startswith(linked + "/")):
                return association["DataRepositoryPath"].rstrip("/") + "/" + path[len(linked) :].strip("/")
        raise KeyError(f"{file_system_id}:{path} is linked to no S3 prefix")


class FsxSageMaker(FakeSageMaker):
    """The SageMaker fake, where a Training job's FSx channel holds the linked S3 prefix's files."""

    def __init__(self, *args, fsx: FakeFsx, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fsx = fsx

    def _prepare_training(self, job: dict, opt: Path):
        channels = []
        for channel in job["params"].get("InputDataConfig", []):
            mounted = channel["DataSource"].get("FileSystemDataSource")
            if mounted:
                uri = self.fsx.s3_behind(mounted["FileSystemId"], mounted["DirectoryPath"])
                channel = {**channel, "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": uri}}}
            channels.append(channel)
        return super()._prepare_training({**job, "params": {**job["params"], "InputDataConfig": channels}}, opt)


@pytest.fixture(scope="module")
def cloudwatch():
    with moto_server() as endpoint:
        yield aws_client("logs", endpoint_url=endpoint, region="us-east-1", access_key="testing", secret_key="testing")


def _lineage(instance, s3_server, *args: str) -> subprocess.CompletedProcess:
    """`zero-assets lineage ARGS` as a user runs it: the console script, this instance as DAGSTER_HOME,
    the S3 endpoint."""
    env = {**os.environ, **s3_server.env(), "DAGSTER_HOME": instance.root_directory}
    command = [str(Path(sys.executable).parent / "zero-assets"), "lineage", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)


def _answered(instance, s3_server, *args: str) -> str:
    result = _lineage(instance, s3_server, *args)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


# Every job of two sources' graph on the SageMaker fakes (about 80 s on an idle machine), then six commands.
@pytest.mark.slow
def test_lineage_answers_for_a_checkpoint_and_an_image_on_an_s3_lake_warmed_on_fsx(
    s3_env, cloudwatch, tiny_demo, tiny_raw_root, instance, tmp_path, monkeypatch
):
    monkeypatch.setenv("ZERO_REHEARSAL_GATE", "off")  # trains on SageMaker without a rehearsal: not the gate's test
    s3 = s3_env.client()
    s3.create_bucket(Bucket=BUCKET)
    publish_folder(tiny_raw_root, f"s3://{BUCKET}/raw")
    lake = f"s3://{BUCKET}/zero/lake"
    settings = ZeroSettings(raw_uri=f"s3://{BUCKET}/raw", lake_uri=lake)
    aws = fake_settings(
        bucket=BUCKET,
        poll_interval_s=0.3,
        fsx_file_system_id=FILE_SYSTEM,
        fsx_mount_name=MOUNT,
        subnets=["subnet-0abc"],
        security_group_ids=["sg-0abc"],
    )
    fsx = FakeFsx()
    fake = FsxSageMaker(
        tmp_path / "sm",
        s3,
        cloudwatch,
        {**s3_env.env(), "PYTHONPATH": str(REPO_ROOT), "ZERO_PIPES_FLUSH_S": "0.3"},
        fsx=fsx,
    )
    fake.record_leases = True
    monkeypatch.setattr(sagemaker_runner, "make_aws_clients", lambda region: AwsClients(fake, cloudwatch, s3, fsx))
    resources = {"settings": settings, "jobs": SageMakerJobRunner(settings=settings, aws=aws)}
    sources = ["line_a_camera", "line_b_camera"]
    for source in sources:
        assert materialize_source(source, instance=instance, resources=resources).success
    assert materialize_tail(instance=instance, resources=resources, run_config=FAST_TRAINING).success

    # Every job tagged with a lease was created while a live run held that lease: otherwise the
    # orphaned-job sensor would stop it (the FSx warm job, whose step holds its fsx:// lease, carries none).
    tagged = {asset for asset, _, _ in fake.leases_at_create.values()}
    assert {"validated_images", "arrow_shards", "trained_checkpoint", "map_report"} <= tagged, tagged
    unheld = {job: lease for job, (_, lease, held) in fake.leases_at_create.items() if not held}
    assert not unheld, f"jobs created while no live run held their zero:lease: {unheld}"

    def metadata(asset: str, partition: str | None = None) -> dict:
        event = (
            instance.get_latest_materialization_event(AssetKey(asset))
            if partition is None
            else next(
                r
                for r in instance.fetch_materializations(AssetKey(asset), limit=10).records
                if r.partition_key == partition
            )
        )
        return {k: v.value for k, v in event.asset_materialization.metadata.items()}

    warm, trained, report, chosen, shards = (
        metadata("fsx_warm_state"),
        metadata("trained_checkpoint"),
        metadata("map_report"),
        metadata("training_set"),
        metadata("arrow_shards"),
    )
    assert warm["dagster/uri"].startswith(f"fsx://{FILE_SYSTEM}/{MOUNT}/"), "the warm state is on FSx"
    assert warm["warm_s3_uri"].startswith(f"{lake}/")
    validated = {s: metadata("validated_images", s)["dagster/uri"] for s in sources}
    selection = json.loads(read_bytes(join(chosen["dagster/uri"], "manifest.json")))
    shard_manifest = json.loads(read_bytes(join(shards["dagster/uri"], "manifest.json")))

    # The checkpoint, in the graph's order: each link the materialization Dagster recorded.
    lines = _answered(instance, s3_env, trained["dagster/uri"]).splitlines()
    assert lines[0].startswith(f"checkpoint   {trained['dagster/uri']}") and trained["dagster/uri"].startswith(
        f"{lake}/trained_checkpoint/"
    )
    assert lines[1] == f"warm shards  {warm['dagster/uri']}  (S3 side {warm['warm_s3_uri']})"
    assert lines[2].startswith(f"shard set    {shards['dagster/uri']}  ({len(shard_manifest['shards'])} shards")
    assert shards["dagster/uri"].startswith(f"{lake}/arrow_shards/")
    selected = sum(s["selected"] for s in selection["sources"])
    assert lines[3].startswith(f"training set {chosen['dagster/uri']}  (selected {selected} of ")
    for source in sources:
        assert any(line.startswith(f"validated    {source}: {validated[source]}  (selected ") for line in lines)
    assert any(line.startswith(f"scored by    {report['dagster/uri']}  mAP=") for line in lines)
    trained_line = next(i for i, line in enumerate(lines) if line.startswith("trained on   "))
    rows = [line.strip().split("\t") for line in lines[trained_line + 1 :]]
    duplicate = tiny_demo["planted"]["duplicate_across_sources"]
    keys = {key for _, key, _ in rows}
    assert duplicate not in keys, "the copy the training set excluded is not listed as trained"
    assert len(rows) == shard_manifest["rows"]["train"] == trained["dagster/row_count"]
    picked = pd.read_parquet(io.BytesIO(read_bytes(join(chosen["dagster/uri"], "selection.parquet"))))
    assert keys == set(picked.loc[picked["split"] == "train", "key"]), "the selection's train rows, and only those"
    assert lines[trained_line] == f"trained on   {len(rows)} images (source, key, sha256):"

    # An image: selected and trained, quarantined, excluded (why), each with the shards holding it.
    trained_key = rows[0][1]
    fate = json.loads(_answered(instance, s3_env, "--image", trained_key))
    assert (fate["status"], fate["checkpoints"], fate["trained"], fate["masked"]) == (
        "selected",
        [trained["dagster/uri"]],
        True,
        False,
    ), fate
    assert [held["shard_set"] for held in fate["shards"]] == [shards["dagster/uri"]]
    truncated = json.loads(_answered(instance, s3_env, "--image", tiny_demo["planted"]["truncated_jpeg"]))
    assert (truncated["status"], truncated.get("reason"), truncated["checkpoints"]) == (
        "quarantined",
        "truncated",
        [],
    ), truncated
    excluded = json.loads(_answered(instance, s3_env, "--image", duplicate))
    assert excluded["status"] == "excluded from the training set" and excluded["checkpoints"] == []
    assert excluded["reason"].startswith("duplicate of an image kept in source") and excluded["shards"] == []

    # Newer materializations than the ones the checkpoint was built from (recorded by hand, as an
    # external tool would): the walk follows Dagster's pointers, not each asset's latest, and a report
    # that records no provenance did not score it.
    for asset, partition in [
        ("validated_images", sources[0]),
        ("training_set", None),
        ("arrow_shards", None),
        ("fsx_warm_state", None),
        ("map_report", None),
    ]:
        instance.report_runless_asset_event(
            AssetMaterialization(
                asset, partition=partition, metadata={"dagster/uri": MetadataValue.path(f"{lake}/{asset}/newer")}
            )
        )
    assert _answered(instance, s3_env).splitlines() == lines, "no checkpoint named: the latest, the same answer"

    # Provenance is Dagster's, not a copy in metadata: a checkpoint recorded outside a Dagster step,
    # whose metadata names its warm state, is refused (and is now the latest).
    instance.report_runless_asset_event(
        AssetMaterialization(
            "trained_checkpoint",
            metadata={
                "dagster/uri": MetadataValue.path(f"{lake}/trained_checkpoint/by-hand"),
                "upstream": MetadataValue.json({"fsx_warm_state": {"uri": warm["dagster/uri"], "data_version": "x"}}),
            },
        )
    )
    refused = _lineage(instance, s3_env)
    assert refused.returncode != 0 and "no Dagster provenance for its input fsx_warm_state" in refused.stderr, (
        refused.stderr[-2000:]
    )
