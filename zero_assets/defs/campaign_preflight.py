"""The campaign's preflight on whichever backend runs the jobs: the checks that take seconds, run before the
rehearsal's first job and by the readiness check, each naming what is wrong (see `backends/preflight.py`).

Everywhere: a write and a delete under the checkpoint prefixes of the training and of the rehearsal, and,
for online W&B tracking, the API key the jobs will log in with. On SageMaker also the job role's
permissions (`iam:SimulatePrincipalPolicy`) and, with FSx, the data repository association over the lake.
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from training_code.lib import wandb_run
from zero_assets.backends.job_runner import JobRunner
from zero_assets.backends.preflight import Finding, WandbLogin, local_wandb_login, wandb_key_finding, writable_prefix
from zero_assets.core.settings import ZeroSettings
from zero_assets.defs.rehearsal_gate import REHEARSAL_ASSET, sagemaker_settings_of

TRAINING_ASSETS = ("trained_checkpoint", REHEARSAL_ASSET)  # whose checkpoint prefixes the probe writes under


def preflight(jobs: JobRunner, settings: ZeroSettings, tracking: dict[str, Any]) -> list[Finding]:
    """Every preflight finding for a training tracked as `tracking` (its W&B arguments) on `jobs`."""
    aws = sagemaker_settings_of(jobs)
    findings = [
        writable_prefix(prefix, f"{asset} checkpoints") for asset, prefix in checkpoint_prefixes(jobs, settings)
    ]
    if aws is not None:
        from zero_assets.backends.sagemaker.preflight import (
            association_finding,
            make_preflight_clients,
            role_finding,
            role_needs,
        )

        clients = make_preflight_clients(aws.region)
        findings.append(role_finding(clients.iam, aws.role_arn, role_needs(aws, settings.lake_uri, settings.raw_uri)))
        if aws.fsx_enabled():
            findings.append(association_finding(clients.fsx, aws.fsx_file_system_id, settings.lake_uri))
    if tracking.get("wandb_mode") == "online":
        findings.append(wandb_key_finding(wandb_login(jobs, tracking["wandb_base_url"])))
    return findings


def checkpoint_prefixes(jobs: JobRunner, settings: ZeroSettings) -> list[tuple[str, str]]:
    """(asset, the prefix its jobs' checkpoint folders are made under, one per input fingerprint)."""
    aws = sagemaker_settings_of(jobs)
    if aws is None:  # the local runner's `<jobs root>/<asset>/<fingerprint16>/checkpoints`
        return [(asset, str(settings.jobs_root() / asset)) for asset in TRAINING_ASSETS]
    # SageMaker's CheckpointConfig prefix `<root>/checkpoints/<asset>/<fingerprint16>`, one level up.
    return [(asset, aws.checkpoint_uri(asset, "0" * 16).rsplit("/", 1)[0]) for asset in TRAINING_ASSETS]


def wandb_login(jobs: JobRunner, base_url: str) -> WandbLogin:
    """The login the jobs make: on SageMaker with the key in the secret ZERO_SM_WANDB_SECRET_ARN names (the
    only key a SageMaker job gets), locally with the key W&B finds in this process."""
    aws = sagemaker_settings_of(jobs)
    if aws is None:
        return local_wandb_login(base_url)
    if not aws.wandb_secret_arn:
        return WandbLogin(base_url, None, "ZERO_SM_WANDB_SECRET_ARN is not set")
    source = f"secret {aws.wandb_secret_arn}"
    try:
        return WandbLogin(base_url, wandb_run.api_key_from_secret(aws.wandb_secret_arn), source)
    except (ValueError, ClientError, BotoCoreError) as error:  # the finding names it
        return WandbLogin(base_url, None, f"{source}, unreadable: {type(error).__name__}: {error}")


def failed(findings: list[Finding]) -> list[Finding]:
    return [finding for finding in findings if not finding.ok]
