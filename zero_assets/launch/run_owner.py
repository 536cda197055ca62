"""Which process runs a Dagster run (recorded in its tags, as Dagster records no pid for runs it did not launch),
and failing a run of this host whose process is gone, so no dead run holds pool slots."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from dagster import AssetExecutionContext, DagsterInstance, DagsterRun, DagsterRunStatus, RunsFilter

from zero_assets.backends.local.process import end_orphaned_jobs

HOST_TAG = "zero/run_worker_host"
WORKER_TAG = "zero/run_worker"
IN_PROGRESS = [DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]
WATCH_INTERVAL_S = 0.25
REPORT_TIMEOUT_S = 20.0  # how long an orphaned step tries to record its run's failure before it exits anyway


@dataclass(frozen=True)
class RunWorker:
    """A process as this host's kernel names it: pid plus start time, as a pid alone may be reused."""

    host: str
    pid: int
    started: str  # start time in clock ticks since boot ("" where there is no /proc)
    boot: str
    pid_namespace: str
    run_id: str

    def tag_value(self) -> str:
        return (
            f"pid={self.pid} started={self.started} boot={self.boot} pid_namespace={self.pid_namespace} "
            f"run={self.run_id}"
        )

    @classmethod
    def from_tags(cls, run: DagsterRun) -> RunWorker | None:
        """The run worker recorded for `run`; None when none is, or a re-execution copied its parent's tags."""
        host, value = run.tags.get(HOST_TAG), run.tags.get(WORKER_TAG)
        if not host or not value:
            return None
        fields = dict(part.split("=", 1) for part in value.split() if "=" in part)
        if fields.get("run") != run.run_id or not fields.get("pid", "").isdigit():
            return None
        return cls(
            host=host,
            pid=int(fields["pid"]),
            started=fields.get("started", ""),
            boot=fields.get("boot", ""),
            pid_namespace=fields.get("pid_namespace", ""),
            run_id=run.run_id,
        )


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def _start_time(pid: int) -> str | None:
    """The start time of `pid` in clock ticks, "" without /proc; None when it is not running (zombies included)."""
    fields = _read(f"/proc/{pid}/stat").rsplit(")", 1)[-1].split()
    if len(fields) >= 20:
        return None if fields[0] in ("Z", "X") else fields[19]  # field 22 of stat, counted after the name
    try:  # no /proc, or hidepid: ask the kernel whether it exists
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # it exists, owned by someone else
    return ""


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def this_process(run_id: str) -> RunWorker:
    pid = os.getpid()
    return RunWorker(
        host=socket.gethostname(),
        pid=pid,
        started=_start_time(pid) or "",
        boot=_read("/proc/sys/kernel/random/boot_id"),
        pid_namespace=_pid_namespace(),
        run_id=run_id,
    )


def record_run_worker(instance: DagsterInstance, run_id: str) -> RunWorker:
    worker = this_process(run_id)
    instance.add_run_tags(run_id, {HOST_TAG: worker.host, WORKER_TAG: worker.tag_value()})
    return worker


def why_gone(worker: RunWorker) -> str | None:
    """Why `worker` is certainly gone; None while it runs or when this host cannot tell (other host or namespace)."""
    here = this_process(worker.run_id)
    if worker.host != here.host:
        return None
    if worker.boot and here.boot and worker.boot != here.boot:
        return f"host {worker.host} restarted since run worker pid {worker.pid} recorded itself"
    if worker.pid_namespace != here.pid_namespace:
        return None
    started = _start_time(worker.pid)
    if started is None:
        return f"its run worker, pid {worker.pid} on {worker.host}, has exited"
    if worker.started and started and started != worker.started:
        return f"its run worker, pid {worker.pid} on {worker.host}, has exited (the pid is another process's now)"
    return None


def fail_run(instance: DagsterInstance, run_id: str, reason: str) -> bool:
    """Mark an in-progress run failed (or canceled) for `reason` and free its pool slots; False if it had finished."""
    run = instance.get_run_by_id(run_id)
    if run is None or run.status not in IN_PROGRESS:
        return False
    message = f"{reason}: the run is marked {{}} and its pool slots are freed (zero_assets.launch.run_owner)"
    if run.status == DagsterRunStatus.CANCELING:
        instance.report_run_canceled(run, message=message.format("canceled"))
    else:
        instance.report_run_failed(run, message=message.format("failed"))
    if instance.event_log_storage.supports_global_concurrency_limits:
        instance.event_log_storage.free_concurrency_slots_for_run(run_id)
    return True


def fail_dead_runs(instance: DagsterInstance) -> dict[str, str]:
    """Fail every in-progress run whose run worker on this host is gone; returns {run id: why}."""
    failed = {}
    host = socket.gethostname()
    for run in instance.get_runs(filters=RunsFilter(statuses=IN_PROGRESS, tags={HOST_TAG: host})):
        worker = RunWorker.from_tags(run)
        reason = why_gone(worker) if worker else None
        if reason and fail_run(instance, run.run_id, reason):
            failed[run.run_id] = reason
    return failed


_watched: set[str] = set()  # the runs this process watches the run worker of (a step worker runs one)


def watch_over_step(context: AssetExecutionContext) -> None:
    """Record the run worker, fail dead runs, and in a separate step worker end the step with it."""
    instance, run_id = context.instance, context.run.run_id
    if run_id in _watched:
        return
    _watched.add(run_id)
    run = instance.get_run_by_id(run_id)
    worker = (RunWorker.from_tags(run) if run else None) or record_run_worker(instance, run_id)
    for dead, reason in fail_dead_runs(instance).items():
        context.log.warning(f"run {dead}: {reason}; marked failed, its pool slots freed")
    here = this_process(run_id)
    if worker.pid != here.pid and (worker.host, worker.pid_namespace) == (here.host, here.pid_namespace):
        threading.Thread(
            target=_watch_run_worker, args=(instance, worker), name=f"run-worker-{worker.pid}", daemon=True
        ).start()


def _watch_run_worker(instance: DagsterInstance, worker: RunWorker) -> None:
    while (reason := why_gone(worker)) is None:
        time.sleep(WATCH_INTERVAL_S)
    _end_orphaned_step(instance, worker, reason)


def _end_orphaned_step(instance: DagsterInstance, worker: RunWorker, reason: str) -> None:
    """Kill the local jobs, record the run's failure (bounded), and exit without another event."""
    killed = end_orphaned_jobs()
    print(
        f"zero_assets: run {worker.run_id}: {reason}; killed its local jobs ({len(killed)} processes)",
        file=sys.stderr,
        flush=True,
    )
    recorder = threading.Thread(target=fail_run, args=(instance, worker.run_id, reason), daemon=True)
    recorder.start()
    recorder.join(REPORT_TIMEOUT_S)
    os._exit(1)
