"""A search on this machine: each trial the training job itself (a Pipes subprocess under torchrun), a
few at a time; its objective is the metric the trial reports. A warm start reuses an earlier search's
trials of the same data and trainer: a draw it already ran is not run again."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from dagster import AssetExecutionContext, Failure

from training_code.lib.hashing import sha256_json
from training_code.lib.storage import join
from zero_assets.backends.job_cost import INSTANCE_SECONDS, local_cost
from zero_assets.backends.job_runner import TuningRun
from zero_assets.core.job_request import JobRequest
from zero_assets.core.tuning import TuningSpec

Run = Callable[[AssetExecutionContext, JobRequest], tuple[Any, dict[str, Any]]]


def run_trials(
    run: Run, context: AssetExecutionContext, request: JobRequest, spec: TuningSpec, earlier: Mapping[str, Any] | None
) -> TuningRun:
    tuned = [r.name for r in spec.ranges]
    done = {
        sha256_json(t["hyperparameters"]): t for t in (earlier or {}).get("trials", []) if t["objective"] is not None
    }
    reused, planned = [], []
    for n, arguments in enumerate(spec.local_trials(request.arguments)):
        chosen = {name: arguments[name] for name in tuned}
        if (found := done.get(sha256_json(chosen))) is not None:
            reused.append({**found, "status": f"reused from {earlier['job']}"})
        else:
            planned.append(_trial_request(request, n, arguments))
    if spec.strategy not in ("Random", "Grid"):
        context.log.info(f"the local backend draws the {spec.strategy} search's trials at random")
    context.log.info(
        f"tuning: {len(planned)} trials to run, {spec.max_parallel_trials} at a time; {len(reused)} reused"
    )
    with ThreadPoolExecutor(spec.max_parallel_trials, thread_name_prefix="trial") as pool:
        ran = list(pool.map(lambda trial: _run_trial(run, context, trial, tuned, spec.objective_metric), planned))
    trials = reused + ran
    seconds = sum(t["seconds"] or 0.0 for t in ran)
    return TuningRun(
        job=f"local-tuning-{request.fingerprint[:16]}",
        trials=trials,
        best=spec.best(trials),
        cost=local_cost(seconds, hosts=1),  # the trials' instance-seconds, summed
    )


def _trial_request(request: JobRequest, n: int, arguments: dict[str, Any]) -> JobRequest:
    """Trial `n`: the training request with its own arguments, fingerprint (so job name and checkpoints)
    and output, `trials/<n>` under the tuning's."""
    fingerprint = sha256_json({"tuning": request.fingerprint, "arguments": arguments})
    return replace(
        request,
        fingerprint=fingerprint,
        arguments=arguments,
        outputs={"out": join(request.outputs["out"], f"trials/{n:03d}")},
    )


def _run_trial(run: Run, context: AssetExecutionContext, trial: JobRequest, tuned: list[str], metric: str) -> dict:
    chosen = {name: trial.arguments[name] for name in tuned}
    record: dict[str, Any] = {"job": trial.job_name, "hyperparameters": chosen, "objective": None, "seconds": None}
    try:
        invocation, launched = run(context, trial)
    except Failure as failure:
        context.log.warning(f"trial {trial.job_name} ({chosen}) failed: {failure.description}")
        return {**record, "status": "Failed"}
    reported = invocation.get_materialize_result().metadata or {}
    value = getattr(reported.get(metric), "value", reported.get(metric))
    record["seconds"] = launched.get(INSTANCE_SECONDS)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        context.log.warning(f"trial {trial.job_name} reported no number {metric!r}: {value!r}")
        return {**record, "status": f"Completed without {metric}"}
    context.log.info(f"trial {trial.job_name} ({chosen}): {metric} {value}")
    return {**record, "objective": float(value), "status": "Completed"}
