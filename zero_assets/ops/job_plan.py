"""`render-jobs`: every request the graph would send to AWS for the current configuration, without sending it.

Fingerprints use the upstream data versions of the latest materializations when a lookup is given
(`instance_lookup`: the Dagster instance), so each request is the one the next materialization of
that asset sends; otherwise a stand-in version per asset, so the names and prefixes have the right
shape but the fingerprint parts differ from a real run. The per-source jobs are rendered for
one source (`source`): each gets only that source's raw folder, its output under `<asset>/<source>/`.
The training set's jobs read the shard root holding every chosen source's shard sets, told the
training set's folder there (`--training-set`), so their requests do not depend on how many sources.

On a Training Plan, the training request carries its ARN and is preceded by the DescribeTrainingPlan
the runner sends before launching. Without the plan as read (`training_plan`: render-jobs makes no AWS
call), MaxRuntimeInSeconds is the configured one and a note on stderr says that the runner bounds it
by the plan's end at launch; with it, the request is bounded as the runner bounds it, or refused.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Optional

from dagster import Config, DagsterInstance

from training_code.lib.hashing import sha256_json
from zero_assets.backends.sagemaker.code_package import build_code_package
from zero_assets.backends.sagemaker.fsx import shards_on_fsx
from zero_assets.backends.sagemaker.fsx_warm import association_params, import_task_params, warm_job_request
from zero_assets.backends.sagemaker.job_params import build_job_params
from zero_assets.backends.sagemaker.pipes_io import bootstrap_environment
from zero_assets.backends.sagemaker.settings import TRAINING_ASSET, SageMakerSettings
from zero_assets.backends.sagemaker.training_plan import TrainingPlan, launch_problems, plan_name, utc_now
from zero_assets.backends.sagemaker.training_set_channel import channel_training_set
from zero_assets.core.fingerprints import FingerprintInputs, UpstreamOutput
from zero_assets.core.job_request import JobRequest, build_job_request, fan_out, job_name
from zero_assets.core.settings import ZeroSettings, source_uri
from zero_assets.defs.assets import ALL_ASSETS
from zero_assets.defs.assets.arrow_shards import ShardConfig
from zero_assets.defs.assets.map_report import EvalConfig
from zero_assets.defs.assets.trained_checkpoint import TrainConfig
from zero_assets.defs.assets.validated_images import VALIDATION_SPREAD, ValidationConfig
from zero_assets.launch.upstream import latest_materializations, output_of

Lookup = Callable[[str, Optional[str]], Optional[UpstreamOutput]]  # (asset, source) -> its latest output


EXAMPLE_SOURCE = "example_source"
JOB_CONFIGS = {
    "validated_images": ValidationConfig,
    "arrow_shards": ShardConfig,
    "trained_checkpoint": TrainConfig,
    "map_report": EvalConfig,
}


def job_configs(run_config: Mapping[str, Any]) -> dict[str, Config]:
    """The config of each asset whose job is rendered, as a run with `run_config` (Dagster's shape,
    `{"ops": {asset: {"config": {...}}}}`) gives it; an asset name that is none of the graph's fails."""
    ops = run_config.get("ops") or {}
    assets = {key.to_user_string() for asset in ALL_ASSETS for key in asset.keys}
    unknown = sorted(set(ops) - assets)
    if unknown:
        raise ValueError(f"run config: ops {unknown} are not assets of the graph; they are {sorted(assets)}")
    return {asset: config(**((ops.get(asset) or {}).get("config") or {})) for asset, config in JOB_CONFIGS.items()}


def instance_lookup(instance: DagsterInstance) -> Lookup:
    """The latest materialization of each upstream asset in `instance` (of the source, for a per-source one)."""

    def lookup(asset: str, partition: str | None) -> UpstreamOutput | None:
        records = latest_materializations(instance, asset, partition)
        found = records and records[0].asset_materialization is not None
        return output_of(records[0], asset, partition) if found else None

    return lookup


def render_jobs(
    settings: ZeroSettings,
    aws: SageMakerSettings,
    lookup: Lookup = lambda asset, partition: None,
    source: str = EXAMPLE_SOURCE,
    run_config: Mapping[str, Any] | None = None,
    training_plan: TrainingPlan | None = None,
    now: datetime | None = None,
) -> list[tuple[str, str, str, dict[str, Any]]]:
    """(label, service, operation, parameters) for every AWS call that launches work, in graph order; the
    label is the asset, with `-map` / `-reduce` for the two jobs of a validation spread over instances.
    Each asset's config is its default, or what `run_config` sets (see `job_configs`). `training_plan`:
    the plan trained_checkpoint's compute names, as DescribeTrainingPlan read it at `now`."""
    configs = job_configs(run_config or {})
    now = now or utc_now()
    code = build_code_package()
    rendered: list[tuple[str, str, str, dict[str, Any]]] = []

    def upstream(asset: str, partition: str | None = None) -> UpstreamOutput:
        found = lookup(asset, partition)
        return found or UpstreamOutput(
            asset, settings.asset_uri(asset, sha256_json(asset)[:16], partition), f"unmaterialized-{asset}", partition
        )

    def previous(asset: str) -> dict[str, str]:
        """A per-source job's earlier output, handed to it as `previous` as the asset does (which also
        checks that its manifest is still there: no AWS call is made here)."""
        found = lookup(asset, source)
        return {"previous": found.uri} if found else {}

    def add(request: JobRequest) -> None:
        name = job_name(request.label, request.fingerprint, 1)
        environment = bootstrap_environment(f"{aws.s3_root()}/pipes", name, aws.messages)
        plan = training_plan if request.asset == TRAINING_ASSET else None
        operation, params = build_job_params(
            request,
            aws,
            job_name=name,
            code=code,
            environment=environment,
            lake_uri=settings.lake_uri,
            training_plan=plan,
            now=now,
        )
        if "TrainingPlanArn" in params.get("ResourceConfig", {}):
            rendered.append(
                (
                    request.label,
                    "sagemaker",
                    "DescribeTrainingPlan",
                    {"TrainingPlanName": plan_name(params["ResourceConfig"]["TrainingPlanArn"])},
                )
            )
            _check_or_note(plan, request.asset, params, aws, now)
        rendered.append((request.label, "sagemaker", operation, params))

    raw_uri, raw_folders = (
        source_uri(settings, source),
        {"raw": source},
    )  # the source's raw folder only, at its place in the layout
    index = upstream("raw_image_index", source)
    validation = build_job_request(
        "validated_images",
        settings=settings,
        kind="processing",
        module="training_code.validate",
        config=configs["validated_images"].model_dump(),
        upstream=[index],
        partition=source,
        inputs={"index": index.uri, "raw": raw_uri, **previous("validated_images")},
        input_folders=raw_folders,
    )
    instances = aws.compute("validated_images").instance_count
    for request in fan_out(validation, VALIDATION_SPREAD, instances) if instances > 1 else [validation]:
        add(request)
    validated = upstream("validated_images", source)
    add(
        build_job_request(
            "arrow_shards",
            settings=settings,
            kind="processing",
            module="training_code.shard",
            partition=source,
            config=configs["arrow_shards"].model_dump(),
            upstream=[validated],
            inputs={"validated": validated.uri, "raw": raw_uri, **previous("arrow_shards")},
            input_folders=raw_folders,
        )
    )
    shards = upstream("arrow_shards", source)
    # The training set's jobs read the shard root, whatever the number of sources; its folder there is
    # named by its data version.
    chosen = upstream("training_set")
    warm_uri = channel_training_set(settings.lake_uri, chosen.data_version).uri
    if aws.fsx_enabled():
        fs_id, mount = aws.fsx_file_system_id, aws.fsx_mount_name
        location = shards_on_fsx(warm_uri, settings.lake_uri, fs_id, mount)
        paths = [shards_on_fsx(shards.uri, settings.lake_uri, fs_id, mount).path, location.path]
        rendered.append(
            ("fsx_warm_state", "fsx", "CreateDataRepositoryAssociation", association_params(fs_id, settings.lake_uri))
        )
        rendered.append(("fsx_warm_state", "fsx", "CreateDataRepositoryTask", import_task_params(fs_id, paths)))
        add(warm_job_request(chosen, location, settings))
        warm_uri = location.uri
    warm = UpstreamOutput("fsx_warm_state", warm_uri, chosen.data_version)
    train = configs["trained_checkpoint"]
    add(
        build_job_request(
            "trained_checkpoint",
            settings=settings,
            kind="training",
            module=train.module,
            config=train.hyperparameters(),
            upstream=[warm],
            inputs={"train": warm.uri},
            processes_per_host=train.processes,
            tracking=train.tracking(FingerprintInputs.of(train.module, train.hyperparameters(), [warm]).fingerprint),
        )
    )
    checkpoint = upstream("trained_checkpoint")
    evaluation = configs["map_report"]
    add(
        build_job_request(
            "map_report",
            settings=settings,
            kind="processing",
            module=evaluation.module,
            config=evaluation.arguments(),
            tracking=evaluation.tracking(),
            upstream=[checkpoint, warm],
            inputs={"model": checkpoint.uri, "shards": warm.uri},
        )
    )
    return rendered


def _check_or_note(
    plan: TrainingPlan | None, asset: str, params: dict[str, Any], aws: SageMakerSettings, now: datetime
) -> None:
    """With the plan as read: refuse what the runner would refuse. Without it: say what is left to the runner."""
    arn = params["ResourceConfig"]["TrainingPlanArn"]
    if plan is None:
        print(
            f"render-jobs: {asset} runs on training plan {plan_name(arn)}; render-jobs makes no AWS call, so its "
            f"MaxRuntimeInSeconds ({params['StoppingCondition']['MaxRuntimeInSeconds']}) is the configured "
            "max_runtime_s. At launch the runner reads the plan (DescribeTrainingPlan), refuses a plan that is "
            "Expired or Failed, that reserves other instances or has too little time left, and bounds "
            "MaxRuntimeInSeconds by the plan's end less the checkpoint margin "
            f"(ZERO_SM_PLAN_CHECKPOINT_MARGIN_S={aws.plan_checkpoint_margin_s})",
            file=sys.stderr,
        )
        return
    problems = launch_problems(plan, aws, asset, params, now)
    if problems:
        raise ValueError(f"{params['TrainingJobName']} would not be launched: " + "; ".join(problems))
