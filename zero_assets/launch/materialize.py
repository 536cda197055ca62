"""The shared step of every job-backed asset: fingerprint the inputs, launch the job, report.

One run builds an output at a time: the launch holds the output's lease (see `output_lease`), so a
second run with the same fingerprint waits, then finds the output the first one published and
reports a cache hit instead of launching the job again. The marker is written last, after the job's
outputs and manifest are in place; a rebuild withdraws the old marker first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dagster import AssetExecutionContext, DataVersion, MaterializeResult, MetadataValue

from zero_assets.backends.job_runner import JobRunner
from zero_assets.core.fingerprints import FingerprintInputs, UpstreamOutput
from zero_assets.core.job_request import FanOut, JobRequest, build_job_request, fan_out, materialization_folder
from zero_assets.core.output_marker import complete_marker, mark_output_complete, retract_output_marker
from zero_assets.launch.cache import decide, miss_metadata, published_hit, reported_row_count, standard_metadata
from zero_assets.launch.metadata import job_result, upstream_metadata
from zero_assets.launch.output_lease import hold_lease
from zero_assets.launch.upstream import context_partition


def launch_job(
    context: AssetExecutionContext,
    *,
    jobs: JobRunner,
    module: str,
    config: dict[str, Any],
    upstream: list[UpstreamOutput],
    spread: FanOut | None = None,
    data_version_of: Callable[[str], str] | None = None,
    **request_fields: Any,
) -> MaterializeResult:
    """Launch the asset's job unless an earlier materialization with the same inputs is still complete.

    `request_fields` (settings, kind, inputs, processes_per_host) go to `build_job_request` unchanged.
    With `spread` and more than one instance configured for the asset, the job runs as a map stage
    on every instance and a reduce stage on one (see `job_request.fan_out`). `data_version_of(output
    uri)` gives the asset's data version where it is not the one the job reports (kept as `job_data_version`).
    The result carries Dagster's standard `dagster/uri` and `dagster/size_bytes` (the marked output's
    files), and `dagster/row_count` as the job script reports it; a hit carries the same keys.
    """
    fingerprint_inputs = FingerprintInputs.of(module, config, upstream)
    decision = decide(context, fingerprint_inputs)
    if decision.hit is not None:
        context.log.info(f"cache hit, no job launched: {decision.reason}")
        return decision.hit
    context.log.info(f"cache miss: {decision.reason}")
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
    lease_path = materialization_folder(request_fields["settings"].jobs_root(), request) / "lease.json"

    def waiting(owner: dict[str, Any]) -> None:
        context.log.info(
            f"run {owner.get('run_id')} (pid {owner.get('pid')} on {owner.get('host')}) is building {output}: waiting for it"
        )

    with hold_lease(lease_path, context.run.run_id, on_wait=waiting) as lease:
        if lease.took_over:
            context.log.warning(f"took over the lease on {output} from run {lease.took_over}")
        # The run we waited for (or one this instance never recorded) may have published it meanwhile.
        reason = (
            f"run {lease.waited_for} built the same inputs while this run waited; its output at {output} is complete"
            if lease.waited_for
            else f"an output of the same input fingerprint is published at {output} and is complete"
        )
        marker = complete_marker(output, request.fingerprint)  # one listing and hashing pass for both questions
        hit = published_hit(output, marker, fingerprint_inputs, reason, lease.waited_for)
        if hit is not None:
            context.log.info(f"cache hit, no job launched: {reason}")
            # What it was built from, as a miss records it (training_set reads the shards' validated set here).
            return MaterializeResult(
                metadata={**(hit.metadata or {}), "upstream": upstream_metadata(upstream)},
                data_version=hit.data_version,
            )
        if marker is None:
            retract_output_marker(output)  # nothing may vouch for a set while it is replaced
        result = _run_job(context, jobs, request, spread, decision.reason, fingerprint_inputs, upstream)
        if data_version_of is not None:
            reported = result.data_version.value if result.data_version else None
            result = MaterializeResult(
                metadata={**(result.metadata or {}), "job_data_version": reported},
                data_version=DataVersion(data_version_of(output)),
            )
        marker = mark_output_complete(
            output,
            request.fingerprint,
            result.data_version.value if result.data_version else None,
            reported_row_count(result.metadata),
        )
    # The size is the marked files' (read once, here, for every job-backed asset); the row count is the job's own.
    return MaterializeResult(
        metadata={**(result.metadata or {}), **standard_metadata(marker)}, data_version=result.data_version
    )


def _run_job(
    context: AssetExecutionContext,
    jobs: JobRunner,
    request: JobRequest,
    spread: FanOut | None,
    reason: str,
    fingerprint_inputs: FingerprintInputs,
    upstream: list[UpstreamOutput],
) -> MaterializeResult:
    instances = jobs.instance_count(request.asset) if spread else 1
    map_metadata: dict[str, Any] = {}
    if instances > 1:
        mapped, request = fan_out(request, spread, instances)
        map_invocation, map_run = jobs.run(context, mapped)
        # The map stage reports no materialization; what its launcher knows (job name, instances, time) is kept.
        map_metadata = {
            f"map_{key}": value for key, value in {**map_invocation.metadata, **map_run}.items() if key != "backend"
        }
    invocation, job_metadata = jobs.run(context, request)
    return job_result(
        invocation,
        {
            "dagster/uri": MetadataValue.path(request.outputs["out"]),
            "upstream": upstream_metadata(upstream),
            **miss_metadata(fingerprint_inputs, reason),
            **job_metadata,
            **map_metadata,
        },
    )
