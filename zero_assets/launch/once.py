"""The one protocol of every asset that writes an output: build it once per input fingerprint.

Decide (an earlier materialization with the same fingerprint whose output is still complete is a
hit: nothing is built), else take the output's lease (see `output_lease`: a second run with the same
fingerprint waits for the first), look again for an output published meanwhile (a hit on the work
of the run it waited for), else build, mark the output complete (the marker is the last write; a
rebuild withdraws the old one first) and report with the standard metadata. Job-backed assets build
through `launch_job`; the in-process ones (index, training set, warm state) pass their own build.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from dagster import AssetExecutionContext, MaterializeResult, MetadataValue

from zero_assets.core.fingerprints import FingerprintInputs
from zero_assets.core.output_marker import (
    complete_marker,
    mark_output_complete,
    output_is_checkable,
    retract_output_marker,
)
from zero_assets.launch.cache import (
    CacheDecision,
    cache_decision,
    miss_metadata,
    published_hit,
    reported_row_count,
    reported_size_bytes,
    reuse_refusal,
    standard_metadata,
)
from zero_assets.launch.metadata import cache_first, published_paths
from zero_assets.launch.output_lease import hold_lease
from zero_assets.launch.run_owner import watch_over_step


def materialize_once(
    context: AssetExecutionContext,
    *,
    inputs: FingerprintInputs,
    output: str,
    lease: str,
    build: Callable[[], MaterializeResult],
    known: Mapping[str, Any] | None = None,
    skipped: str = "nothing built",
) -> MaterializeResult:
    """Materialize the asset's output at `output` (where `build` publishes it) unless it already is.

    `lease`: where the output's lease is (`core.job_request.output_lease_location`), held while it is
    built; the asset derives it once, and a job the build launches names that same one
    (`JobRequest.lease`), which is how the orphaned-job sensor tells a job someone waits on.
    `build()` writes the output and returns its own metadata and data version. The result carries,
    first, the cache's verdict (`cache`, `cache_reason`), who built the output (`built_by_run`, and
    `built_by_job` for a job) and this step's wall time (`step_wall_s`); then `dagster/uri`, the
    other cache keys (`fingerprint`, `fingerprint_inputs`, `code_version`) and `dagster/size_bytes` of
    the marked files, unless `build` counted that itself (the warm state, whose readers also read
    shards kept elsewhere). A path a job reported inside its container's output folder names the
    published file (see `metadata.published_paths`). The `dagster/row_count` it reports, and a size
    it counted, are kept in the marker, so a later hit found through the marker alone reports them
    too. An output that cannot be checked from here (`fsx://`) is not marked, and
    so never a hit. `known`: what this run knows of the output without building it (what it is built
    from), added to a hit on an output another run published. `skipped` says in the log what a hit
    spares ("no job launched").
    """
    started = time.perf_counter()
    watch_over_step(context)  # a run whose worker is gone is failed, and a step worker ends with its run worker
    decision = cache_decision(context, inputs)
    if decision.hit is not None:
        context.log.info(f"cache hit, {skipped}: {decision.reason}")
        return _timed(decision.hit, started)
    context.log.info(f"cache miss: {decision.reason}")

    def waiting(owner: dict[str, Any]) -> None:
        context.log.info(
            f"run {owner.get('run_id')} (pid {owner.get('pid')} on {owner.get('host')}) is building {output}: "
            "waiting for it"
        )

    with hold_lease(lease, context.run.run_id, on_wait=waiting) as held:
        if held.took_over:
            context.log.warning(f"took over the lease on {output} from run {held.took_over}")
        # The run we waited for (or one this instance never recorded) may have published it meanwhile.
        reason = (
            f"run {held.waited_for} built the same inputs while this run waited; its output at {output} is complete"
            if held.waited_for
            else f"an output of the same input fingerprint is published at {output} and is complete"
        )
        marker = complete_marker(output, inputs.fingerprint)  # one listing and hashing pass for both questions
        refusal = None if marker is None else reuse_refusal(output)
        hit = None if refusal else published_hit(output, marker, inputs, reason, held.waited_for)
        if hit is not None:
            context.log.info(f"cache hit, {skipped}: {reason}")
            return _timed(
                MaterializeResult(metadata={**(hit.metadata or {}), **(known or {})}, data_version=hit.data_version),
                started,
            )
        if refusal:
            context.log.info(f"cache miss: the output published at {output} is complete, but {refusal}")
            decision = CacheDecision(None, f"an output of the same inputs is published, but {refusal}")
        if marker is None or refusal:
            retract_output_marker(output)  # nothing may vouch for the output while it is replaced
        built = build()
        marker = (
            mark_output_complete(
                output,
                inputs.fingerprint,
                built.data_version.value if built.data_version else None,
                reported_row_count(built.metadata),
                reported_size_bytes(built.metadata),
            )
            if output_is_checkable(output)
            else None
        )
    metadata = {
        "dagster/uri": MetadataValue.path(output),
        **(standard_metadata(marker) if marker is not None else {}),
        # A job's paths inside its container's output folder, as published (that folder is gone now).
        **published_paths(built.metadata or {}, {"out": output}),
        **miss_metadata(inputs, decision.reason),
        "built_by_run": context.run.run_id,
    }
    if "job_name" in metadata:
        metadata["built_by_job"] = metadata["job_name"]
    return _timed(MaterializeResult(metadata=metadata, data_version=built.data_version), started)


def _timed(result: MaterializeResult, started: float) -> MaterializeResult:
    """`result` with this step's own wall time (`step_wall_s`: a hit's is the look-up's, never the
    build's), the cache's verdict and who built the output first."""
    metadata = {**(result.metadata or {}), "step_wall_s": round(time.perf_counter() - started, 2)}
    return MaterializeResult(metadata=cache_first(metadata), data_version=result.data_version)
