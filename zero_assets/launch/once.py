"""Every asset that writes an output builds it once per input fingerprint: a complete earlier output is a hit;
else hold the output's lease, look again for one published meanwhile, else build and mark it complete (last)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from dagster import AssetExecutionContext, DataVersion, MaterializeResult, MetadataValue

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
    reported_int,
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
    """Materialize the output at `output` unless it already is, holding `lease` while `build()` writes it and
    returns its metadata and data version. An output not checkable from here (`fsx://`) is never marked, so
    never a hit. `known` is added to a hit on another run's output."""
    started = time.perf_counter()
    watch_over_step(context)
    decision = cache_decision(context, inputs)
    if decision.hit is not None:
        context.log.info(f"cache hit, {skipped}: {decision.reason}")
        return _timed(decision.hit.metadata, decision.hit.data_version, started)
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
        marker = complete_marker(output, inputs.fingerprint)
        refusal = None if marker is None else reuse_refusal(output)
        hit = None if refusal else published_hit(output, marker, inputs, reason, held.waited_for)
        if hit is not None:
            context.log.info(f"cache hit, {skipped}: {reason}")
            return _timed({**(hit.metadata or {}), **(known or {})}, hit.data_version, started)
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
                reported_int(built.metadata, "dagster/row_count"),
                reported_int(built.metadata, "dagster/size_bytes"),
            )
            if output_is_checkable(output)
            else None
        )
    metadata = {
        "dagster/uri": MetadataValue.path(output),
        **(standard_metadata(marker) if marker is not None else {}),
        **published_paths(built.metadata or {}, {"out": output}),
        **miss_metadata(inputs, decision.reason),
        "built_by_run": context.run.run_id,
    }
    if "job_name" in metadata:
        metadata["built_by_job"] = metadata["job_name"]
    return _timed(metadata, built.data_version, started)


def _timed(metadata: Mapping[str, Any] | None, version: DataVersion | None, started: float) -> MaterializeResult:
    """The result with this step's own wall time (`step_wall_s`), the cache verdict first."""
    metadata = {**(metadata or {}), "step_wall_s": round(time.perf_counter() - started, 2)}
    return MaterializeResult(metadata=cache_first(metadata), data_version=version)
