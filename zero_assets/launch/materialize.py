"""The build of every job-backed asset: fingerprint the inputs, launch the job (once, see `once`), report."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from dagster import AssetExecutionContext, DataVersion, MaterializeResult

from zero_assets.backends.job_runner import JobRunner
from zero_assets.core.fingerprints import FingerprintInputs, UpstreamOutput
from zero_assets.core.job_request import FanOut, build_job_request, spread_over
from zero_assets.launch.metadata import job_result, upstream_metadata
from zero_assets.launch.once import materialize_once
from zero_assets.launch.upstream import context_partition


def launch_job(
    context: AssetExecutionContext,
    *,
    jobs: JobRunner,
    module: str,
    config: dict[str, Any],
    upstream: list[UpstreamOutput],
    spread: FanOut | None = None,
    plan: Callable[[str], None] | None = None,
    data_version_of: Callable[[str], str] | None = None,
    **request_fields: Any,
) -> MaterializeResult:
    """Launch the asset's job unless an earlier materialization with the same inputs is still complete;
    `request_fields` go to `build_job_request`, `plan(uri)` writes the job's input `plan` before a launch,
    `spread` fans the job out (`spread_over`), `data_version_of(output uri)` overrides the job's data version."""
    fingerprint_inputs = FingerprintInputs.of(module, config, upstream)
    request = build_job_request(
        context.asset_key.to_user_string(),
        module=module,
        config=config,
        upstream=upstream,
        partition=context_partition(context),
        fingerprint_inputs=fingerprint_inputs,
        **request_fields,
    )
    output = request.outputs["out"]

    def build() -> MaterializeResult:
        staged, map_metadata = request, {}
        if plan is not None:
            plan(location := jobs.read_list_uri(request))
            staged = replace(request, inputs={**request.inputs, "plan": location})
        if spread is not None:
            mapped, staged = spread_over(staged, spread, jobs.instance_count, jobs.read_list_uri(staged))
            if mapped is not None:  # the map stage reports no materialization; its launcher's facts are kept
                map_invocation, map_run = jobs.run(context, mapped)
                map_metadata = {
                    f"map_{k}": v for k, v in {**map_invocation.metadata, **map_run}.items() if k != "backend"
                }
        invocation, job_metadata = jobs.run(context, staged)
        result = job_result(invocation, {"upstream": upstream_metadata(upstream), **job_metadata, **map_metadata})
        if data_version_of is None:
            return result
        reported = result.data_version.value if result.data_version else None
        return MaterializeResult(
            metadata={**(result.metadata or {}), "job_data_version": reported},
            data_version=DataVersion(data_version_of(output)),
        )

    return materialize_once(
        context,
        inputs=fingerprint_inputs,
        output=output,
        lease=request.lease,
        build=build,
        known={"upstream": upstream_metadata(upstream)},
        skipped="no job launched",
    )
