"""Run job scripts as SageMaker Training and Processing jobs, through `PipesSageMakerClient`.

The code is packaged and uploaded once per content hash; the job name comes from asset,
fingerprint and attempt; a training job's `model.tar.gz` is unpacked to the asset's output
prefix (manifest last), so downstream jobs read files exactly as they do on the local backend.

Attempts: a running attempt is reattached, a `Stopping` one waited for, a `Completed` one reused
only when its output is complete, and a reattached one whose Pipes report is gone counts as failed;
in every other case the next attempt is launched.
"""

from __future__ import annotations

import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import io
import json

import pyarrow.parquet as pq
from dagster import AssetExecutionContext, DataVersion, Failure, MaterializeResult, MetadataValue
from dagster._core.pipes.client import PipesClientCompletedInvocation

from training_code.lib import training_set as ts
from training_code.lib.storage import exists, fetch_file, join, publish_folder, read_bytes

from ..cache import output_is_complete
from ..fingerprints import UpstreamOutput
from ..job_request import JobRequest
from ..sagemaker.fsx import shards_on_fsx
from ..sagemaker.fsx_warm import ensure_association, import_metadata, verify_on_s3, warm_job_request
from ..sagemaker.code_package import build_code_package, upload_code_package
from ..sagemaker.names import job_name
from ..sagemaker.pipes_client import PipesSageMakerClient
from ..sagemaker.requests import build_job_params
from ..sagemaker.stage_outputs import outputs_as_recorded, record_outputs
from .job_runner import JobRunner
from .sagemaker_settings import SageMakerSettings
from .settings import ZeroSettings


@dataclass(frozen=True)
class AwsClients:
    sagemaker: Any
    logs: Any
    s3: Any
    fsx: Any


def make_aws_clients(region: str) -> AwsClients:
    """The process's shared clients under the one client policy (tests replace this function with stand-ins)."""
    from training_code.lib.aws_clients import client
    from training_code.lib.storage import s3_client

    return AwsClients(client("sagemaker", region=region), client("logs", region=region), s3_client(), client("fsx", region=region))


class SageMakerJobRunner(JobRunner):
    """The AWS backend: every job-backed materialization is one SageMaker job."""

    settings: ZeroSettings
    aws: SageMakerSettings

    def clients(self) -> AwsClients:
        return make_aws_clients(self.aws.region)

    def pipes_client(self, clients: AwsClients) -> PipesSageMakerClient:
        return PipesSageMakerClient(
            client=clients.sagemaker,
            logs_client=clients.logs,
            s3_client=clients.s3,
            pipes_uri=f"{self.aws.s3_root()}/pipes",
            messages=self.aws.messages,
            poll_interval=self.aws.poll_interval_s,
            message_poll_interval=min(10.0, self.aws.poll_interval_s),
        )

    def run(self, context: AssetExecutionContext, request: JobRequest) -> tuple[PipesClientCompletedInvocation, dict[str, Any]]:
        clients = self.clients()
        package = build_code_package()
        upload_code_package(package, self.aws.s3_root(), clients.s3)
        pipes = self.pipes_client(clients)
        started = time.perf_counter()
        name, params, invocation = pipes.run_attempts(
            context=context, kind=request.kind,
            name_for_attempt=lambda attempt: job_name(request.label, request.fingerprint, attempt),
            params_for=lambda name: build_job_params(request, self.aws, job_name=name, code=package, environment={}, lake_uri=self.settings.lake_uri)[1],
            output_ready=lambda name, job: self.output_ready(request, name),
        )
        if request.stage == "map":
            record_outputs(self.aws.s3_root(), name, request.outputs)
        extra: dict[str, Any] = {"backend": "sagemaker", "job_wall_s": round(time.perf_counter() - started, 2), "code_package": package.digest}
        if request.kind == "training":
            model_tar = self.model_artifact(name)
            for destination in request.outputs.values():
                unpack_model_artifact(model_tar, destination)
            extra["checkpoint_uri"] = params["CheckpointConfig"]["S3Uri"]
            extra["model_artifact"] = model_tar
        return invocation, extra

    def model_artifact(self, name: str) -> str:
        """Where SageMaker puts a training job's `model.tar.gz` (OutputDataConfig is `<root>/jobs/`)."""
        return f"{self.aws.s3_root()}/jobs/{name}/output/model.tar.gz"

    def output_ready(self, request: JobRequest, name: str) -> bool:
        """Whether the `Completed` attempt `name` left a complete output behind, so it may be reused."""
        if request.kind == "training":
            return exists(self.model_artifact(name))  # unpacked again, manifest last, into the asset's output
        if request.stage == "map":
            return outputs_as_recorded(self.aws.s3_root(), name, request.outputs)
        return all(output_is_complete(uri, request.fingerprint) for uri in request.outputs.values())

    def instance_count(self, asset: str) -> int:
        return self.aws.compute(asset).instance_count

    def warm_shards(self, context: AssetExecutionContext, shards: UpstreamOutput) -> MaterializeResult:
        """FSx configured: link, import, load and verify on the file system; else verify the set on S3.

        A training set is warmed as its one source's shard set: the training job reads one channel,
        and a set of several sources (or rows left out) needs the training-set manifest beside the
        shards, which this backend does not lay out yet, so it is refused, naming what to choose."""
        if shards.asset == "training_set":
            shards = single_source_shards(shards)
        base = {"backend": "sagemaker", "shards_uri": MetadataValue.path(shards.uri)}  # the asset adds the cache decision
        if not self.aws.fsx_enabled():
            counts = verify_on_s3(shards.uri)
            metadata = {"uri": MetadataValue.path(shards.uri), **counts, "file_system": "none: training reads S3 in FastFile mode",
                        "verified": "every shard of the manifest present on S3 with its size", **base}
            return MaterializeResult(metadata=metadata, data_version=DataVersion(shards.data_version))
        fs_id, mount = self.aws.fsx_file_system_id, self.aws.fsx_mount_name
        location = shards_on_fsx(shards.uri, self.settings.lake_uri, fs_id, mount)
        fsx = self.clients().fsx
        association = ensure_association(fsx, fs_id, self.settings.lake_uri, context.log)
        import_task = import_metadata(fsx, fs_id, location.path, context.log)
        invocation, extra = self.run(context, warm_job_request(shards, location, self.settings))
        reported = invocation.get_materialize_result()
        metadata = {**(reported.metadata or {}), **extra, **base, "uri": location.uri, "file_system_id": fs_id,
                    "mount_path": location.directory_path, "association_id": association, "import_task_id": import_task}
        return MaterializeResult(metadata=metadata, data_version=DataVersion(shards.data_version))


def single_source_shards(chosen: UpstreamOutput) -> UpstreamOutput:
    """The one shard set a training set of one source without excluded rows reads, under the training
    set's data version; anything else is refused with what to change."""
    manifest = json.loads(read_bytes(join(chosen.uri, ts.MANIFEST)))
    sources = manifest["sources"]
    excluded = pq.read_metadata(io.BytesIO(read_bytes(join(chosen.uri, ts.EXCLUDED)))).num_rows
    if len(sources) != 1 or excluded:
        raise Failure(
            f"training set {chosen.uri} has {len(sources)} sources and {excluded} excluded rows; on the SageMaker backend "
            "a training job reads one source's shard set as it is. Set training_set's config `sources` to one source "
            "(and no max_images_per_source), or train on the local backend."
        )
    return UpstreamOutput("arrow_shards", sources[0]["shards_uri"], chosen.data_version, sources[0]["source"])


def unpack_model_artifact(model_tar_uri: str, destination: str) -> None:
    """SageMaker tars `/opt/ml/model`; downstream jobs read plain files, so unpack it (manifest last)."""
    with tempfile.TemporaryDirectory(prefix="zero-model-") as tmp:
        archive = Path(tmp) / "model.tar.gz"
        fetch_file(model_tar_uri, archive)
        unpacked = Path(tmp) / "model"
        with tarfile.open(archive) as tar:
            tar.extractall(unpacked, filter="data")  # rejects absolute paths and links out of the folder
        publish_folder(unpacked, destination)
