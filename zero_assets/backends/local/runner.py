"""Run job scripts on this machine with SageMaker's container contract, through Dagster Pipes.

Each run of a job gets its own `/opt/ml` folder (`.../runs/<run id>/<job name>/`); on success its staged
outputs move to their destinations, manifests last, as SageMaker uploads them. A search runs each trial
as the training job itself, a few at a time; a warm start does not run a draw an earlier search ran.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from dagster import AssetExecutionContext, Failure, MetadataValue, PipesClientCompletedInvocation

from training_code.lib.hashing import sha256_json
from training_code.lib.job_env import input_uri_variable
from training_code.lib.storage import MANIFEST_NAMES, download_prefix, is_s3, join, publish_folder
from zero_assets.backends.job_cost import INSTANCE_SECONDS, local_cost
from zero_assets.backends.job_runner import JobRunner, TuningRun, WarmedShards
from zero_assets.backends.local.process import (
    JobExitedNonZero,
    end_process_group,
    job_environment,
    run_with_pipes,
    start_job_process,
)
from zero_assets.backends.local.warm_state import SETS, set_channel, set_folder, warm_shard_set
from zero_assets.core.fingerprints import UpstreamOutput
from zero_assets.core.job_request import RUNS_FOLDER, JobRequest, Work, materialization_folder
from zero_assets.core.settings import REPO_ROOT, ZeroSettings
from zero_assets.core.tuning import TuningSpec

LOG_TAIL_LINES = 30


class LocalJobRunner(JobRunner):
    """The embedded default backend: the job scripts as subprocesses of the Dagster run."""

    settings: ZeroSettings
    python: str = sys.executable

    # asset -> hosts its planned Processing job spreads over (a fan-out); one unless set.
    instances: dict[str, int] = {}

    def instance_count(self, request: JobRequest, work: Work) -> int:
        return self.instances.get(request.asset, 1)

    def read_list_uri(self, request: JobRequest) -> str:
        """Beside the output's lease, in its job folder: gc keeps it while the output is named."""
        return str(materialization_folder(self.settings.jobs_root(), request) / "reads")

    def run(
        self, context: AssetExecutionContext, request: JobRequest
    ) -> tuple[PipesClientCompletedInvocation, dict[str, Any]]:
        run_dir = self.run_folder(request, context.run.run_id)
        hosts = [f"algo-{i + 1}" for i in range(request.instance_count)]
        if len(hosts) > 1 and request.kind != "processing":
            raise ValueError(
                f"{request.asset}: the local backend runs multi-instance jobs for Processing only; "
                "training uses processes_per_host"
            )
        # Several hosts get one `/opt/ml` each, as separate instances would; each gets every input.
        layouts = {host: (run_dir / "hosts" / host if len(hosts) > 1 else run_dir) / "opt" / "ml" for host in hosts}
        paths = {host: self._lay_out(opt_ml, request) for host, opt_ml in layouts.items()}
        first, others = hosts[0], hosts[1:]
        context.log.info(
            f"launching local {request.kind} job {request.job_name} on {len(hosts)} host(s): "
            f"{' '.join(self._command(request, paths[first]))}"
        )
        started = time.perf_counter()

        def launch(host: str) -> tuple:  # command, environment, cwd, log and `[host] ` for a multi-host job's lines
            environment = self._environment(layouts[host], request, paths[host], host, hosts)
            prefix = f"[{host}] " if len(hosts) > 1 else ""
            return self._command(request, paths[host]), environment, str(REPO_ROOT), _job_log(layouts[host]), prefix

        # Only the first host reports through Pipes, as on SageMaker.
        siblings = {host: start_job_process(*launch(host)) for host in others}
        try:
            invocation = run_with_pipes(context, *launch(first))
            exit_codes = {host: process.wait() for host, process in siblings.items()}
        except JobExitedNonZero as error:
            raise _job_failure(request, layouts[first], first) from error
        finally:  # no host (nor what it started) outlives the job
            for process in siblings.values():
                end_process_group(process)
        for host, code in exit_codes.items():
            if code != 0:
                raise _job_failure(request, layouts[host], host)
        wall = time.perf_counter() - started
        for name, destination in request.outputs.items():  # every host uploads its files to one destination
            merged = name in request.merged_outputs
            publish_output([paths[host][name] for host in hosts], destination, run_dir / "replaced", merged)
        return invocation, {
            "job_name": request.job_name,
            "backend": "local",
            "instance_type": f"local ({os.cpu_count()} cpu)",
            "instance_count": request.instance_count,
            "job_wall_s": round(wall, 2),
            **local_cost(wall, len(hosts)),
            "job_logs": MetadataValue.path(str(layouts[first] / "output" / "job.log")),
        }

    def tune(
        self, context: AssetExecutionContext, request: JobRequest, spec: TuningSpec, earlier: Mapping[str, Any] | None
    ) -> TuningRun:
        """Run each trial as a training job on this machine, `spec.max_parallel_trials` at a time."""
        tuned = [r.name for r in spec.ranges]
        earlier_trials = (earlier or {}).get("trials", [])
        done = {sha256_json(t["hyperparameters"]): t for t in earlier_trials if t["objective"] is not None}
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
            ran = list(
                pool.map(lambda trial: _run_trial(self.run, context, trial, tuned, spec.objective_metric), planned)
            )
        trials = reused + ran
        seconds = sum(t["seconds"] or 0.0 for t in ran)  # the trials' instance-seconds, summed
        job = f"local-tuning-{request.fingerprint[:16]}"
        return TuningRun(job=job, trials=trials, best=spec.best(trials), cost=local_cost(seconds, hosts=1))

    def run_folder(self, request: JobRequest, run_id: str) -> Path:
        return materialization_folder(self.settings.jobs_root(), request) / RUNS_FOLDER / run_id / request.job_name

    def warm_location(self, shards: UpstreamOutput) -> str:
        """`<warm mount>/sets/<data version[:16]>`: the shard set's folder in the folder standing in for FSx."""
        return str(set_folder(self.settings.warm_mount(), shards.data_version))

    def warm_shards(self, context: AssetExecutionContext, shards: UpstreamOutput, lease: str) -> WarmedShards:
        """Warm the set in the folder standing in for FSx, copying only what is not yet warm."""
        mount = self.settings.warm_mount()
        warmed = warm_shard_set(shards.uri, mount, key=Path(self.warm_location(shards)).name)
        context.log.info(f"{warmed.summary()} under {mount}")
        return warmed.as_warmed_shards(mount)

    def warm_set_channel(self, uri: str) -> tuple[Path, str] | None:
        """(the mount, the set's folder in it) when `uri` is a set warm on this runner's mount, else None."""
        return set_channel(uri, self.settings.warm_mount()) if Path(uri).parent.name == SETS else None

    def _lay_out(self, opt_ml: Path, request: JobRequest) -> dict[str, Path]:
        """Create the `/opt/ml` layout afresh (an earlier attempt of the same run may have left one)."""
        for stale in ("input", "processing", "model", "output", "config"):
            shutil.rmtree(opt_ml / stale, ignore_errors=True)
        if request.kind == "training":
            inputs = {name: opt_ml / "input" / "data" / name for name in request.inputs}
            outputs = {name: opt_ml / "model" for name in request.outputs}
        else:
            inputs = {name: opt_ml / "processing" / "input" / name for name in request.inputs}
            outputs = {name: opt_ml / "processing" / "output" / name for name in request.outputs}
        for name, uri in request.inputs.items():
            if (warm := self.warm_set_channel(uri)) is not None:  # the job is told the set by `_command`
                uri = str(warm[0])
            target = inputs[name]
            target.parent.mkdir(parents=True, exist_ok=True)
            if is_s3(uri):
                download_prefix(uri, target)
            else:
                source = Path(uri).resolve()
                if not source.exists():
                    raise FileNotFoundError(f"input {name!r} of job {request.job_name} does not exist: {source}")
                target.symlink_to(source, target_is_directory=source.is_dir())
        for path in [*outputs.values(), opt_ml / "output", opt_ml / "input" / "config"]:
            path.mkdir(parents=True, exist_ok=True)
        return {**inputs, **outputs}

    def _environment(
        self, opt_ml: Path, request: JobRequest, paths: dict[str, Path], host: str, hosts: list[str]
    ) -> dict[str, str]:
        resources = json.dumps({"current_host": host, "hosts": hosts})
        (opt_ml / "input" / "config" / "hyperparameters.json").write_text(json.dumps(request.arguments))
        # Training containers read input/config/resourceconfig.json, Processing containers config/resourceconfig.json.
        (opt_ml / "input" / "config" / "resourceconfig.json").write_text(resources)
        (opt_ml / "config").mkdir(exist_ok=True)
        (opt_ml / "config" / "resourceconfig.json").write_text(resources)
        env = {
            "ZERO_OPT_ML": str(opt_ml),
            "ZERO_JOB_NAME": request.job_name,
            "ZERO_ASSET": request.asset,
            **{input_uri_variable(name): uri for name, uri in request.inputs.items()},
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
            "SM_CURRENT_HOST": host,
            "SM_HOSTS": json.dumps(hosts),
            "SM_NUM_CPUS": str(os.cpu_count()),
            "SM_NUM_GPUS": "0",
            "SM_OUTPUT_DATA_DIR": str(opt_ml / "output" / "data"),
            "SM_HPS": json.dumps(request.arguments),
            "SM_TRAINING_ENV": json.dumps({"job_name": request.job_name, "hosts": hosts}),
        }
        if request.kind == "training":
            if request.processes_per_host > 1 and "OMP_NUM_THREADS" not in os.environ:
                env["OMP_NUM_THREADS"] = "1"  # torchrun's default; set here, its banner stays out of the JSON log
            env["SM_MODEL_DIR"] = str(paths[next(iter(request.outputs))])
            env["ZERO_CHECKPOINT_DIR"] = self.checkpoint_uri(request)
            env["SM_CHANNELS"] = json.dumps(sorted(request.inputs))
            env.update({f"SM_CHANNEL_{name.upper()}": str(paths[name]) for name in request.inputs})
        if request.arguments.get("wandb_mode") == "online" and os.environ.get("WANDB_API_KEY"):
            # The one secret a job may get, and only a job that logs to W&B.
            env["WANDB_API_KEY"] = os.environ["WANDB_API_KEY"]
        return job_environment(env, s3_access=request.reads_s3())

    def checkpoint_uri(self, request: JobRequest) -> str:
        """Checkpoints per output, across runs, so a rerun resumes them; written only by the lease holder."""
        return str(materialization_folder(self.settings.jobs_root(), request) / "checkpoints")

    def _command(self, request: JobRequest, paths: dict[str, Path]) -> list[str]:
        if request.kind == "training":
            launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={request.processes_per_host}"]
            io_arguments = []
        else:
            launcher, io_arguments = [], [token for name, path in paths.items() for token in (f"--{name}", str(path))]
        arguments = [*io_arguments, *request.argument_list(), *self._warm_set_arguments(request)]
        return [self.python, *launcher, "-m", request.module, *arguments]

    def _warm_set_arguments(self, request: JobRequest) -> list[str]:
        """`--training-set sets/<key>` for the job reading a warm set (see `warm_set_channel`)."""
        found = {name: warm[1] for name, uri in request.inputs.items() if (warm := self.warm_set_channel(uri))}
        if len(found) > 1:
            raise ValueError(
                f"{request.asset} has {len(found)} warm shard-set inputs ({sorted(found)}); a job reads one"
            )
        return [argument for folder in found.values() for argument in ("--training-set", folder)]


def publish_output(staged: list[Path], destination: str, replaced: Path, merged: bool = False) -> None:
    """Move staged files to `destination`, manifests last; an existing local one goes to `replaced` unless `merged`."""
    if is_s3(destination):
        for folder in staged:
            publish_folder(folder, destination)
            shutil.rmtree(folder)
        return
    target = Path(destination)
    if target.exists() and not merged:
        shutil.rmtree(replaced, ignore_errors=True)
        replaced.parent.mkdir(parents=True, exist_ok=True)
        os.rename(target, replaced)
    target.mkdir(parents=True, exist_ok=True)
    for folder in staged:
        files = sorted((p for p in folder.rglob("*") if p.is_file()), key=lambda p: (p.name in MANIFEST_NAMES, str(p)))
        for path in files:
            moved = target / path.relative_to(folder)
            moved.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.replace(path, moved)
            except OSError as error:
                if error.errno != errno.EXDEV:
                    raise
                publish_folder(folder, destination)  # another file system: copy what is left, manifests last
                break
        shutil.rmtree(folder)
    shutil.rmtree(replaced, ignore_errors=True)


def _job_failure(request: JobRequest, opt_ml: Path, host: str) -> Failure:
    failure, log = opt_ml / "output" / "failure", _job_log(opt_ml)
    reason = "the script exited non-zero without writing a failure reason"
    reason = failure.read_text().strip() if failure.is_file() else reason
    tail = "(no job log written)"
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]) if log.is_file() else tail
    return Failure(
        description=f"job {request.job_name} failed on {host}: {reason}",
        metadata={
            "job_name": request.job_name,
            "host": host,
            "log_tail": MetadataValue.md(f"```\n{tail}\n```"),
        },
    )


def _job_log(opt_ml: Path) -> Path:
    """The host's job log: stdout and stderr, as CloudWatch keeps them on SageMaker."""
    return opt_ml / "output" / "job.log"


def _trial_request(request: JobRequest, n: int, arguments: dict[str, Any]) -> JobRequest:
    """Trial `n`: the training request with its own arguments, fingerprint and output `trials/<n>`."""
    fingerprint = sha256_json({"tuning": request.fingerprint, "arguments": arguments})
    return replace(
        request,
        fingerprint=fingerprint,
        arguments=arguments,
        outputs={"out": join(request.outputs["out"], f"trials/{n:03d}")},
    )


def _run_trial(run: Callable, context: AssetExecutionContext, trial: JobRequest, tuned: list[str], metric: str) -> dict:
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
