"""`render-jobs`: every request the graph would send to AWS for the current configuration, without sending it.

With an instance lookup, fingerprints use the latest upstream data versions; otherwise stand-in versions give
the right shapes. Per-source jobs are rendered for one source. Makes no AWS call.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any, Optional

import pyarrow as pa
from dagster import Config, DagsterInstance

from training_code.lib.hashing import sha256_json
from training_code.lib.read_list import ReadList, read_list_of
from training_code.lib.storage import join
from zero_assets.backends.sagemaker.code_package import build_code_package
from zero_assets.backends.sagemaker.fsx_warm import (
    association_params,
    import_task_params,
    new_to_file_system,
    warm_job_request,
)
from zero_assets.backends.sagemaker.job_params import build_job_params
from zero_assets.backends.sagemaker.pipes_io import bootstrap_environment
from zero_assets.backends.sagemaker.runner import SageMakerJobRunner
from zero_assets.backends.sagemaker.settings import TRAINING_ASSET, SageMakerSettings
from zero_assets.backends.sagemaker.training_plan import TrainingPlan, launch_problems, plan_name, utc_now
from zero_assets.backends.sagemaker.training_set_channel import channel_shards, channel_training_set, shards_on_fsx
from zero_assets.backends.sagemaker.tuning import OPERATION as TUNING_OPERATION
from zero_assets.backends.sagemaker.tuning import tuning_params
from zero_assets.backends.sagemaker.work_sizing import instances_for, read_list_uri
from zero_assets.core.fingerprints import FingerprintInputs, UpstreamOutput
from zero_assets.core.job_request import FanOut, JobRequest, TableScan, build_job_request, job_name, spread_over
from zero_assets.core.settings import ZeroSettings, source_uri
from zero_assets.defs.assets import ALL_ASSETS
from zero_assets.defs.assets.arrow_shards import PACKING_SPREAD, ShardConfig, packing_job
from zero_assets.defs.assets.fsx_warm_state import warm_inputs, warm_lease
from zero_assets.defs.assets.map_report import EvalConfig, evaluation_job
from zero_assets.defs.assets.trained_checkpoint import TrainConfig, training_job
from zero_assets.defs.assets.training_set import SELECT_MODULE, TrainingSetConfig, selection_job
from zero_assets.defs.assets.tuned_hyperparameters import TuningConfig, tuning_request
from zero_assets.defs.assets.validated_images import VALIDATION_SPREAD, ValidationConfig, validation_job
from zero_assets.launch.upstream import latest_materializations, output_of

Lookup = Callable[[str, Optional[str]], Optional[UpstreamOutput]]  # (asset, source) -> its latest output
EXAMPLE_SOURCE = "example_source"
JOB_CONFIGS = {
    "validated_images": ValidationConfig,
    "training_set": TrainingSetConfig,
    "arrow_shards": ShardConfig,
    "trained_checkpoint": TrainConfig,
    "map_report": EvalConfig,
    "tuned_hyperparameters": TuningConfig,
}


def job_configs(run_config: Mapping[str, Any]) -> dict[str, Config]:
    """The config of each rendered asset's job as `run_config` (Dagster's `{"ops": ...}` shape) gives it."""
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
    read_lists: dict[str, ReadList] | None = None,
) -> list[tuple[str, str, str, dict[str, Any]]]:
    """(label, service, operation, parameters) for every AWS call that launches work, in graph order.

    Labels are assets, with `-map` / `-reduce` for fanned-out jobs. `training_plan`: as read at `now`.
    `read_lists` receives the read lists, planned as the runner plans them (nothing is written)."""
    configs = job_configs(run_config or {})
    now = now or utc_now()
    code = build_code_package(requirements=not aws.images_hold_requirements)
    rendered: list[tuple[str, str, str, dict[str, Any]]] = []

    def upstream(asset: str, partition: str | None = None) -> UpstreamOutput:
        found = lookup(asset, partition)
        return found or UpstreamOutput(
            asset, settings.asset_uri(asset, sha256_json(asset)[:16], partition), f"unmaterialized-{asset}", partition
        )

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
            described = {"TrainingPlanName": plan_name(params["ResourceConfig"]["TrainingPlanArn"])}
            rendered.append((request.label, "sagemaker", "DescribeTrainingPlan", described))
            _check_or_note(plan, request.asset, params, aws, now)
        rendered.append((request.label, "sagemaker", operation, params))

    def planned(request: JobRequest, spread: FanOut, raw_uri: str, upstream_known: bool) -> None:
        found = _planned_or_empty(spread, request, raw_uri, upstream_known)
        if read_lists is not None:
            read_lists[request.asset] = found
        mapped, final = spread_over(
            request,
            replace(spread, plan=lambda inputs, arguments: found),
            lambda staged, work: instances_for(staged.asset, aws.compute(staged.asset), work),
            read_list_uri(aws, request),
            write=False,
        )
        for staged in (mapped, final):
            if staged is not None:
                add(staged)

    raw_uri = source_uri(settings, source)
    index = upstream("raw_image_index", source)
    earlier_set = lookup("validated_images", source)  # its `previous`, unchecked (no AWS call here)
    validation = build_job_request(
        "validated_images",
        settings=settings,
        partition=source,
        **validation_job(configs["validated_images"], source, index, earlier_set.uri if earlier_set else None),
    )
    planned(validation, VALIDATION_SPREAD, raw_uri, lookup("raw_image_index", source) is not None)
    # Its rows come from materialization metadata the runner reads; unknown here, so the smallest instance.
    validated = upstream("validated_images", source)
    fingerprinted, _, _ = selection_job(configs["training_set"], [validated], settings.raw_uri)
    selecting = build_job_request(
        "training_set",
        settings=settings,
        kind="processing",
        module=SELECT_MODULE,
        config=fingerprinted,
        arguments={},
        tracking=configs["training_set"].tracking(),
        upstream=[validated],
        inputs={},
        scan=TableScan(0, 0),
    )
    add(replace(selecting, inputs={"plan": read_list_uri(aws, selecting)}))
    selection = upstream("training_set")
    earlier = lookup("arrow_shards", None)  # the shard set whose shards it keeps
    kept = (earlier.uri, earlier.uri.rstrip("/").rpartition("/")[2]) if earlier else None
    packing = build_job_request(
        "arrow_shards", settings=settings, **packing_job(configs["arrow_shards"], selection, settings, kept)
    )
    planned(packing, PACKING_SPREAD, settings.raw_uri, lookup("training_set", None) is not None)
    shards = upstream("arrow_shards")
    # The jobs read the shard root; the set's folder there is named by its data version.
    channel = channel_training_set(settings.lake_uri, shards.data_version)
    warm_uri = channel.uri
    if aws.fsx_enabled():
        fs_id, mount = aws.fsx_file_system_id, aws.fsx_mount_name
        location = shards_on_fsx(warm_uri, settings.lake_uri, fs_id, mount)
        # The set's folder and the shards new to the file system (only the folder with stand-ins).
        new = (
            new_to_file_system(channel, channel_shards(shards.uri, channel.root)[1], fs_id)
            if lookup("arrow_shards", None)
            else []
        )
        paths = [location.path] + [
            shards_on_fsx(join(channel.root, key), settings.lake_uri, fs_id, mount).path for key in new
        ]
        rendered.append(
            ("fsx_warm_state", "fsx", "CreateDataRepositoryAssociation", association_params(fs_id, settings.lake_uri))
        )
        rendered.append(("fsx_warm_state", "fsx", "CreateDataRepositoryTask", import_task_params(fs_id, paths)))

        lease = warm_lease(settings, warm_inputs(SageMakerJobRunner.__name__, shards), location.uri)
        add(warm_job_request(shards, location, settings, lease))
        warm_uri = location.uri
    warm = UpstreamOutput("fsx_warm_state", warm_uri, shards.data_version)
    search, spec, _ = tuning_request(settings, configs["tuned_hyperparameters"], warm)
    tuning = tuning_params(search, aws, settings.lake_uri, spec, code, None)
    rendered.append(("tuned_hyperparameters", "sagemaker", TUNING_OPERATION, tuning))
    train, hyperparameters = configs["trained_checkpoint"], configs["trained_checkpoint"].hyperparameters()
    tracking = train.tracking(FingerprintInputs.of(train.module, hyperparameters, [warm]).fingerprint)
    trained = training_job(train, hyperparameters, tracking, [warm])
    add(build_job_request("trained_checkpoint", settings=settings, **trained))
    checkpoint = upstream("trained_checkpoint")
    add(build_job_request("map_report", settings=settings, **evaluation_job(configs["map_report"], checkpoint, warm)))
    return rendered


def _planned_or_empty(spread: FanOut, request: JobRequest, raw_uri: str, upstream_known: bool) -> ReadList:
    """The read list the runner would plan for `request`; empty, noted on stderr, for stand-in upstreams."""
    if upstream_known:
        return spread.plan(request.inputs, request.arguments)
    print(
        f"render-jobs: {request.asset}: its upstream outputs are stand-ins, so its read list (what its job fetches "
        "by key) is rendered empty; --from-instance plans it from the latest upstream outputs, as the runner "
        "does at launch",
        file=sys.stderr,
    )
    empty = pa.schema([("key", pa.string()), ("size", pa.int64()), ("etag", pa.string())]).empty_table()
    return read_list_of(raw_uri, empty, 0)


def _check_or_note(
    plan: TrainingPlan | None, asset: str, params: dict[str, Any], aws: SageMakerSettings, now: datetime
) -> None:
    """Refuse what the runner would refuse with the plan; without it, note on stderr what the runner will do."""
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
