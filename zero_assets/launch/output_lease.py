"""One builder per output: a lease file that a second run with the same fingerprint waits on.

The lease names its owner (Dagster run id, host, pid and the pid's start time, so a reused pid is
not mistaken for the owner) and carries a heartbeat: its file's mtime, renewed by a thread while the
owner builds. Another run takes it over only when the owner is gone: its process is dead (same host)
or its heartbeat is older than `stale_after_s` (any host). Every change to the lease file happens
under a short `flock` on a guard file beside it, so two waiters never both take a stale lease over.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from training_code.lib.storage import write_bytes_atomic

LEASE_FILE = "lease.json"
HEARTBEAT_S = 2.0
STALE_AFTER_S = 60.0  # a live owner renews every HEARTBEAT_S; this long without one means it is gone
POLL_S = 0.5


@dataclass(frozen=True)
class Lease:
    path: Path
    token: str
    waited_for: str | None  # the run id this run waited for, when it had to wait
    took_over: str | None  # the run id whose lease was taken over because it was gone


def output_lease_path(jobs_root: Path, asset: str, fingerprint: str) -> Path:
    """The lease of one output: `<jobs root>/<asset>/<fingerprint[:16]>/lease.json`, in the folder that
    also holds the output's job folders and checkpoints (`core.job_request.materialization_folder`),
    on this machine even for an s3:// lake. In-process assets, which have no job folders, lease there too."""
    return Path(jobs_root) / asset / fingerprint[:16] / LEASE_FILE


def _process_start(pid: int) -> str | None:
    """The kernel's start time of `pid` (field 22 of /proc/<pid>/stat), None when it does not exist."""
    if not Path("/proc/self/stat").exists():  # no procfs: whether the pid exists is all there is to know
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return "alive"
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):  # no such process (or no /proc: then only the heartbeat judges)
        return None


def owner_record(run_id: str, token: str) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "token": token,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "pid_start": _process_start(os.getpid()),
        "taken_at": time.time(),
    }


def owner_gone(record: dict[str, Any], heartbeat_age_s: float, stale_after_s: float) -> str | None:
    """Why the lease's owner is gone (None while it is alive): a dead process on this host, or a stale heartbeat."""
    if record.get("host") == socket.gethostname() and isinstance(record.get("pid"), int):
        started = _process_start(record["pid"])
        if started is None or (record.get("pid_start") is not None and started != record["pid_start"]):
            return f"its process {record['pid']} on {record['host']} is gone"
    if heartbeat_age_s > stale_after_s:
        return f"its heartbeat is {heartbeat_age_s:.0f} s old (stale after {stale_after_s:.0f} s)"
    return None


@contextmanager
def _guard(path: Path) -> Iterator[None]:
    with open(path.with_name(path.name + ".guard"), "a+") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(guard, fcntl.LOCK_UN)


def _read(path: Path) -> tuple[dict[str, Any], float] | None:
    """The lease's record and heartbeat age, None when there is no lease."""
    try:
        age = time.time() - path.stat().st_mtime
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except ValueError:  # written atomically, so unreadable means foreign or damaged: judge it by its heartbeat alone
        record = {}
    return (record if isinstance(record, dict) else {}), age


def try_acquire(
    path: Path, run_id: str, stale_after_s: float = STALE_AFTER_S
) -> tuple[Lease | None, dict[str, Any] | None]:
    """Take the lease if it is free or its owner is gone; else (None, the owner's record)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex
    with _guard(path):
        current = _read(path)
        took_over = None
        if current is not None:
            record, age = current
            gone = owner_gone(record, age, stale_after_s)
            if gone is None:
                return None, record
            took_over = f"{record.get('run_id', 'unknown run')} ({gone})"
        write_bytes_atomic(path, json.dumps(owner_record(run_id, token), indent=1).encode())
    return Lease(path, token, None, took_over), None


def _owns(path: Path, token: str) -> bool:
    current = _read(path)
    return current is not None and current[0].get("token") == token


def _heartbeat(path: Path, token: str, stop: threading.Event, interval: float) -> None:
    while not stop.wait(interval):
        with _guard(path):
            if not _owns(path, token):
                return  # taken over: this run was judged gone; its publish still ends with the marker
            os.utime(path)


@contextmanager
def hold_lease(
    path: Path,
    run_id: str,
    *,
    on_wait: Callable[[dict[str, Any]], None] = lambda record: None,
    stale_after_s: float = STALE_AFTER_S,
    heartbeat_s: float = HEARTBEAT_S,
    poll_s: float = POLL_S,
) -> Iterator[Lease]:
    """Hold the lease at `path` for the block, waiting while another live run holds it.

    `on_wait` is called once with the owner's record when this run has to wait."""
    waited_for = None
    while True:
        lease, owner = try_acquire(path, run_id, stale_after_s)
        if lease is not None:
            break
        if waited_for is None:
            waited_for = str(owner.get("run_id", "unknown run"))
            on_wait(owner)
        time.sleep(poll_s)
    lease = replace(lease, waited_for=waited_for)
    stop = threading.Event()
    beat = threading.Thread(
        target=_heartbeat, args=(path, lease.token, stop, heartbeat_s), name="output-lease-heartbeat", daemon=True
    )
    beat.start()
    try:
        yield lease
    finally:
        stop.set()
        beat.join()
        with _guard(path):
            if _owns(path, lease.token):
                path.unlink()
