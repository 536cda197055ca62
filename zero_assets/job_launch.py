"""The shared step of every job-backed asset: fingerprint the inputs, launch the job, report."""

from __future__ import annotations

from typing import Any, Literal

from dagster import AssetExecutionContext, MaterializeResult, MetadataValue

from .fingerprints import UpstreamOutput, code_version, input_fingerprint
from .job_request import JobRequest
from .metadata import job_result, upstream_metadata
from .resources.job_runner import JobRunner
from .resources.settings import ZeroSettings


def build_job_request(
    asset: str,
    *,
    settings: ZeroSettings,
    kind: Literal["processing", "training"],
    module: str,
    config: dict[str, Any],
    upstream: list[UpstreamOutput],
    inputs: dict[str, str],
    processes_per_host: int = 1,
    **options: Any,
) -> JobRequest:
    """The request for one materialization; its output goes under the input fingerprint."""
    fingerprint = input_fingerprint(code_version(module), config, {u.asset: u.data_version for u in upstream})
    return JobRequest(
        asset=asset,
        kind=kind,
        module=module,
        fingerprint=fingerprint,
        inputs=inputs,
        outputs={"out": settings.asset_uri(asset, fingerprint[:16])},
        arguments=config,
        processes_per_host=processes_per_host,
        **options,
    )


def launch_job(
    context: AssetExecutionContext,
    *,
    jobs: JobRunner,
    settings: ZeroSettings,
    kind: Literal["processing", "training"],
    module: str,
    config: dict[str, Any],
    upstream: list[UpstreamOutput],
    inputs: dict[str, str],
    processes_per_host: int = 1,
) -> MaterializeResult:
    request = build_job_request(
        context.asset_key.to_user_string(),
        settings=settings,
        kind=kind,
        module=module,
        config=config,
        upstream=upstream,
        inputs=inputs,
        processes_per_host=processes_per_host,
    )
    invocation, job_metadata = jobs.run(context, request)
    return job_result(
        invocation,
        {
            "uri": MetadataValue.path(request.outputs["out"]),
            "fingerprint": request.fingerprint,
            "code_version": code_version(module),
            "upstream": upstream_metadata(upstream),
            "cache": "miss",
            **job_metadata,
        },
    )
