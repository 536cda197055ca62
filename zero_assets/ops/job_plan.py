"""`render-jobs`: every request the graph would send to AWS for the current configuration, without sending it.

Fingerprints use the upstream data versions of the latest materializations when a lookup is given
(the Dagster instance); otherwise a stand-in version per asset, so the names and prefixes have the
right shape but the fingerprint parts differ from a real run. The per-source jobs are rendered for
one source (`source`): each gets only that source's raw folder, its output under `<asset>/<source>/`.
The training set's jobs read the shard root holding every chosen source's shard sets, told the
training set's folder there (`--training-set`), so their requests do not depend on how many sources.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional

from training_code.lib.hashing import sha256_json
from zero_assets.backends.sagemaker.code_package import build_code_package
from zero_assets.backends.sagemaker.fsx import shards_on_fsx
from zero_assets.backends.sagemaker.fsx_warm import association_params, import_task_params, warm_job_request
from zero_assets.backends.sagemaker.job_params import build_job_params
from zero_assets.backends.sagemaker.names import job_name
from zero_assets.backends.sagemaker.pipes_io import bootstrap_environment
from zero_assets.backends.sagemaker.settings import SageMakerSettings
from zero_assets.backends.sagemaker.training_set_channel import channel_training_set
from zero_assets.core.fingerprints import FingerprintInputs, UpstreamOutput
from zero_assets.core.job_request import JobRequest, build_job_request, fan_out
from zero_assets.core.settings import ZeroSettings, source_uri
from zero_assets.defs.assets.arrow_shards import ShardConfig
from zero_assets.defs.assets.map_report import EvalConfig
from zero_assets.defs.assets.trained_checkpoint import TrainConfig
from zero_assets.defs.assets.validated_images import VALIDATION_SPREAD, ValidationConfig

Lookup = Callable[[str], Optional[UpstreamOutput]]


EXAMPLE_SOURCE = "example_source"


def render_jobs(
    settings: ZeroSettings, aws: SageMakerSettings, lookup: Lookup = lambda asset: None, source: str = EXAMPLE_SOURCE
) -> list[tuple[str, str, str, dict[str, Any]]]:
    """(label, service, operation, parameters) for every AWS call that launches work, in graph order; the
    label is the asset, with `-map` / `-reduce` for the two jobs of a validation spread over instances."""
    code = build_code_package()
    rendered: list[tuple[str, str, str, dict[str, Any]]] = []

    def upstream(asset: str, partition: str | None = None) -> UpstreamOutput:
        found = lookup(asset)
        return found or UpstreamOutput(
            asset, settings.asset_uri(asset, sha256_json(asset)[:16], partition), f"unmaterialized-{asset}", partition
        )

    def add(request: JobRequest) -> None:
        name = job_name(request.label, request.fingerprint, 1)
        environment = bootstrap_environment(f"{aws.s3_root()}/pipes", name, aws.messages)
        operation, params = build_job_params(
            request, aws, job_name=name, code=code, environment=environment, lake_uri=settings.lake_uri
        )
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
        config=ValidationConfig().model_dump(),
        upstream=[index],
        partition=source,
        inputs={"index": index.uri, "raw": raw_uri},
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
            config=ShardConfig().model_dump(),
            upstream=[validated],
            inputs={"validated": validated.uri, "raw": raw_uri},
            input_folders=raw_folders,
        )
    )
    shards = upstream("arrow_shards", source)
    # The training set's jobs read the shard root, whatever the number of sources; its folder there is named by its data version.
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
    train = TrainConfig()
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
    evaluation = EvalConfig()
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
