"""The shared step of every job-backed asset: fingerprint the inputs, launch the job, report."""

from __future__ import annotations

from typing import Any, Literal

from dagster import AssetExecutionContext, MaterializeResult, MetadataValue

from .fingerprints import UpstreamOutput, code_version, input_fingerprint
from .job_request import JobRequest
from .metadata import job_result
from .resources.local_runner import LocalJobRunner
from .resources.settings import ZeroSettings


def launch_job(
    context: AssetExecutionContext,
    *,
    jobs: LocalJobRunner,
    settings: ZeroSettings,
    kind: Literal["processing", "training"],
    module: str,
    config: dict[str, Any],
    upstream: list[UpstreamOutput],
    inputs: dict[str, str],
    processes_per_host: int = 1,
) -> MaterializeResult:
    asset = context.asset_key.to_user_string()
    code = code_version(module)
    fingerprint = input_fingerprint(code, config, {u.asset: u.data_version for u in upstream})
    out = settings.asset_uri(asset, fingerprint[:16])
    request = JobRequest(
        asset=asset,
        kind=kind,
        module=module,
        fingerprint=fingerprint,
        inputs=inputs,
        outputs={"out": out},
        arguments=config,
        processes_per_host=processes_per_host,
    )
    invocation, job_metadata = jobs.run(context, request)
    return job_result(
        invocation,
        {
            "uri": MetadataValue.path(out),
            "fingerprint": fingerprint,
            "code_version": code,
            "upstream": MetadataValue.json({u.asset: {"uri": u.uri, "data_version": u.data_version} for u in upstream}),
            "cache": "miss",
            **job_metadata,
        },
    )
