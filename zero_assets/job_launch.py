"""The shared step of every job-backed asset: fingerprint the inputs, launch the job, report."""

from __future__ import annotations

from typing import Any, Literal

from dagster import AssetExecutionContext, MaterializeResult, MetadataValue

from .cache import decide, mark_output_complete, miss_metadata
from .fingerprints import FingerprintInputs, UpstreamOutput
from .job_request import FanOut, JobRequest, fan_out
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
    fingerprint = FingerprintInputs.of(module, config, upstream).fingerprint
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
    module: str,
    config: dict[str, Any],
    upstream: list[UpstreamOutput],
    spread: FanOut | None = None,
    **request_fields: Any,
) -> MaterializeResult:
    """Launch the asset's job unless an earlier materialization with the same inputs is still complete.

    `request_fields` (settings, kind, inputs, processes_per_host) go to `build_job_request` unchanged.
    With `spread` and more than one instance configured for the asset, the job runs as a map stage
    on every instance and a reduce stage on one (see `job_request.fan_out`).
    """
    fingerprint_inputs = FingerprintInputs.of(module, config, upstream)
    decision = decide(context, fingerprint_inputs)
    if decision.hit is not None:
        context.log.info(f"cache hit, no job launched: {decision.reason}")
        return decision.hit
    context.log.info(f"cache miss: {decision.reason}")
    request = build_job_request(context.asset_key.to_user_string(), module=module, config=config, upstream=upstream, **request_fields)
    instances = jobs.instance_count(request.asset) if spread else 1
    map_metadata: dict[str, Any] = {}
    if instances > 1:
        mapped, request = fan_out(request, spread, instances)
        map_invocation, map_run = jobs.run(context, mapped)
        # The map stage reports no materialization; what its launcher knows (job name, instances, time) is kept.
        map_metadata = {f"map_{key}": value for key, value in {**map_invocation.metadata, **map_run}.items() if key != "backend"}
    invocation, job_metadata = jobs.run(context, request)
    mark_output_complete(request.outputs["out"], request.fingerprint)
    return job_result(
        invocation,
        {
            "uri": MetadataValue.path(request.outputs["out"]),
            "upstream": upstream_metadata(upstream),
            **miss_metadata(fingerprint_inputs, decision.reason),
            **job_metadata,
            **map_metadata,
        },
    )
