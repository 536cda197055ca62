"""The rehearsal's three jobs, `training_rehearsal`'s build: a training forced to stop at step K, its next attempt
resuming from K to the end on two or more processes, then the evaluator; each must prove its part. Each build
gets its own job fingerprint, so no earlier build's checkpoints can stand in for its stop and resume."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from dagster import AssetExecutionContext, DataVersion, Failure, MaterializeResult, MetadataValue

from training_code.lib.hashing import sha256_bytes, sha256_json
from training_code.lib.output_manifest import MANIFEST
from training_code.lib.storage import exists, join, read_bytes, write_bytes_atomic
from zero_assets.backends.job_runner import JobRunner
from zero_assets.backends.preflight import Finding
from zero_assets.core.fingerprints import UpstreamOutput
from zero_assets.core.job_request import JobRequest
from zero_assets.defs.rehearsal_gate import REHEARSAL_ASSET, REHEARSAL_KEY, REHEARSAL_KEY_INPUTS

REHEARSAL_EVALUATION = "rehearsal_evaluation"  # the label (and SageMaker compute) of the rehearsal's evaluation
FORCED_STOP = "forced stop"  # how the trainer's failure reason for `--stop-after-steps` begins (training_code.train)
RECORD = "rehearsal.json"
RECORD_FORMAT = "zero-rehearsal/1"
COST_KEYS = ("instance_seconds", "estimated_cost_usd")  # summed over the rehearsal's three jobs


@dataclass(frozen=True)
class RehearsalJobs:
    """The requests of one rehearsal build and what it proves against."""

    stop: JobRequest  # the training with --stop-after-steps
    resume: JobRequest  # the same job without it: the next attempt
    evaluate: JobRequest
    stop_after_steps: int
    steps: int
    key: str
    key_inputs: dict[str, Any]
    warm: UpstreamOutput

    @property
    def report_uri(self) -> str:
        return self.evaluate.outputs["out"]


def rehearsal_jobs(
    *,
    output: str,
    build_id: str,
    training: tuple[str, dict[str, Any]],
    evaluation: tuple[str, dict[str, Any]],
    processes: int,
    stop_after_steps: int,
    steps: int,
    key: str,
    key_inputs: dict[str, Any],
    warm: UpstreamOutput,
    lease: str = "",
) -> RehearsalJobs:
    """The requests, writing under `output`; `training`, `evaluation`: (module, arguments); `build_id` keys the jobs."""
    fingerprint = sha256_json({"output": output, "build": build_id})
    (train_module, train_arguments), (eval_module, eval_arguments) = training, evaluation
    resume = JobRequest(
        asset=REHEARSAL_ASSET,
        kind="training",
        module=train_module,
        fingerprint=fingerprint,
        inputs={"train": warm.uri},
        outputs={"out": join(output, "model")},
        arguments=train_arguments,
        processes_per_host=processes,
        lease=lease,
    )
    evaluate = JobRequest(
        asset=REHEARSAL_EVALUATION,
        kind="processing",
        module=eval_module,
        fingerprint=fingerprint,
        inputs={"model": resume.outputs["out"], "shards": warm.uri},
        outputs={"out": join(output, "report")},
        arguments=eval_arguments,
        lease=lease,
    )
    stop = replace(resume, arguments={**train_arguments, "stop_after_steps": stop_after_steps})
    return RehearsalJobs(stop, resume, evaluate, stop_after_steps, steps, key, key_inputs, warm)


def run_rehearsal(
    context: AssetExecutionContext, jobs: JobRunner, planned: RehearsalJobs, preflight: list[Finding], output: str
) -> MaterializeResult:
    """Run the three jobs, prove each boundary, and write the record: `rehearsal.json`, then `manifest.json`."""
    stopped = forced_stop(context, jobs, planned.stop, planned.stop_after_steps)
    invocation, extra = jobs.run(context, planned.resume)
    trained = _plain(invocation.get_materialize_result().metadata)
    launched = {**trained, **_plain(extra)}
    proved = {
        "preflight": [finding.line() for finding in preflight],
        "forced_stop": stopped,
        "resume": resumed(trained, planned, launched),
        "multi_node": multi_node(trained, launched),
        "wandb": wandb_login(trained, planned.resume.arguments),
        "shards": {
            "location": planned.warm.uri,
            "on_fsx": planned.warm.uri.startswith("fsx://"),
            "rows": trained.get("dagster/row_count"),
        },
    }
    context.log.info(f"rehearsal: resumed at step {planned.stop_after_steps} and trained to step {planned.steps}")
    evaluation, extra = jobs.run(context, planned.evaluate)
    evaluated = {**_plain(evaluation.get_materialize_result().metadata), **_plain(extra)}
    proved["evaluation"] = evaluation_ran(evaluated, planned)
    record = {
        "format": RECORD_FORMAT,
        REHEARSAL_KEY: planned.key,
        REHEARSAL_KEY_INPUTS: planned.key_inputs,
        "proved": proved,
        "warm_state": {"uri": planned.warm.uri, "data_version": planned.warm.data_version},
        "jobs": {"training": launched.get("job_name"), "evaluation": evaluated.get("job_name")},
    }
    write_record(output, record)
    costs = {key: round(sum(float(m.get(key) or 0) for m in (stopped, launched, evaluated)), 4) for key in COST_KEYS}
    return MaterializeResult(
        metadata={
            REHEARSAL_KEY: planned.key,
            REHEARSAL_KEY_INPUTS: MetadataValue.json(planned.key_inputs),
            "rehearsal": "passed",
            "forced_stop_step": planned.stop_after_steps,
            "resumed_from_step": proved["resume"]["resumed_from_step"],
            "steps": proved["resume"]["steps"],
            "world_size": proved["multi_node"]["world_size"],
            "instance_count": proved["multi_node"]["instances"],
            "preflight": MetadataValue.md("\n".join(f"- {line}" for line in proved["preflight"]) or "(none)"),
            **({"wandb_run": MetadataValue.url(proved["wandb"]["run"])} if proved["wandb"].get("run") else {}),
            **({"mAP": proved["evaluation"]["mAP"]} if proved["evaluation"].get("mAP") is not None else {}),
            "training_job": launched.get("job_name", ""),
            "evaluation_job": evaluated.get("job_name", ""),
            **{key: value for key, value in costs.items() if value},
        },
        data_version=DataVersion(sha256_json(record)),
    )


def forced_stop(context: AssetExecutionContext, jobs: JobRunner, request: JobRequest, after: int) -> dict[str, Any]:
    """Run the first attempt, which must fail with its forced stop at step `after`; what it reported."""
    expected = f"{FORCED_STOP} at step {after} "
    try:
        jobs.run(context, request)
    except Failure as failure:
        reason = failure.description or ""
        if expected not in reason:
            raise Failure(
                f"rehearsal: the first training attempt failed, but not with its {FORCED_STOP} after {after} steps: "
                f"{reason}",
                allow_retries=False,
            ) from failure
        context.log.info(f"rehearsal: the first attempt stopped itself as asked ({reason.splitlines()[0][:200]})")
        used = _plain(failure.metadata)  # a SageMaker job's instance-seconds and cost, in its failure
        return {
            "after_steps": after,
            "reason": reason[reason.index(FORCED_STOP) :].splitlines()[0][:300],
            **{key: used[key] for key in COST_KEYS if key in used},
        }
    raise Failure(
        f"rehearsal: the first training attempt ran to its end instead of stopping after {after} steps: "
        f"{request.module} must take --stop-after-steps (docs/local-backend.md, 'Your own trainer')",
        allow_retries=False,
    )


def resumed(trained: dict[str, Any], planned: RehearsalJobs, launched: dict[str, Any]) -> dict[str, Any]:
    """Check the second attempt resumed from the forced stop's checkpoint and trained to the end."""
    start, steps = trained.get("resumed_from_step"), trained.get("steps")
    if start != planned.stop_after_steps or steps != planned.steps:
        raise Failure(
            f"rehearsal: the forced stop checkpointed at step {planned.stop_after_steps}, but the next attempt "
            f"resumed from step {start} and ended at step {steps} (of {planned.steps}): the checkpoint did not "
            "survive between attempts, or the trainer does not resume from ZERO_CHECKPOINT_DIR",
            allow_retries=False,
        )
    prefix = launched.get("checkpoint_uri") or trained.get("checkpoint_dir")
    return {"resumed_from_step": start, "steps": steps, "checkpoint_prefix": prefix}


def multi_node(trained: dict[str, Any], launched: dict[str, Any]) -> dict[str, Any]:
    """Check the resumed attempt ran on two or more processes (on SageMaker, two or more instances)."""
    world, instances = int(trained.get("world_size") or 0), int(launched.get("instance_count") or 1)
    backend = launched.get("backend")
    if world < 2 or (backend == "sagemaker" and instances < 2):
        where = f"{instances} instance(s)" if backend == "sagemaker" else f"{world} process(es)"
        raise Failure(
            f"rehearsal: training ran on a world of {world} on {where}; the rehearsal proves a multi-node start "
            "on two or more (SageMaker: ZERO_SM_TRAINING_REHEARSAL_INSTANCE_COUNT; locally: its `processes`)",
            allow_retries=False,
        )
    return {"world_size": world, "instances": instances}


def wandb_login(trained: dict[str, Any], arguments: dict[str, Any]) -> dict[str, Any]:
    """Check that with online tracking the trainer reported its W&B run (it logged in)."""
    mode = arguments.get("wandb_mode")
    if mode != "online":
        return {"mode": mode}
    run = trained.get("wandb_run")
    if not run:
        raise Failure(
            "rehearsal: wandb_mode is online, but the trainer reported no W&B run: it did not log in",
            allow_retries=False,
        )
    return {"mode": mode, "run": str(run)}


def evaluation_ran(evaluated: dict[str, Any], planned: RehearsalJobs) -> dict[str, Any]:
    """Check the evaluator wrote its output, manifest included."""
    if not exists(join(planned.report_uri, MANIFEST)):
        raise Failure(
            f"rehearsal: the evaluator {planned.evaluate.module} wrote no {MANIFEST} in {planned.report_uri}",
            allow_retries=False,
        )
    score = evaluated.get("mAP")
    return {"module": planned.evaluate.module, "mAP": score if isinstance(score, (int, float)) else None}


def write_record(output: str, record: dict[str, Any]) -> None:
    """`rehearsal.json`, then the output's manifest naming it and the two jobs' manifests (written last)."""
    data = json.dumps(record, indent=1, sort_keys=True, default=str).encode()
    write_bytes_atomic(join(output, RECORD), data)
    files = {RECORD: data}
    for folder in ("model", "report"):
        files[f"{folder}/{MANIFEST}"] = read_bytes(join(output, f"{folder}/{MANIFEST}"))
    listed = {name: {"bytes": len(body), "sha256": sha256_bytes(body)} for name, body in files.items()}
    manifest = {"format": RECORD_FORMAT, "files": listed}
    write_bytes_atomic(join(output, MANIFEST), json.dumps(manifest, indent=1, sort_keys=True).encode())


def _plain(metadata: Any) -> dict[str, Any]:
    """A Pipes report's metadata as plain values."""
    return {key: getattr(value, "value", value) for key, value in (metadata or {}).items()}
