"""Where and how SageMaker jobs run: account, images, compute per job, network, encryption, tags.

One `ConfigurableResource`; `sagemaker_settings_from_env` binds each field to its `ZERO_SM_*`
variable through `EnvVar` (nothing here is a credential: boto3 finds those in its own chain).
"""

from __future__ import annotations

import os
from typing import Literal, Optional

from dagster import Config, ConfigurableResource, EnvVar

# Assets whose materialization launches a SageMaker job, in graph order.
JOB_ASSETS = ("validated_images", "arrow_shards", "fsx_warm_state", "trained_checkpoint", "map_report")


class JobCompute(Config):
    """Instances of one job. Processing jobs split `sharded_inputs` across the instances."""

    instance_type: str
    instance_count: int = 1
    volume_size_gb: int = 100
    max_runtime_s: int = 24 * 3600


DEFAULT_COMPUTE = {
    "validated_images": JobCompute(instance_type="ml.c5.4xlarge", volume_size_gb=500),
    "arrow_shards": JobCompute(instance_type="ml.c5.4xlarge", volume_size_gb=500),
    "fsx_warm_state": JobCompute(instance_type="ml.m5.xlarge", volume_size_gb=30, max_runtime_s=6 * 3600),
    "trained_checkpoint": JobCompute(
        instance_type="ml.p4d.24xlarge", instance_count=2, volume_size_gb=200, max_runtime_s=5 * 24 * 3600
    ),
    "map_report": JobCompute(instance_type="ml.g5.2xlarge", volume_size_gb=100, max_runtime_s=6 * 3600),
}


class SageMakerSettings(ConfigurableResource):
    """AWS settings of the SageMaker backend."""

    region: str
    role_arn: str  # the execution role the jobs run as
    bucket: str  # lake, code packages, Pipes messages and checkpoints live under s3://<bucket>/<prefix>/
    prefix: str = "zero"
    training_image_uri: str  # a PyTorch Deep Learning Container (its toolkit launches torchrun)
    processing_image_uri: str  # any image with python3 and requirements.txt of the code package installed
    validated_images: JobCompute = DEFAULT_COMPUTE["validated_images"]
    arrow_shards: JobCompute = DEFAULT_COMPUTE["arrow_shards"]
    fsx_warm_state: JobCompute = DEFAULT_COMPUTE["fsx_warm_state"]
    trained_checkpoint: JobCompute = DEFAULT_COMPUTE["trained_checkpoint"]
    map_report: JobCompute = DEFAULT_COMPUTE["map_report"]
    use_spot: bool = False  # managed spot for Training jobs
    max_wait_s: int = 6 * 24 * 3600  # spot: runtime plus time spent waiting for capacity
    subnets: list[str] = []
    security_group_ids: list[str] = []
    kms_key_id: Optional[str] = None  # encrypts outputs and volumes
    tags: dict[str, str] = {}
    fsx_file_system_id: Optional[str] = None  # set: training reads shards from FSx for Lustre
    fsx_mount_name: Optional[str] = None  # the file system's MountName (from DescribeFileSystems)
    messages: Literal["s3", "cloudwatch"] = "s3"  # where job scripts write Pipes messages
    # A Secrets Manager secret holding the W&B API key: jobs get its ARN and read it themselves, so the key is never in a request.
    wandb_secret_arn: Optional[str] = None
    poll_interval_s: float = 15.0

    def compute(self, asset: str) -> JobCompute:
        if asset not in JOB_ASSETS:
            raise KeyError(f"{asset!r} launches no SageMaker job; jobs run for {JOB_ASSETS}")
        return getattr(self, asset)

    def s3_root(self) -> str:
        return f"s3://{self.bucket}/{self.prefix.strip('/')}" if self.prefix.strip("/") else f"s3://{self.bucket}"

    def lake_uri(self) -> str:
        return f"{self.s3_root()}/lake"

    def checkpoint_uri(self, asset: str, fingerprint: str) -> str:
        """Built from names fixed before launch: every attempt of a materialization resumes from here."""
        return f"{self.s3_root()}/checkpoints/{asset}/{fingerprint[:16]}"

    def fsx_enabled(self) -> bool:
        if bool(self.fsx_file_system_id) != bool(self.fsx_mount_name):
            raise ValueError("set both ZERO_SM_FSX_FILE_SYSTEM_ID and ZERO_SM_FSX_MOUNT_NAME, or neither")
        if self.fsx_file_system_id and not (self.subnets and self.security_group_ids):
            raise ValueError(
                "FSx for Lustre needs the jobs in the file system's VPC: set ZERO_SM_SUBNETS and ZERO_SM_SECURITY_GROUP_IDS"
            )
        return bool(self.fsx_file_system_id)

    def vpc_config(self) -> Optional[dict]:
        if not self.subnets and not self.security_group_ids:
            return None
        if not (self.subnets and self.security_group_ids):
            raise ValueError("VPC settings need both ZERO_SM_SUBNETS and ZERO_SM_SECURITY_GROUP_IDS")
        return {"Subnets": list(self.subnets), "SecurityGroupIds": list(self.security_group_ids)}


# Scalar fields read from the environment; lists are comma-separated, tags `key=value,...`.
ENV_FIELDS = {
    "region": "ZERO_SM_REGION",
    "role_arn": "ZERO_SM_ROLE_ARN",
    "bucket": "ZERO_SM_BUCKET",
    "prefix": "ZERO_SM_PREFIX",
    "training_image_uri": "ZERO_SM_TRAINING_IMAGE_URI",
    "processing_image_uri": "ZERO_SM_PROCESSING_IMAGE_URI",
    "kms_key_id": "ZERO_SM_KMS_KEY_ID",
    "fsx_file_system_id": "ZERO_SM_FSX_FILE_SYSTEM_ID",
    "fsx_mount_name": "ZERO_SM_FSX_MOUNT_NAME",
    "messages": "ZERO_SM_MESSAGES",
    "wandb_secret_arn": "ZERO_SM_WANDB_SECRET_ARN",
}
REQUIRED = ("region", "role_arn", "bucket", "training_image_uri", "processing_image_uri")


def sagemaker_settings_from_env(environ: Optional[dict[str, str]] = None, **overrides) -> SageMakerSettings:
    """Settings from `ZERO_SM_*`; fails naming every required variable that is missing."""
    env = os.environ if environ is None else environ
    missing = [ENV_FIELDS[f] for f in REQUIRED if not env.get(ENV_FIELDS[f]) and f not in overrides]
    if missing:
        raise ValueError(f"ZERO_BACKEND=sagemaker needs {', '.join(missing)} (see README, 'Running on SageMaker')")
    bind = (lambda var: EnvVar(var)) if environ is None else (lambda var: env[var])
    fields: dict = {f: bind(var) for f, var in ENV_FIELDS.items() if env.get(var)}
    fields.update(_parsed_fields(env))
    return SageMakerSettings(**{**fields, **overrides})


def _parsed_fields(env) -> dict:
    fields: dict = {}
    for field, var in (("subnets", "ZERO_SM_SUBNETS"), ("security_group_ids", "ZERO_SM_SECURITY_GROUP_IDS")):
        if env.get(var):
            fields[field] = [item.strip() for item in env[var].split(",") if item.strip()]
    if env.get("ZERO_SM_USE_SPOT"):
        fields["use_spot"] = env["ZERO_SM_USE_SPOT"].lower() in ("1", "true", "yes")
    if env.get("ZERO_SM_TAGS"):
        pairs = [item.split("=", 1) for item in env["ZERO_SM_TAGS"].split(",") if item.strip()]
        bad = [p[0] for p in pairs if len(p) != 2]
        if bad:
            raise ValueError(f"ZERO_SM_TAGS entries must be key=value; these are not: {bad}")
        fields["tags"] = {k.strip(): v.strip() for k, v in pairs}
    for asset in JOB_ASSETS:  # ZERO_SM_TRAINED_CHECKPOINT_INSTANCE_TYPE=ml.p5.48xlarge, ..._INSTANCE_COUNT=4
        var = f"ZERO_SM_{asset.upper()}"
        changes = {
            k: env[f"{var}_{k.upper()}"] for k in ("instance_type", "instance_count") if env.get(f"{var}_{k.upper()}")
        }
        if changes:
            fields[asset] = DEFAULT_COMPUTE[asset].model_copy(
                update={k: (int(v) if k == "instance_count" else v) for k, v in changes.items()}
            )
    return fields
