"""Start a local job process that dies with its run, in an environment that holds no secrets, and read
its Pipes messages.

Each job gets its own process group and a parent-death signal; its merged output goes to `job.log` and
the step's stdout. The environment is allow-listed, as job scripts decode untrusted files.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from dagster import (
    AssetExecutionContext,
    DagsterExecutionInterruptedError,
    PipesClientCompletedInvocation,
    PipesMessageHandler,
    PipesMessageReader,
    PipesTempFileContextInjector,
    open_pipes_session,
)
from dagster_pipes import PipesDefaultMessageWriter, PipesParams

log = logging.getLogger("zero.jobs")
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
STOP_GRACE_S = 30.0  # a stopped job gets this long after SIGTERM to save a checkpoint, as SageMaker's stop gives

# What a job may see of the Dagster process's environment; never a name that says it is a secret.
ALLOWED_NAMES = set(
    "PATH HOME USER LOGNAME SHELL TERM TZ TMPDIR TEMP TMP LANG LANGUAGE VIRTUAL_ENV LD_LIBRARY_PATH SSL_CERT_FILE "
    "SSL_CERT_DIR CUDA_VISIBLE_DEVICES HF_HOME HF_DATASETS_CACHE HF_DATASETS_OFFLINE HF_HUB_OFFLINE WANDB_MODE "
    "WANDB_DIR WANDB_SILENT".split()
)
ALLOWED_PREFIXES = tuple("LC_ PYTHON OMP_ MKL_ OPENBLAS_ KMP_ TORCH NCCL_ GLOO_ CUDA_ NVIDIA_ ZERO_".split())
AWS_PREFIXES = ("AWS_",)  # only for jobs that read or write s3:// themselves
SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|API_KEY|CREDENTIAL|PRIVATE", re.IGNORECASE)


class JobExitedNonZero(Exception):
    """The job process ended with a non-zero exit code (its failure reason is in its output folder)."""


def job_environment(extra: Mapping[str, str], *, s3_access: bool) -> dict[str, str]:
    """The allow-listed environment, then `extra`; with `s3_access`, the AWS_* variables too."""
    prefixes = ALLOWED_PREFIXES + (AWS_PREFIXES if s3_access else ())
    kept = {}
    for name, value in os.environ.items():
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
    """A job process whose merged output a thread copies to its job log and to stdout (after `prefix`)."""

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
    """Copy `pipe` line by line to `log_file` and to `sys.stdout` (looked up per line, for Dagster's step
    capture), after `prefix`. A failing destination is dropped, but the pipe is read to its end, or the job
    would block on its next write."""
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
    """A job process in its own process group, killed by the kernel when this process dies (Linux)."""
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
    """Kill the job's group and the job, then let its output copy finish (bounded); blocks once orphaned."""
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
    """Run the job through Pipes with our own environment; `JobExitedNonZero` on a non-zero exit."""
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
            raise JobExitedNonZero(f"the job process exited with code {process.returncode}")
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
    """SIGKILL `root` and every process below it, in any group, each level SIGSTOPped first; the pids."""
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
    """SIGKILL every job this process started, trees and groups, and start none after; the pids killed."""
    with _running_lock:
        _orphaned.set()
        jobs = list(_running)
    killed = []
    for job in jobs:
        killed += kill_process_tree(job.pid)
        _signal(-job.pid, signal.SIGKILL)  # what the job started and left behind in its group
    return killed


POLL_S = 0.01  # as Dagster's tail


def whole_lines(path: str, finished: Callable[[], bool]) -> Iterator[str]:
    """The lines appended to `path`, each once whole, until `finished()` and nothing is left to read."""
    with open(path, encoding="utf-8") as stream:
        pending = ""
        while True:
            ending = finished()  # before the read: what was written before the end is read below
            piece = stream.readline()
            if piece:
                pending += piece
                if pending.endswith("\n"):
                    yield pending
                    pending = ""
            elif ending:
                if pending:
                    yield pending
                return
            else:
                time.sleep(POLL_S)


class WholeLineMessageReader(PipesMessageReader):
    """A local job's Pipes messages from a temp file, each line parsed once whole: Dagster's
    `PipesTempFileMessageReader` parses a partial line of a long message, which stops its thread and loses
    every later message (its reading thread is private, so this is built on `PipesMessageReader`)."""

    @contextmanager
    def read_messages(self, handler: PipesMessageHandler) -> Iterator[PipesParams]:
        with tempfile.TemporaryDirectory(prefix="zero-pipes-") as folder:
            path = os.path.join(folder, "messages.jsonl")
            open(path, "w").close()
            ended = threading.Event()
            reader = threading.Thread(
                target=self._read, args=(path, handler, ended), daemon=True, name="zero-pipes-reader"
            )
            reader.start()
            try:
                yield {
                    PipesDefaultMessageWriter.FILE_PATH_KEY: path,
                    PipesDefaultMessageWriter.INCLUDE_STDIO_IN_MESSAGES_KEY: False,
                }
            finally:
                ended.set()
                reader.join()

    @staticmethod
    def _read(path: str, handler: PipesMessageHandler, ended: threading.Event) -> None:
        try:
            for line in whole_lines(path, ended.is_set):
                handler.handle_message(json.loads(line))
        except Exception:
            handler.report_pipes_framework_exception("the local jobs' Pipes message reader", sys.exc_info())
            raise

    def no_messages_debug_text(self) -> str:
        return "Attempted to read messages from a local temporary file."
