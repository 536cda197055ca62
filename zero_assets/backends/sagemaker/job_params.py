"""Turn a `JobRequest` into the exact CreateTrainingJob / CreateProcessingJob parameters: pure (no AWS calls),
so `render-jobs` writes what the runner sends; SageMaker's limits are checked here, naming the entry at fault.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Optional

from training_code.lib.job_env import input_uri_variable
from training_code.lib.wandb_run import SECRET_ARN_VARIABLE
from zero_assets.backends.sagemaker.code_package import CodePackage
from zero_assets.backends.sagemaker.job_api import job_tags
from zero_assets.backends.sagemaker.settings import (
    REHEARSAL_ASSET,
    TRAINING_ASSET,
    TRAINING_PLAN_VARIABLE,
    SageMakerSettings,
    compute_variable,
)
from zero_assets.backends.sagemaker.training_plan import TrainingPlan, bounded_runtime, plan_name, utc_now
from zero_assets.backends.sagemaker.training_set_channel import (
    FILE_LIST,
    is_fsx,
    parse_fsx_uri,
    s3_behind_fsx,
    split_training_set,
)
from zero_assets.backends.sagemaker.work_sizing import request_instance_type, request_volume_gb
from zero_assets.core.job_request import JobRequest

OPERATIONS = {"training": "CreateTrainingJob", "processing": "CreateProcessingJob"}
# SageMaker's limits on Environment: entries, key and value lengths (Training, Processing).
ENV_LIMITS = {"training": (100, 512, 512), "processing": (100, 256, 256)}
PROCESSING_ROOT = "/opt/ml/processing"
CODE_INPUT = "code"
CHECKPOINT_LOCAL = "/opt/ml/checkpoints"
TRAINING_SET_ARGUMENT = "training-set"  # the training set's folder inside the input that holds it
# Never in a request: Environment is visible to anyone who may describe the job.
FORBIDDEN_ENVIRONMENT = ("WANDB_API_KEY",)
MAX_KEEP_ALIVE_S = 21600  # botocore's bound on ResourceConfig.KeepAlivePeriodInSeconds


def build_job_params(
    request: JobRequest,
    settings: SageMakerSettings,
    *,
    job_name: str,
    code: CodePackage,
    environment: dict[str, str],
    lake_uri: str | None = None,
    training_plan: Optional[TrainingPlan] = None,
    now: Optional[datetime] = None,
) -> tuple[str, dict[str, Any]]:
    """(operation, parameters) for one job; `environment`: the Pipes bootstrap variables."""
    lake = lake_uri or settings.lake_uri()
    if request.kind == "training":
        params = _training_params(request, settings, job_name, code, environment)
        _on_plan_or_warm_pool(params, request, settings, training_plan, now or utc_now())
    else:
        params = _processing_params(request, settings, job_name, code, environment, lake)
    params["Tags"] = job_tags(request, settings.tags)
    if settings.wandb_secret_arn and "wandb_mode" in request.arguments:  # a job that tracks to W&B
        # Only the secret's ARN travels; the job reads the key itself.
        params["Environment"][SECRET_ARN_VARIABLE] = settings.wandb_secret_arn
    check_environment(params["Environment"], request.kind)
    return OPERATIONS[request.kind], params


def check_environment(environment: dict[str, str], kind: str) -> None:
    entries, key_max, value_max = ENV_LIMITS[kind]
    leaked = [name for name in FORBIDDEN_ENVIRONMENT if name in environment]
    if leaked:
        raise ValueError(
            f"{kind} job environment holds {leaked}: a key in Environment is readable by whoever may describe the job; "
            f"store it in Secrets Manager and set ZERO_SM_WANDB_SECRET_ARN instead"
        )
    if len(environment) > entries:
        raise ValueError(f"{kind} job environment has {len(environment)} entries; SageMaker allows {entries}")
    for key, value in environment.items():
        if len(key) > key_max or len(value) > value_max:
            raise ValueError(
                f"{kind} job environment entry {key!r} is {len(value)} characters; SageMaker allows {value_max} "
                f"(keys {key_max}). Pass large values through S3 (Pipes context) or as arguments instead."
            )


def _training_params(
    request: JobRequest, settings: SageMakerSettings, job_name: str, code: CodePackage, env: dict
) -> dict:
    compute = settings.compute(request.asset)
    root = settings.s3_root()
    # A training set's channel is the shard root; the job is told the set's folder in it.
    training_sets = {name: found for name, uri in request.inputs.items() if (found := split_training_set(uri))}
    if len(training_sets) > 1:
        raise ValueError(
            f"{request.asset} has {len(training_sets)} training-set inputs ({sorted(training_sets)}); a job reads one"
        )
    # Each channel's source, at the same paths (the job names it in W&B references).
    sources = {name: training_sets[name].root if name in training_sets else uri for name, uri in request.inputs.items()}
    channels = [_training_channel(name, source, settings, request.fsx_access) for name, source in sources.items()]
    input_mode = "File" if any("FileSystemDataSource" in c["DataSource"] for c in channels) else "FastFile"
    hyperparameters = {key.replace("_", "-"): str(value) for key, value in request.arguments.items()}
    for found in training_sets.values():  # at most one: the training set a job reads
        hyperparameters[TRAINING_SET_ARGUMENT] = found.folder
    hyperparameters.update(
        {
            # Read by the PyTorch container's toolkit, which fetches the code and runs the program.
            "sagemaker_program": module_path(request.module),
            "sagemaker_submit_directory": code.tarball_uri(root),
            "sagemaker_region": settings.region,
            "sagemaker_container_log_level": "20",
        }
    )
    if request.launcher == "torchrun":
        hyperparameters["sagemaker_torch_distributed_enabled"] = "true"
    params: dict[str, Any] = {
        "TrainingJobName": job_name,
        "RoleArn": settings.role_arn,
        "AlgorithmSpecification": {"TrainingImage": settings.training_image_uri, "TrainingInputMode": input_mode},
        "HyperParameters": hyperparameters,
        "OutputDataConfig": _with_kms({"S3OutputPath": training_output_path(settings)}, settings),
        "ResourceConfig": _with_kms(
            {
                "InstanceType": compute.instance_type,
                "InstanceCount": compute.instance_count,
                "VolumeSizeInGB": compute.volume_size_gb,
            },
            settings,
            "VolumeKmsKeyId",
        ),
        "StoppingCondition": {"MaxRuntimeInSeconds": compute.max_runtime_s},
        # A prefix, so another fingerprint's folder is never synced down.
        "CheckpointConfig": {
            "S3Uri": as_prefix(settings.checkpoint_uri(request.asset, request.fingerprint)),
            "LocalPath": CHECKPOINT_LOCAL,
        },
        "Environment": {**env, **_job_env(job_name, request, sources), "PYTHONPATH": "/opt/ml/code"},
    }
    if channels:  # SageMaker rejects an empty list
        params["InputDataConfig"] = channels
    if settings.use_spot:
        params["EnableManagedSpotTraining"] = True
        params["StoppingCondition"]["MaxWaitTimeInSeconds"] = max(settings.max_wait_s, compute.max_runtime_s)
    vpc = settings.vpc_config()
    if vpc:
        params["VpcConfig"] = vpc
    return params


def _on_plan_or_warm_pool(
    params: dict, request: JobRequest, settings: SageMakerSettings, plan: Optional[TrainingPlan], now: datetime
) -> None:
    """Put the training job on its Training Plan (runtime bounded by its end), or on a warm pool."""
    compute = settings.compute(request.asset)
    resources = params["ResourceConfig"]
    if compute.training_plan_arn:
        plan_name(compute.training_plan_arn)  # a malformed ARN fails here, naming the variable
        if settings.use_spot:
            raise ValueError(
                f"{TRAINING_PLAN_VARIABLE} and ZERO_SM_USE_SPOT are both set: a Training Plan's reserved "
                "instances are not spot capacity; unset one"
            )
        resources["TrainingPlanArn"] = compute.training_plan_arn
        if plan is not None:
            if plan.arn != compute.training_plan_arn:
                raise ValueError(f"{request.asset} runs on {compute.training_plan_arn}, not on the plan {plan.arn}")
            params["StoppingCondition"]["MaxRuntimeInSeconds"] = bounded_runtime(
                plan, compute.max_runtime_s, settings.plan_checkpoint_margin_s, now
            )
    elif settings.warm_pool_keep_alive_s and request.asset in (TRAINING_ASSET, REHEARSAL_ASSET):
        if settings.use_spot:
            raise ValueError(
                "ZERO_SM_WARM_POOL_KEEP_ALIVE_S and ZERO_SM_USE_SPOT are both set: SageMaker keeps no warm pool "
                "of managed spot instances; unset one"
            )
        if settings.warm_pool_keep_alive_s > MAX_KEEP_ALIVE_S:
            raise ValueError(
                f"ZERO_SM_WARM_POOL_KEEP_ALIVE_S={settings.warm_pool_keep_alive_s}: SageMaker keeps a warm pool "
                f"for at most {MAX_KEEP_ALIVE_S} s"
            )
        resources["KeepAlivePeriodInSeconds"] = settings.warm_pool_keep_alive_s
    if settings.infra_check and compute.instance_count > 1:
        # A bad node then fails the job in minutes, not as a hung all-reduce hours in.
        params["InfraCheckConfig"] = {"EnableInfraCheck": True}


def _training_channel(name: str, uri: str, settings: SageMakerSettings, access: str) -> dict:
    if is_fsx(uri):
        location = parse_fsx_uri(uri)
        if settings.vpc_config() is None:
            raise ValueError(
                f"input {name!r} is on FSx ({uri}); FSx needs ZERO_SM_SUBNETS and ZERO_SM_SECURITY_GROUP_IDS"
            )
        source = {
            "FileSystemDataSource": {
                "FileSystemId": location.file_system_id,
                "FileSystemAccessMode": access,
                "FileSystemType": "FSxLustre",
                "DirectoryPath": location.directory_path,
            }
        }
        return {"ChannelName": name, "DataSource": source, "InputMode": "File"}
    _require_s3(name, uri)
    source = {
        "S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": as_prefix(uri), "S3DataDistributionType": "FullyReplicated"}
    }
    return {"ChannelName": name, "DataSource": source, "InputMode": "FastFile"}


def _processing_params(
    request: JobRequest, settings: SageMakerSettings, job_name: str, code: CodePackage, env: dict, lake: str
) -> dict:
    compute = settings.compute(request.asset)
    if compute.instance_count > 1 and request.reads is None:
        # Every instance would process the whole input and upload to the same output prefix.
        raise ValueError(
            f"{request.asset}: {compute_variable(request.asset, 'instance_count')}={compute.instance_count}, "
            "but its job splits no work across instances; set it to 1"
        )
    if CODE_INPUT in request.inputs:
        raise ValueError(
            f"input name {CODE_INPUT!r} of {request.asset} is reserved for the code package; rename the input"
        )
    inputs = [_processing_input(CODE_INPUT, code.files_uri(settings.s3_root()))]
    io_arguments: list[str] = []
    sources: dict[str, str] = {}  # what each input's folder holds, at the same paths
    for name, uri in request.inputs.items():
        s3_uri = s3_behind_fsx(uri, lake) if is_fsx(uri) else uri
        _require_s3(name, s3_uri)
        found = split_training_set(s3_uri)
        if found is not None:  # exactly the training set's files, at their paths below the shard root
            inputs.append(_processing_input(name, f"{found.uri}/{FILE_LIST}", "ManifestFile"))
            io_arguments += [f"--{name}", f"{PROCESSING_ROOT}/input/{name}", f"--{TRAINING_SET_ARGUMENT}", found.folder]
            sources[name] = found.root
            continue
        inputs.append(_processing_input(name, s3_uri))
        sources[name] = s3_uri
        io_arguments += [f"--{name}", f"{PROCESSING_ROOT}/input/{name}"]
    outputs = []
    for name, uri in request.outputs.items():
        _require_s3(name, uri)
        local = f"{PROCESSING_ROOT}/output/{name}"
        outputs.append({"OutputName": name, "S3Output": {"S3Uri": uri, "LocalPath": local, "S3UploadMode": "EndOfJob"}})
        io_arguments += [f"--{name}", local]
    arguments = io_arguments + request.argument_list()
    too_long = [a for a in arguments if len(a) > 256]
    if too_long:
        raise ValueError(
            f"container arguments longer than SageMaker's 256 characters: {[a[:40] + '...' for a in too_long]}"
        )
    params: dict[str, Any] = {
        "ProcessingJobName": job_name,
        "RoleArn": settings.role_arn,
        "AppSpecification": {
            "ImageUri": settings.processing_image_uri,
            "ContainerEntrypoint": ["python3", "-m", request.module],
            "ContainerArguments": arguments,
        },
        "ProcessingInputs": inputs,
        "ProcessingOutputConfig": _with_kms({"Outputs": outputs}, settings),
        "ProcessingResources": {
            "ClusterConfig": _with_kms(
                {
                    "InstanceCount": request.instance_count,  # planned (see job_request.spread_over)
                    "InstanceType": request_instance_type(request, compute),
                    "VolumeSizeInGB": request_volume_gb(request, compute),
                },
                settings,
                "VolumeKmsKeyId",
            )
        },
        "StoppingCondition": {"MaxRuntimeInSeconds": compute.max_runtime_s},
        "Environment": {
            **env,
            **_job_env(job_name, request, sources),
            "PYTHONPATH": f"{PROCESSING_ROOT}/input/{CODE_INPUT}",
        },
    }
    vpc = settings.vpc_config()
    if vpc:
        params["NetworkConfig"] = {"VpcConfig": vpc}
    return params


def _job_env(job_name: str, request: JobRequest, sources: dict[str, str]) -> dict[str, str]:
    """The job's name, asset and each input's source, as `job_env` reads them."""
    return {
        "ZERO_JOB_NAME": job_name,
        "ZERO_ASSET": request.asset,
        **{input_uri_variable(n): s for n, s in sources.items()},
    }


def training_output_path(settings: SageMakerSettings) -> str:
    """A training job's OutputDataConfig: SageMaker writes `<this><job name>/output/model.tar.gz`."""
    return f"{settings.s3_root()}/jobs/"


def model_artifact_uri(settings: SageMakerSettings, job_name: str) -> str:
    return f"{training_output_path(settings)}{job_name}/output/model.tar.gz"


def as_prefix(uri: str) -> str:
    """`uri` with a trailing `/`: SageMaker matches keys by plain prefix, so `s3://b/raw` would pull `raw-old/`."""
    return uri.rstrip("/") + "/"


def _processing_input(name: str, uri: str, data_type: str = "S3Prefix") -> dict:
    """One ProcessingInput on every instance: the objects under prefix `uri`, or with `ManifestFile` those it names."""
    return {
        "InputName": name,
        "S3Input": {
            "S3Uri": as_prefix(uri) if data_type == "S3Prefix" else uri,
            "LocalPath": f"{PROCESSING_ROOT}/input/{name}",
            "S3DataType": data_type,
            "S3InputMode": "File",
            "S3DataDistributionType": "FullyReplicated",
        },
    }


def module_path(module: str) -> str:
    return module.replace(".", "/") + ".py"


def _require_s3(name: str, uri: str) -> None:
    if not uri.startswith("s3://"):
        raise ValueError(
            f"job input/output {name!r} is {uri!r}; SageMaker jobs read and write s3:// URIs "
            "(set ZERO_LAKE_URI/ZERO_RAW_URI to S3)"
        )


def _with_kms(config: dict, settings: SageMakerSettings, key: str = "KmsKeyId") -> dict:
    return {**config, key: settings.kms_key_id} if settings.kms_key_id else config
