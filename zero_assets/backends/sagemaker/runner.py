"""Run job scripts as SageMaker Training and Processing jobs, through `PipesSageMakerClient`.

A training job's `model.tar.gz` is unpacked to the asset's output prefix (manifest last), so downstream
jobs read plain files as on the local backend. A launch its Training Plan cannot take is refused first.
"""

from __future__ import annotations

import tarfile
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dagster import AssetExecutionContext, Failure, PipesClientCompletedInvocation

from training_code.lib.storage import exists, fetch_file, join, publish_folder
from zero_assets.backends.job_cost import JobUsage, cost_metadata, price_table
from zero_assets.backends.job_runner import JobRunner, TuningRun, WarmedShards
from zero_assets.backends.preflight import Finding
from zero_assets.backends.sagemaker.attempts import outputs_as_recorded, record_outputs
from zero_assets.backends.sagemaker.code_package import build_code_package, upload_code_package
from zero_assets.backends.sagemaker.fsx_warm import (
    counted_on_s3,
    ensure_association,
    import_metadata,
    new_to_file_system,
    record_warmed_set,
    warm_job_request,
)
from zero_assets.backends.sagemaker.job_api import stop_orphaned
from zero_assets.backends.sagemaker.job_params import build_job_params, model_artifact_uri
from zero_assets.backends.sagemaker.pipes_client import PipesSageMakerClient
from zero_assets.backends.sagemaker.preflight import sagemaker_preflight
from zero_assets.backends.sagemaker.settings import (
    TRAINING_ASSET,
    SageMakerSettings,
    compute_variable,
    profile_from_env,
)
from zero_assets.backends.sagemaker.training_plan import (
    TrainingPlan,
    launch_problems,
    plan_metadata,
    read_training_plan,
    utc_now,
)
from zero_assets.backends.sagemaker.training_set_channel import (
    channel_training_set,
    shards_on_fsx,
    write_channel_training_set,
)
from zero_assets.backends.sagemaker.tuning import run_tuning, tuning_params
from zero_assets.backends.sagemaker.work_sizing import instances_for, read_list_uri
from zero_assets.core.fingerprints import UpstreamOutput
from zero_assets.core.job_request import JobRequest, Work, job_name
from zero_assets.core.output_marker import output_is_complete
from zero_assets.core.settings import ZeroSettings
from zero_assets.core.tuning import TuningSpec


@dataclass(frozen=True)
class AwsClients:
    sagemaker: Any
    logs: Any
    s3: Any
    fsx: Any


def make_aws_clients(region: str) -> AwsClients:
    """The process's shared AWS clients (tests replace this function)."""
    from training_code.lib.aws_clients import client
    from training_code.lib.storage import s3_client

    return AwsClients(
        client("sagemaker", region=region), client("logs", region=region), s3_client(), client("fsx", region=region)
    )


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

    def run(
        self, context: AssetExecutionContext, request: JobRequest
    ) -> tuple[PipesClientCompletedInvocation, dict[str, Any]]:
        clients = self.clients()
        plan = self.training_plan(request.asset, clients) if request.kind == "training" else None
        if plan is not None:
            context.log.info(
                f"training plan {plan.name}: {plan.status}, {plan.window()}, reserves {plan.reserved} "
                f"({plan.available_instance_count} available now)"
            )
        # A module outside training_code brings its package.
        package = build_code_package(modules=(request.module,), requirements=not self.aws.images_hold_requirements)
        upload_code_package(package, self.aws.s3_root(), clients.s3)
        pipes = self.pipes_client(clients)
        started = time.perf_counter()
        name, params, invocation = pipes.run_attempts(
            context=context,
            kind=request.kind,
            name_for_attempt=lambda attempt: job_name(request.label, request.fingerprint, attempt),
            params_for=lambda name: build_job_params(
                request,
                self.aws,
                job_name=name,
                code=package,
                environment={},
                lake_uri=self.settings.lake_uri,
                training_plan=plan,
            )[1],
            output_ready=lambda name, job: self.output_ready(request, name),
            before_launch=(lambda params: self.refuse_unless_plan_fits(request.asset, plan, params)) if plan else None,
            training_plan=plan,
        )
        if request.stage == "map":
            record_outputs(self.aws.s3_root(), name, request.outputs)
        extra: dict[str, Any] = {
            "backend": "sagemaker",
            "job_wall_s": round(time.perf_counter() - started, 2),
            "code_package": package.digest,
        }
        if request.kind == "training":
            model_tar = model_artifact_uri(self.aws, name)
            for destination in request.outputs.values():
                unpack_model_artifact(model_tar, destination)
            extra["checkpoint_uri"] = params["CheckpointConfig"]["S3Uri"]
            extra["model_artifact"] = model_tar
        if plan is not None:
            extra.update(plan_metadata(plan))
        return invocation, extra

    def tune(
        self, context: AssetExecutionContext, request: JobRequest, spec: TuningSpec, earlier: Mapping[str, Any] | None
    ) -> TuningRun:
        """Run one CreateHyperParameterTuningJob over the training job's definition."""
        clients = self.clients()
        package = build_code_package(modules=(request.module,), requirements=not self.aws.images_hold_requirements)
        upload_code_package(package, self.aws.s3_root(), clients.s3)
        parent = (earlier or {}).get("job")
        params = tuning_params(request, self.aws, self.settings.lake_uri, spec, package, parent)
        found = run_tuning(context, clients.sagemaker, params, spec, self.aws.poll_interval_s)
        seconds = sum(t["seconds"] or 0.0 for t in found["trials"])
        resources = params["TrainingJobDefinition"]["ResourceConfig"]
        usage = JobUsage(resources["InstanceType"], resources["InstanceCount"], seconds, seconds)
        cost = cost_metadata(usage, self.aws.region, price_table())
        return TuningRun(job=found["job"], trials=found["trials"], best=found["best"], cost=cost)

    def environment(self) -> dict[str, str]:
        images = {"training_image": self.aws.training_image_uri, "processing_image": self.aws.processing_image_uri}
        return {**super().environment(), **images}

    def rehearsal_gate_default(self, environ: Mapping[str, str] | None = None) -> tuple[bool, str]:
        profile = profile_from_env(environ)
        if profile != "production":
            return False, f"ZERO_PROFILE={profile}: the whole graph runs as a rehearsal"
        return True, "the SageMaker backend, production profile"

    def preflight(self, settings: ZeroSettings, tracking: Mapping[str, Any]) -> list[Finding]:
        return sagemaker_preflight(self.aws, settings, tracking)

    def stop_orphaned_jobs(
        self, orphaned_since: dict[str, float], holder: Callable[[str], Any], log: Any
    ) -> tuple[dict[str, float], str]:
        sagemaker = self.clients().sagemaker
        return stop_orphaned(sagemaker, orphaned_since, self.aws.orphaned_job_grace_s, holder, log)

    def training_plan(self, asset: str = TRAINING_ASSET, clients: AwsClients | None = None) -> TrainingPlan | None:
        arn = self.aws.compute(asset).training_plan_arn
        if not arn:
            return None
        variable = compute_variable(asset, "training_plan_arn")
        return read_training_plan((clients or self.clients()).sagemaker, arn, variable)

    def refuse_unless_plan_fits(self, asset: str, plan: TrainingPlan, params: dict[str, Any]) -> None:
        """Raise a non-retryable `Failure` naming each field of `params` that does not fit `plan`."""
        problems = launch_problems(plan, self.aws, asset, params, utc_now())
        if problems:
            raise Failure(
                f"{params['TrainingJobName']} not launched: " + "; ".join(problems),
                metadata=plan_metadata(plan),
                allow_retries=False,
            )

    def output_ready(self, request: JobRequest, name: str) -> bool:
        """Whether the `Completed` attempt `name` left a complete output behind, so it may be reused."""
        if request.kind == "training":
            return exists(model_artifact_uri(self.aws, name))  # unpacked again into the asset's output
        if request.stage == "map":
            return outputs_as_recorded(self.aws.s3_root(), name, request.outputs)
        return all(output_is_complete(uri, request.fingerprint) for uri in request.outputs.values())

    def instance_count(self, request: JobRequest, work: Work) -> int:
        return instances_for(request.asset, self.aws.compute(request.asset), work)

    def read_list_uri(self, request: JobRequest) -> str:
        return read_list_uri(self.aws, request)

    def warm_location(self, shards: UpstreamOutput) -> str:
        """The shard set's folder under the shard root, on FSx when it is configured."""
        warm_uri = channel_training_set(self.settings.lake_uri, shards.data_version).uri
        if not self.aws.fsx_enabled():
            return warm_uri
        return shards_on_fsx(warm_uri, self.settings.lake_uri, self.aws.fsx_file_system_id, self.aws.fsx_mount_name).uri

    def warm_shards(self, context: AssetExecutionContext, shards: UpstreamOutput, lease: str) -> WarmedShards:
        """Lay the set out under the shard root (no shard copied), then warm and verify it on FSx, or on S3."""
        channel, listed = write_channel_training_set(shards.uri, self.settings.lake_uri, shards.data_version)
        base = {"backend": "sagemaker", "training_set_folder": channel.folder}
        if not self.aws.fsx_enabled():
            return WarmedShards(
                location=channel.uri,
                **counted_on_s3(channel, listed),
                paths={"shards_uri": shards.uri},
                details={
                    "file_system": "none: training reads S3 in FastFile mode",
                    "verified": "every listed shard present on S3 with its size",
                    **base,
                },
            )
        fs_id, mount = self.aws.fsx_file_system_id, self.aws.fsx_mount_name
        lake = self.settings.lake_uri
        location = shards_on_fsx(channel.uri, lake, fs_id, mount)
        fsx = self.clients().fsx
        association = ensure_association(fsx, fs_id, lake, context.log)
        new = new_to_file_system(channel, listed, fs_id)
        # Import only what the file system does not list yet.
        paths = [location.path] + [shards_on_fsx(join(channel.root, key), lake, fs_id, mount).path for key in new]
        import_tasks = import_metadata(fsx, fs_id, paths, context.log)
        request = warm_job_request(shards, location, self.settings, lease)
        invocation, extra = self.run(context, request)
        record_warmed_set(channel, fs_id)
        report = dict(invocation.get_materialize_result().metadata or {})
        counts = {key: _reported_count(report, name, request) for key, name in WARM_JOB_COUNTS.items()}
        return WarmedShards(
            location=location.uri,
            **counts,
            # gc keeps what a materialization names: the S3 side of the warm folder, not only its fsx:// name.
            paths={"shards_uri": shards.uri, "warm_s3_uri": channel.uri},
            details={
                **report,
                **extra,
                **base,
                "file_system_id": fs_id,
                "mount_path": location.directory_path,
                "association_id": association,
                "imported_new_shards": len(new),
                "import_task_ids": import_tasks,
            },
        )


# WarmedShards' counts, from the metadata keys the warm job (training_code.warm) reports them under.
WARM_JOB_COUNTS = {
    "rows": "dagster/row_count",
    "bytes": "dagster/size_bytes",
    "shards": "shards",
    "verified": "verified",
    "verified_bytes": "verified_bytes",
    "reused_verdicts": "reused_verdicts",
}


def _reported_count(report: dict[str, Any], key: str, request: JobRequest) -> int:
    """A count the warm job must have reported (a plain int or an IntMetadataValue)."""
    if key not in report:
        raise RuntimeError(f"the warm job {request.job_name} ({request.module}) reported no {key!r} in its metadata")
    value = report.pop(key)
    return int(getattr(value, "value", value))


def unpack_model_artifact(model_tar_uri: str, destination: str) -> None:
    """SageMaker tars `/opt/ml/model`; downstream jobs read plain files, so unpack it (manifest last)."""
    with tempfile.TemporaryDirectory(prefix="zero-model-") as tmp:
        archive = Path(tmp) / "model.tar.gz"
        fetch_file(model_tar_uri, archive)
        unpacked = Path(tmp) / "model"
        with tarfile.open(archive) as tar:
            tar.extractall(unpacked, filter="data")  # rejects absolute paths and links out of the folder
        publish_folder(unpacked, destination)
