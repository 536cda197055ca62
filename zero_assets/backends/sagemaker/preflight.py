"""Preflight on AWS, in seconds: may the job role do what the jobs do (simulating its policies, which needs
`iam:SimulatePrincipalPolicy`), and does the FSx association cover the lake's shards.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from training_code.lib import wandb_run
from training_code.lib.storage import split_s3
from zero_assets.backends.preflight import (
    TRAINING_ASSETS,
    Finding,
    WandbLogin,
    error_text,
    wandb_key_finding,
    writable_prefix,
)
from zero_assets.backends.sagemaker.job_api import paged
from zero_assets.backends.sagemaker.settings import SageMakerSettings
from zero_assets.backends.sagemaker.training_set_channel import LINKED_PATH, linked_s3_prefix
from zero_assets.core.settings import ZeroSettings

ECR_IMAGE = re.compile(
    r"^(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(\.cn)?/(?P<repo>[^:@]+)"
)
IMAGE_ACTIONS = ("ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer")
KMS_ACTIONS = ("kms:Encrypt", "kms:Decrypt", "kms:GenerateDataKey", "kms:CreateGrant")
VPC_ACTIONS = (
    "ec2:CreateNetworkInterface",
    "ec2:CreateNetworkInterfacePermission",
    "ec2:DeleteNetworkInterface",
    "ec2:DeleteNetworkInterfacePermission",
    "ec2:DescribeNetworkInterfaces",
    "ec2:DescribeVpcs",
    "ec2:DescribeDhcpOptions",
    "ec2:DescribeSubnets",
    "ec2:DescribeSecurityGroups",
)
ALLOWED = "allowed"


def sagemaker_preflight(aws: SageMakerSettings, settings: ZeroSettings, tracking: Mapping[str, Any]) -> list[Finding]:
    """Checkpoint prefixes writable, the role's permissions, the FSx association and the W&B secret."""
    # One level above SageMaker's per-fingerprint CheckpointConfig prefix.
    prefixes = [(asset, aws.checkpoint_uri(asset, "0" * 16).rsplit("/", 1)[0]) for asset in TRAINING_ASSETS]
    findings = [writable_prefix(prefix, f"{asset} checkpoints") for asset, prefix in prefixes]
    clients = make_preflight_clients(aws.region)
    findings.append(role_finding(clients.iam, aws.role_arn, role_needs(aws, settings.lake_uri, settings.raw_uri)))
    if aws.fsx_enabled():
        findings.append(association_finding(clients.fsx, aws.fsx_file_system_id, settings.lake_uri))
    if tracking.get("wandb_mode") == "online":
        findings.append(wandb_key_finding(secret_wandb_login(aws, tracking["wandb_base_url"])))
    return findings


def secret_wandb_login(aws: SageMakerSettings, base_url: str) -> WandbLogin:
    """The login the jobs make, with the key in ZERO_SM_WANDB_SECRET_ARN's secret."""
    if not aws.wandb_secret_arn:
        return WandbLogin(base_url, None, "ZERO_SM_WANDB_SECRET_ARN is not set")
    source = f"secret {aws.wandb_secret_arn}"
    try:
        return WandbLogin(base_url, wandb_run.api_key_from_secret(aws.wandb_secret_arn), source)
    except (ValueError, ClientError, BotoCoreError) as error:  # the finding names it
        return WandbLogin(base_url, None, f"{source}, unreadable: {type(error).__name__}: {error}")


@dataclass(frozen=True)
class PreflightClients:
    iam: Any
    fsx: Any


def make_preflight_clients(region: str) -> PreflightClients:
    """The clients the AWS preflight calls, under the one client policy (tests replace this function)."""
    from training_code.lib.aws_clients import client

    return PreflightClients(client("iam", region=region), client("fsx", region=region))


def role_needs(aws: SageMakerSettings, lake_uri: str, raw_uri: str) -> dict[str, tuple[str, ...]]:
    """Resource ARN -> the actions the jobs take on it as the job role (docs/sagemaker.md, "IAM")."""
    partition, account = _arn_part(aws.role_arn, 1), _arn_part(aws.role_arn, 4)
    needs: dict[str, tuple[str, ...]] = {}
    # The backend's root and the lake are read and written, the raw root only read; each if outside the root.
    inside = aws.s3_root().rstrip("/") + "/"
    roots = {aws.s3_root(): ("s3:GetObject", "s3:PutObject")}
    for uri, actions in ((lake_uri, ("s3:GetObject", "s3:PutObject")), (raw_uri, ("s3:GetObject",))):
        if uri.startswith("s3://") and not uri.startswith(inside) and uri not in roots:
            roots[uri] = actions
    for root, actions in roots.items():
        bucket, prefix = split_s3(root)
        needs[f"arn:{partition}:s3:::{bucket}"] = ("s3:ListBucket",)
        needs[f"arn:{partition}:s3:::{bucket}/{prefix.strip('/') + '/' if prefix.strip('/') else ''}*"] = actions
    needs[f"arn:{partition}:logs:{aws.region}:{account}:log-group:/aws/sagemaker/*"] = (
        "logs:CreateLogGroup",
        "logs:CreateLogStream",
        "logs:PutLogEvents",
    )
    needs["*"] = ("ecr:GetAuthorizationToken", *(VPC_ACTIONS if aws.subnets else ()))
    for image in dict.fromkeys([aws.training_image_uri, aws.processing_image_uri]):
        found = ECR_IMAGE.match(image)
        if found:
            repository = f"arn:{partition}:ecr:{found['region']}:{found['account']}:repository/{found['repo']}"
            needs[repository] = IMAGE_ACTIONS
    if aws.wandb_secret_arn:
        needs[aws.wandb_secret_arn] = ("secretsmanager:GetSecretValue",)
    if aws.kms_key_id:
        needs[_kms_arn(aws.kms_key_id, partition, aws.region, account)] = KMS_ACTIONS
    return needs


def role_finding(iam, role_arn: str, needs: dict[str, tuple[str, ...]]) -> Finding:
    """Simulate the role's policies on every (action, resource) the jobs need; name each one denied."""
    check = "job role"
    denied: list[str] = []
    try:
        for resource, actions in needs.items():
            for result in _simulated(iam, role_arn, list(actions), resource):
                if result["EvalDecision"] != ALLOWED:
                    denied.append(f"{result['EvalActionName']} on {resource} ({result['EvalDecision']})")
    except (ClientError, BotoCoreError) as error:
        code = error.response.get("Error", {}).get("Code") if isinstance(error, ClientError) else None
        if code == "NoSuchEntity":
            return Finding(check, False, f"the job role {role_arn} does not exist (ZERO_SM_ROLE_ARN)")
        return Finding(
            check,
            False,
            f"cannot simulate the policies of {role_arn} ({error_text(error)}): the identity running Dagster needs "
            "iam:SimulatePrincipalPolicy on the job role for this check",
        )
    if denied:
        return Finding(
            check, False, f"{role_arn} may not do what the jobs do: {'; '.join(denied)}. Allow these in its policies"
        )
    actions = sum(len(a) for a in needs.values())
    return Finding(check, True, f"{role_arn} is allowed the {actions} actions the jobs take, on {len(needs)} resources")


def association_finding(fsx, file_system_id: str, lake_uri: str) -> Finding:
    """Whether an AVAILABLE association links `/arrow_shards` to a prefix covering the lake's shards."""
    check = "FSx association"
    repository = linked_s3_prefix(lake_uri)
    try:
        filters = [{"Name": "file-system-id", "Values": [file_system_id]}]
        associations = paged(fsx.describe_data_repository_associations, "Associations", Filters=filters)
    except (ClientError, BotoCoreError) as error:
        return Finding(check, False, f"cannot list the associations of {file_system_id} ({error_text(error)})")
    linked = [a for a in associations if a.get("FileSystemPath") == LINKED_PATH]
    if not linked:
        return Finding(
            check,
            False,
            f"{file_system_id} has no data repository association at {LINKED_PATH}: the training jobs would find no "
            f"shards there. Materialize fsx_warm_state (it links {repository}), or create the association",
        )
    association = linked[0]
    path = association.get("DataRepositoryPath", "")
    if not repository.startswith(path.rstrip("/") + "/"):
        return Finding(
            check,
            False,
            f"{file_system_id}:{LINKED_PATH} is linked to {path}, which does not cover the lake's shards at "
            f"{repository}; link {repository} there (delete the other association) or use another file system",
        )
    lifecycle = association.get("Lifecycle")
    if lifecycle != "AVAILABLE":
        details = (association.get("FailureDetails") or {}).get("Message", "")
        return Finding(
            check,
            False,
            f"association {association['AssociationId']} ({LINKED_PATH} <-> {path}) is {lifecycle}"
            + (f": {details}" if details else "")
            + "; it must be AVAILABLE before the shards can be read",
        )
    return Finding(check, True, f"{association['AssociationId']} links {file_system_id}:{LINKED_PATH} to {path}")


def _simulated(iam, role_arn: str, actions: list[str], resource: str) -> list[dict]:
    results: list[dict] = []
    marker = None
    while True:
        page = iam.simulate_principal_policy(
            PolicySourceArn=role_arn,
            ActionNames=actions,
            ResourceArns=[resource],
            **({"Marker": marker} if marker else {}),
        )
        results += page["EvaluationResults"]
        if not page.get("IsTruncated"):
            return results
        marker = page["Marker"]


def _arn_part(arn: str, index: int) -> str:
    parts = arn.split(":")
    if len(parts) < 6 or not parts[index]:
        raise ValueError(f"ZERO_SM_ROLE_ARN={arn!r} is not an IAM role ARN (arn:aws:iam::<account>:role/<name>)")
    return parts[index]


def _kms_arn(key: str, partition: str, region: str, account: str) -> str:
    if key.startswith("arn:"):
        return key
    return f"arn:{partition}:kms:{region}:{account}:{key if key.startswith('alias/') else f'key/{key}'}"
