"""Where and how SageMaker jobs run (account, images, compute per job, network, encryption, tags), and
the run profiles (`ZERO_PROFILE`). Each field binds to its `ZERO_SM_*` variable; no credentials (boto3 finds them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Optional

from dagster import Config, ConfigurableResource

from zero_assets.core.settings import SAGEMAKER_VARIABLES, env_bindings, zero_env


class JobCompute(Config):
    """Instances of one job, spread by a read list or a table scan (see `work_sizing`)."""

    instance_type: str
    instance_count: int = 1
    volume_size_gb: int = 100
    max_runtime_s: int = 24 * 3600
    max_instance_count: int = 16
    images_per_instance: Optional[int] = None
    bytes_per_instance: Optional[int] = None
    memory_bytes_per_row: Optional[int] = None
    # Training jobs: the Training Plan that runs the job. Part of the compute, so a profile with its own
    # compute (rehearsal) runs off the plan.
    training_plan_arn: Optional[str] = None


DEFAULT_COMPUTE = {
    # Sized so each instance decodes its share in about a quarter of an hour.
    "validated_images": JobCompute(instance_type="ml.c5.4xlarge", volume_size_gb=30, images_per_instance=250_000),
    # DuckDB over the validated tables: in memory to ~100 bytes a row, spilling past it.
    "training_set": JobCompute(
        instance_type="ml.r5.large", volume_size_gb=30, memory_bytes_per_row=100, max_runtime_s=6 * 3600
    ),
    # A pack is I/O bound: ~100 GB an instance keeps each under an hour.
    "arrow_shards": JobCompute(instance_type="ml.c5.4xlarge", volume_size_gb=30, bytes_per_instance=100 * 10**9),
    "fsx_warm_state": JobCompute(instance_type="ml.m5.xlarge", volume_size_gb=30, max_runtime_s=6 * 3600),
    "trained_checkpoint": JobCompute(
        instance_type="ml.p4d.24xlarge", instance_count=2, volume_size_gb=200, max_runtime_s=5 * 24 * 3600
    ),
    "map_report": JobCompute(instance_type="ml.g5.2xlarge", volume_size_gb=100, max_runtime_s=6 * 3600),
    # Each trial of a tuning.
    "tuned_hyperparameters": JobCompute(instance_type="ml.g5.2xlarge", volume_size_gb=100, max_runtime_s=6 * 3600),
    # Cheap GPUs, two nodes: the rehearsal proves the multi-node start.
    "training_rehearsal": JobCompute(
        instance_type="ml.g4dn.xlarge", instance_count=2, volume_size_gb=50, max_runtime_s=2 * 3600
    ),
    "rehearsal_evaluation": JobCompute(instance_type="ml.g4dn.xlarge", volume_size_gb=50, max_runtime_s=3600),
}
# Assets whose materialization launches a SageMaker job, in graph order, then the rehearsal's two jobs.
JOB_ASSETS = tuple(DEFAULT_COMPUTE)


DEFAULT_PREFIX = "zero"
# The training a Training Plan and a warm pool are for (the warm job, also a Training job, uses neither).
TRAINING_ASSET = "trained_checkpoint"
# The rehearsal's training, whose attempts reuse a warm pool when one is kept.
REHEARSAL_ASSET = "training_rehearsal"
TRAINING_PLAN_VARIABLE = "ZERO_SM_TRAINING_PLAN_ARN"
IMAGES_VARIABLE = "ZERO_SM_IMAGES_HOLD_REQUIREMENTS"
# Per-job whole numbers, each set by ZERO_SM_<ASSET>_<FIELD> (see JobCompute).
WHOLE_NUMBERS = (
    "instance_count",
    "max_instance_count",
    "images_per_instance",
    "bytes_per_instance",
    "memory_bytes_per_row",
    "volume_size_gb",
)
WHOLE_SECONDS = ("plan_checkpoint_margin_s", "plan_min_time_left_s", "warm_pool_keep_alive_s", "orphaned_job_grace_s")


def bucket_root(bucket: str, prefix: str) -> str:
    """`s3://<bucket>/<prefix>`, or the bucket itself when the prefix is empty."""
    return f"s3://{bucket}/{prefix.strip('/')}" if prefix.strip("/") else f"s3://{bucket}"


class SageMakerSettings(ConfigurableResource):
    """AWS settings of the SageMaker backend."""

    region: str
    role_arn: str  # the execution role the jobs run as
    bucket: str  # lake, code packages, Pipes messages and checkpoints live under s3://<bucket>/<prefix>/
    prefix: str = DEFAULT_PREFIX
    training_image_uri: str  # a PyTorch Deep Learning Container (its toolkit launches torchrun)
    processing_image_uri: str  # any image with python3 and requirements.txt of the code package installed
    validated_images: JobCompute = DEFAULT_COMPUTE["validated_images"]
    training_set: JobCompute = DEFAULT_COMPUTE["training_set"]
    arrow_shards: JobCompute = DEFAULT_COMPUTE["arrow_shards"]
    fsx_warm_state: JobCompute = DEFAULT_COMPUTE["fsx_warm_state"]
    trained_checkpoint: JobCompute = DEFAULT_COMPUTE["trained_checkpoint"]
    map_report: JobCompute = DEFAULT_COMPUTE["map_report"]
    tuned_hyperparameters: JobCompute = DEFAULT_COMPUTE["tuned_hyperparameters"]
    training_rehearsal: JobCompute = DEFAULT_COMPUTE["training_rehearsal"]
    rehearsal_evaluation: JobCompute = DEFAULT_COMPUTE["rehearsal_evaluation"]
    use_spot: bool = False  # managed spot for Training jobs
    max_wait_s: int = 6 * 24 * 3600  # spot: runtime plus time spent waiting for capacity
    subnets: list[str] = []
    security_group_ids: list[str] = []
    kms_key_id: Optional[str] = None  # encrypts outputs and volumes
    tags: dict[str, str] = {}
    fsx_file_system_id: Optional[str] = None  # set: training reads shards from FSx for Lustre
    fsx_mount_name: Optional[str] = None  # the file system's MountName (from DescribeFileSystems)
    messages: Literal["s3", "cloudwatch"] = "s3"  # where job scripts write Pipes messages
    # A Secrets Manager secret with the W&B API key; jobs get only its ARN, so the key is never in a request.
    wandb_secret_arn: Optional[str] = None
    poll_interval_s: float = 15.0
    # A job on a Training Plan stops this long before the plan ends, to upload its last checkpoint.
    plan_checkpoint_margin_s: int = 1800
    plan_min_time_left_s: int = 3600  # a plan with less time left than this is refused before launch
    # Warm pool (KeepAlivePeriodInSeconds) for Training jobs off a plan, so the next one skips provisioning. 0: none.
    warm_pool_keep_alive_s: int = 0
    infra_check: bool = True  # SageMaker's instance and network health check before multi-node training
    # The images already hold requirements.lock: the code package carries no requirements.txt, so no pip at start.
    images_hold_requirements: bool = False
    # A job whose lease no live run has held this long is stopped (defs/orphaned_jobs); longer than step retries.
    orphaned_job_grace_s: int = 600

    def compute(self, asset: str) -> JobCompute:
        if asset not in JOB_ASSETS:
            raise KeyError(f"{asset!r} launches no SageMaker job; jobs run for {JOB_ASSETS}")
        return getattr(self, asset)

    def s3_root(self) -> str:
        return bucket_root(self.bucket, self.prefix)

    def lake_uri(self) -> str:
        return f"{self.s3_root()}/lake"

    def checkpoint_uri(self, asset: str, fingerprint: str) -> str:
        """Where every attempt of a materialization checkpoints and resumes from."""
        return f"{self.s3_root()}/checkpoints/{asset}/{fingerprint[:16]}"

    def fsx_enabled(self) -> bool:
        if bool(self.fsx_file_system_id) != bool(self.fsx_mount_name):
            raise ValueError("set both ZERO_SM_FSX_FILE_SYSTEM_ID and ZERO_SM_FSX_MOUNT_NAME, or neither")
        if self.fsx_file_system_id and not (self.subnets and self.security_group_ids):
            raise ValueError(
                "FSx for Lustre needs the jobs in the file system's VPC: "
                "set ZERO_SM_SUBNETS and ZERO_SM_SECURITY_GROUP_IDS"
            )
        return bool(self.fsx_file_system_id)

    def vpc_config(self) -> Optional[dict]:
        if not self.subnets and not self.security_group_ids:
            return None
        if not (self.subnets and self.security_group_ids):
            raise ValueError("VPC settings need both ZERO_SM_SUBNETS and ZERO_SM_SECURITY_GROUP_IDS")
        return {"Subnets": list(self.subnets), "SecurityGroupIds": list(self.security_group_ids)}


REQUIRED = ("region", "role_arn", "bucket", "training_image_uri", "processing_image_uri")


def sagemaker_settings_from_env(environ: Optional[Mapping[str, str]] = None, **overrides) -> SageMakerSettings:
    """Settings from `ZERO_SM_*` (with `environ`, its values); fails naming every missing required variable."""
    missing = [
        SAGEMAKER_VARIABLES[f] for f in REQUIRED if not zero_env(SAGEMAKER_VARIABLES[f], environ) and f not in overrides
    ]
    if missing:
        raise ValueError(f"ZERO_BACKEND=sagemaker needs {', '.join(missing)} (see docs/sagemaker.md)")
    fields = {**env_bindings(SAGEMAKER_VARIABLES, environ), **_parsed_fields(environ)}
    return SageMakerSettings(**{**fields, **overrides})


def s3_root_from_env(environ: Optional[Mapping[str, str]] = None) -> str:
    """The `s3_root()` of the settings `sagemaker_settings_from_env` builds, read before Dagster resolves them."""
    bucket = zero_env(SAGEMAKER_VARIABLES["bucket"], environ)
    return bucket_root(bucket, zero_env(SAGEMAKER_VARIABLES["prefix"], environ) or DEFAULT_PREFIX)


def _parsed_fields(environ: Optional[Mapping[str, str]]) -> dict:
    def env(name: str) -> str:
        return zero_env(name, environ)

    fields: dict = {}
    for field, var in (("subnets", "ZERO_SM_SUBNETS"), ("security_group_ids", "ZERO_SM_SECURITY_GROUP_IDS")):
        if env(var):
            fields[field] = [item.strip() for item in env(var).split(",") if item.strip()]
    if env("ZERO_SM_USE_SPOT"):
        fields["use_spot"] = env("ZERO_SM_USE_SPOT").lower() in ("1", "true", "yes")
    if env("ZERO_SM_POLL_INTERVAL_S"):
        fields["poll_interval_s"] = _seconds("ZERO_SM_POLL_INTERVAL_S", env("ZERO_SM_POLL_INTERVAL_S"))
    for field in WHOLE_SECONDS:
        var = f"ZERO_SM_{field.upper()}"
        if env(var):
            if not env(var).isdigit():
                raise ValueError(f"{var}={env(var)!r} is not a whole number of seconds (0 or more)")
            fields[field] = int(env(var))
    for field, var in (("infra_check", "ZERO_SM_INFRA_CHECK"), ("images_hold_requirements", IMAGES_VARIABLE)):
        if env(var):
            fields[field] = _flag(var, env(var))
    if env("ZERO_SM_TAGS"):
        pairs = [item.split("=", 1) for item in env("ZERO_SM_TAGS").split(",") if item.strip()]
        bad = [p[0] for p in pairs if len(p) != 2]
        if bad:
            raise ValueError(f"ZERO_SM_TAGS entries must be key=value; these are not: {bad}")
        fields["tags"] = {k.strip(): v.strip() for k, v in pairs}
    for asset in JOB_ASSETS:  # ZERO_SM_TRAINED_CHECKPOINT_INSTANCE_TYPE=ml.p5.48xlarge, ..._INSTANCE_COUNT=4
        var = f"ZERO_SM_{asset.upper()}"
        changes: dict = {"instance_type": env(f"{var}_INSTANCE_TYPE")} if env(f"{var}_INSTANCE_TYPE") else {}
        for field in WHOLE_NUMBERS:  # ..._INSTANCE_COUNT, ..._MAX_INSTANCE_COUNT, ..._IMAGES_PER_INSTANCE, ...
            value = env(f"{var}_{field.upper()}")
            if value:
                if not value.isdigit() or int(value) < 1:
                    raise ValueError(f"{var}_{field.upper()}={value!r} is not a whole number (1 or more)")
                changes[field] = int(value)
        if asset == TRAINING_ASSET and env(TRAINING_PLAN_VARIABLE):
            changes["training_plan_arn"] = env(TRAINING_PLAN_VARIABLE)
        if changes:
            fields[asset] = DEFAULT_COMPUTE[asset].model_copy(update=changes)
    return fields


def compute_variable(asset: str, field: str) -> str:
    """The variable that sets `field` of `asset`'s compute."""
    if field == "training_plan_arn":
        return TRAINING_PLAN_VARIABLE
    return f"ZERO_SM_{asset.upper()}_{field.upper()}"


def _flag(var: str, value: str) -> bool:
    if value.lower() not in ("1", "true", "yes", "0", "false", "no"):
        raise ValueError(f"{var}={value!r} is not true or false")
    return value.lower() in ("1", "true", "yes")


def _seconds(var: str, value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ValueError(f"{var}={value!r} is not a number of seconds above 0")
    return seconds


PROFILES = ("production", "rehearsal")  # rehearsal: the graph on AWS cheaply, on a sample and small instances
REHEARSAL_SAMPLE_IMAGES = 2000
REHEARSAL_COMPUTE = {
    "validated_images": JobCompute(
        instance_type="ml.m5.xlarge", instance_count=2, volume_size_gb=50, max_runtime_s=2 * 3600
    ),
    "arrow_shards": JobCompute(instance_type="ml.m5.xlarge", volume_size_gb=50, max_runtime_s=2 * 3600),
    "fsx_warm_state": JobCompute(instance_type="ml.m5.large", volume_size_gb=30, max_runtime_s=3600),
    # The rehearsal asset's own compute (training_rehearsal), so both rehearsals train on the same instances.
    "trained_checkpoint": DEFAULT_COMPUTE["training_rehearsal"],
    "map_report": DEFAULT_COMPUTE["rehearsal_evaluation"],
}


def profile_from_env(environ: Mapping[str, str] | None = None) -> str:
    profile = zero_env("ZERO_PROFILE", environ) or "production"
    if profile not in PROFILES:
        raise ValueError(f"ZERO_PROFILE={profile!r} is not a profile; use one of {PROFILES}")
    return profile


def profile_fields(profile: str) -> dict[str, Any]:
    """The `SageMakerSettings` fields a profile sets, for the constructor (Dagster rebuilds a resource from
    its constructor fields, dropping a `model_copy(update=...)`). No spot for a short, cheap rehearsal."""
    return {**REHEARSAL_COMPUTE, "use_spot": False} if profile == "rehearsal" else {}
