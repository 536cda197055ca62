"""The build of every job-backed asset: fingerprint the inputs, launch the job, report.

The launch is `materialize_once`'s build (see `once`): a second run with the same fingerprint waits
on the output's lease, then finds the output the first one published and reports a cache hit
instead of launching the job again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from dagster import AssetExecutionContext, DataVersion, MaterializeResult

from zero_assets.backends.job_runner import JobRunner
from zero_assets.core.fingerprints import FingerprintInputs, UpstreamOutput
from zero_assets.core.job_request import FanOut, JobRequest, build_job_request, spread_over
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
    """Launch the asset's job unless an earlier materialization with the same inputs is still complete.

    `request_fields` (settings, kind, inputs, arguments, scan) go to `build_job_request` unchanged.
    `plan(uri)` writes what the job reads (the selection's plan) where the backend stages it, before
    launch and only when the job runs; it reaches the job as the input `plan`.
    With `spread` the job's read list is planned first, and on more than one instance (the backend
    derives the count from that work) it runs as a map stage on every instance and a reduce stage on
    one (see `job_request.spread_over`). `data_version_of(output
    uri)` gives the asset's data version where it is not the one the job reports (kept as `job_data_version`).
    The result carries Dagster's standard `dagster/uri` and `dagster/size_bytes` (the marked output's
    files), and `dagster/row_count` as the job script reports it; a hit carries the same keys.
    """
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
        staged = request
        if plan is not None:
            plan(location := jobs.read_list_uri(request))
            staged = replace(request, inputs={**request.inputs, "plan": location})
        result = _run_job(context, jobs, staged, spread, upstream)
        if data_version_of is None:
            return result
        reported = result.data_version.value if result.data_version else None
        return MaterializeResult(
            metadata={**(result.metadata or {}), "job_data_version": reported},
            data_version=DataVersion(data_version_of(output)),
        )

    # What it was built from, as a miss records it (training_set reads the shards' validated set there).
    return materialize_once(
        context,
        inputs=fingerprint_inputs,
        output=output,
        lease=request.lease,
        build=build,
        known={"upstream": upstream_metadata(upstream)},
        skipped="no job launched",
    )


def _run_job(
    context: AssetExecutionContext,
    jobs: JobRunner,
    request: JobRequest,
    spread: FanOut | None,
    upstream: list[UpstreamOutput],
) -> MaterializeResult:
    map_metadata: dict[str, Any] = {}
    mapped, request = (
        spread_over(request, spread, jobs.instance_count, jobs.read_list_uri(request)) if spread else (None, request)
    )
    if mapped is not None:
        map_invocation, map_run = jobs.run(context, mapped)
        # The map stage reports no materialization; what its launcher knows (job name, instances, time) is kept.
        map_metadata = {
            f"map_{key}": value for key, value in {**map_invocation.metadata, **map_run}.items() if key != "backend"
        }
    invocation, job_metadata = jobs.run(context, request)
    return job_result(
        invocation,
        {"upstream": upstream_metadata(upstream), **job_metadata, **map_metadata},
    )
