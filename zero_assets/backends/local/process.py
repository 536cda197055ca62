"""Start a local job process that dies with its run, in an environment that holds no secrets.

Every job process gets its own process group and a parent-death signal (Linux `PR_SET_PDEATHSIG`),
so a Dagster process killed with SIGKILL takes its job with it (torchrun's workers follow their
launcher, see `training_code.lib.distributed.die_with_launcher`), and whatever the job started is
killed with its group when the job ends. The death signal only reaches one link of the chain, the
process that started the job: when that is a step worker of Dagster's multiprocess executor, it is the
run worker that may die, and `end_orphaned_jobs` (called by `zero_assets.launch.run_owner`, which
watches the run worker) kills every job this process started, their whole trees, in whatever group.

The environment is built from an allow-list instead of the Dagster process's own: job scripts decode
untrusted files and must not see the database password or API keys. `run_with_pipes` is the local
Pipes client: Dagster's subprocess client always passes the whole environment on, so the session is
opened here with the same temp-file context injector, and a temp-file message reader that parses whole
lines only (`pipes_messages`).

A job's output (stdout and stderr, merged as CloudWatch keeps them) goes through a pipe that a thread
copies to its `job.log` and to this process's stdout, which Dagster captures as the step's stdout:
the job's lines are read in the UI's stdout tab, never one Dagster event per line.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from dagster import (
    AssetExecutionContext,
    DagsterExecutionInterruptedError,
    PipesClientCompletedInvocation,
    PipesTempFileContextInjector,
    open_pipes_session,
)
from dagster._core.errors import DagsterPipesExecutionError  # not exported by dagster

from .pipes_messages import WholeLineMessageReader

log = logging.getLogger("zero.jobs")
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
STOP_GRACE_S = 30.0  # a stopped job gets this long after SIGTERM to save a checkpoint, as SageMaker's stop gives

# What a job may see of the Dagster process's environment: the system basics, Python, the numeric
# and distributed runtimes, and this project's own settings. Nothing whose name says it is a secret.
ALLOWED_NAMES = {
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "TERM",
    "TZ",
    "TMPDIR",
    "TEMP",
    "TMP",
    "LANG",
    "LANGUAGE",
    "VIRTUAL_ENV",
    "LD_LIBRARY_PATH",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "CUDA_VISIBLE_DEVICES",
    "HF_HOME",
    "HF_DATASETS_CACHE",
    "HF_DATASETS_OFFLINE",
    "HF_HUB_OFFLINE",
    "WANDB_MODE",
    "WANDB_DIR",
    "WANDB_SILENT",
}
ALLOWED_PREFIXES = (
    "LC_",
    "PYTHON",
    "OMP_",
    "MKL_",
    "OPENBLAS_",
    "KMP_",
    "TORCH",
    "NCCL_",
    "GLOO_",
    "CUDA_",
    "NVIDIA_",
    "ZERO_",
)
AWS_PREFIXES = ("AWS_",)  # only for jobs that read or write s3:// themselves
SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|API_KEY|CREDENTIAL|PRIVATE", re.IGNORECASE)


def job_environment(
    extra: Mapping[str, str], *, s3_access: bool, source: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The allow-listed part of `source` (default: this process's environment), then `extra`.

    With `s3_access`, the AWS_* variables (credentials included) pass too: the job needs them."""
    source = os.environ if source is None else source
    prefixes = ALLOWED_PREFIXES + (AWS_PREFIXES if s3_access else ())
    kept = {}
    for name, value in source.items():
        allowed = name in ALLOWED_NAMES or name.startswith(prefixes)
        if allowed and (not SECRET_NAME.search(name) or (s3_access and name.startswith(AWS_PREFIXES))):
            kept[name] = value
    return {**kept, **extra}


def _die_with_parent(parent: int, prctl) -> None:
    """In the child before exec: ask the kernel for SIGKILL when the parent dies (async-signal-safe calls only)."""
    if prctl is not None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the request took effect
        os.kill(os.getpid(), signal.SIGKILL)


class JobProcess(subprocess.Popen):
    """A job process whose merged output a thread copies to its job log and to this process's stdout
    (each line after `prefix`, which names the host of a multi-host job). `end_process_group` waits for the copy."""

    def __init__(self, command: Sequence[str], *, log: Path, prefix: str = "", **popen_args) -> None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log_file = log.open("wb")  # opened first: a log that cannot be written fails the start, not the copy
        try:
            super().__init__(list(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **popen_args)
        except BaseException:
            log_file.close()
            raise
        self.log = log
        self.copy = threading.Thread(
            target=copy_output, args=(self.stdout, log_file, prefix), name=f"job-output-{self.pid}", daemon=True
        )
        self.copy.start()


_stdout_lock = threading.Lock()  # several hosts' copies write whole lines to one stdout
_running: set[subprocess.Popen] = set()  # the job processes this process started and has not ended
_running_lock = threading.Lock()
_orphaned = threading.Event()  # set once this process's run worker died: its jobs are being killed


def copy_output(pipe: IO[bytes], log_file: IO[bytes], prefix: str) -> None:
    """Copy `pipe` line by line to `log_file` (as written) and to `sys.stdout` (after `prefix`) until the
    job and everything holding its output have exited. Both are flushed per line: `tail -f job.log` and
    the UI's stdout tab follow the job as it runs. `sys.stdout` is looked up per line, so Dagster's
    capture of the step (a redirection of the file behind it) is where the lines go.

    A destination that fails (a full disk, a closed stdout) is dropped, and the pipe is still read
    to its end: a job whose output nobody reads would block on its next write."""
    to_log, to_stdout = True, True
    with pipe, log_file:
        for line in iter(pipe.readline, b""):
            if to_log:
                try:
                    log_file.write(line)
                    log_file.flush()
                except OSError as error:
                    to_log = False
                    log.warning(
                        "job output: writing %s failed (%s); its lines go on to stdout only", log_file.name, error
                    )
            if to_stdout:
                text = line.decode("utf-8", errors="replace").rstrip("\r\n")
                try:
                    with _stdout_lock:
                        sys.stdout.write(f"{prefix}{text}\n")
                        sys.stdout.flush()
                except (OSError, ValueError) as error:
                    to_stdout = False
                    log.warning(
                        "job output: writing stdout failed (%s); its lines go on to %s only", error, log_file.name
                    )


def start_job_process(
    command: Sequence[str], env: Mapping[str, str], cwd: str, log: Path, prefix: str = ""
) -> JobProcess:
    """A job process in its own process group that the kernel kills when this process dies (Linux),
    its output copied to `log` and to this process's stdout (see `JobProcess`)."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None
    parent = os.getpid()
    with _running_lock:  # held across the start: `end_orphaned_jobs` sees every job, or none starts after it
        if _orphaned.is_set():
            raise RuntimeError("this process's Dagster run worker died: no job is started for its run")
        process = JobProcess(
            command,
            log=log,
            prefix=prefix,
            cwd=cwd,
            env=dict(env),
            process_group=0,
            preexec_fn=lambda: _die_with_parent(parent, prctl),
        )
        _running.add(process)
    return process


OUTPUT_DRAIN_S = 10.0  # how long the copy may take to reach the end of the output once the group is gone


def end_process_group(process: subprocess.Popen) -> None:
    """Kill whatever the job started and left behind (its group), and the job itself if still running;
    then let the copy of its output finish (a process outside the group holding the pipe open is not waited for).

    Once the run worker died (`end_orphaned_jobs`), the caller waits here until the process exits: a job
    of a dead run reports nothing more into it."""
    while _orphaned.is_set():
        time.sleep(1)
    with _running_lock:
        _running.discard(process)
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is empty: everything already exited
    if process.poll() is None:
        process.kill()
    process.wait()
    if isinstance(process, JobProcess):
        process.copy.join(OUTPUT_DRAIN_S)


def stop_job_process(process: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM to the job's group (a training job saves a checkpoint), SIGKILL after `grace_s`."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    end_process_group(process)


def run_with_pipes(
    context: AssetExecutionContext,
    command: Sequence[str],
    env: Mapping[str, str],
    cwd: str,
    log: Path,
    prefix: str = "",
) -> PipesClientCompletedInvocation:
    """Run the job through Dagster Pipes; raises `DagsterPipesExecutionError` when it exits non-zero.

    Its output goes to `log` and the step's stdout (see `JobProcess`). A terminated Dagster run stops
    the job (SIGTERM, then SIGKILL); however the job ends, nothing it started outlives it."""
    with open_pipes_session(
        context=context, context_injector=PipesTempFileContextInjector(), message_reader=WholeLineMessageReader()
    ) as session:
        process = start_job_process(command, {**env, **session.get_bootstrap_env_vars()}, cwd, log, prefix)
        try:
            process.wait()
        except DagsterExecutionInterruptedError:
            context.log.info(
                f"run interrupted: stopping job process {process.pid} (SIGTERM, SIGKILL after {STOP_GRACE_S:.0f} s)"
            )
            stop_job_process(process)
            raise
        finally:
            end_process_group(process)
        if process.returncode != 0:
            raise DagsterPipesExecutionError(f"External execution process failed with code {process.returncode}")
    return PipesClientCompletedInvocation(session)


def _parents() -> dict[int, list[int]]:
    """Every process's children, from one read of /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:  # it ended while we looked
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    return children


def _signal(pid: int, number: int) -> None:
    try:
        os.kill(pid, number)
    except (ProcessLookupError, PermissionError):
        pass  # already gone (or its pid reused by a process that is not ours)


def kill_process_tree(root: int) -> list[int]:
    """SIGKILL `root` and every process below it, in whatever session or group (torchrun's workers
    and a W&B service have their own, so a group kill misses them). Each level is stopped (SIGSTOP)
    before its children are read, so nothing forks or is reparented away while the tree is walked.
    Returns the pids signalled."""
    if not Path("/proc").is_dir():  # no process table to walk: the job's group is all that can be found
        _signal(-root, signal.SIGKILL)
        return [root]
    found, level = [], [root]
    while level:
        for pid in level:
            _signal(pid, signal.SIGSTOP)
        found += level
        children = _parents()
        level = [child for pid in level for child in children.get(pid, []) if child not in found]
    for pid in found:
        _signal(pid, signal.SIGKILL)
    return found


def end_orphaned_jobs() -> list[int]:
    """This process's run worker died: SIGKILL every job it started, with everything below each job and
    in each job's group, and start none after. Whoever waits for a job is held in `end_process_group`
    until the process exits (see `zero_assets.launch.run_owner`). Returns the pids killed."""
    with _running_lock:
        _orphaned.set()
        jobs = list(_running)
    killed = []
    for job in jobs:
        killed += kill_process_tree(job.pid)
        _signal(-job.pid, signal.SIGKILL)  # what the job started and left behind in its group
    return killed
