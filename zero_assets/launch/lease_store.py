"""What every output lease is, wherever it is kept: an owner record, a `LeaseStore` that takes, renews and
releases it, and how long an owner may stay silent before it is judged gone; and `FileLeaseStore`, a lease as
a file on this machine for local outputs: its heartbeat the file's mtime, taken over only when the owner's
process is dead or its heartbeat stale, under a `flock` so two waiters never both take it over."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training_code.lib.storage import write_bytes_atomic
from zero_assets.core.settings import zero_env

STALE_AFTER_S = 60.0  # a live owner renews every few seconds; this long without one means it is gone
STALE_VARIABLE = "ZERO_OUTPUT_LEASE_STALE_S"
# Three heartbeats of the slower store (S3), so a live owner is never judged gone between two.
MIN_STALE_S = 10.0


@dataclass(frozen=True)
class Lease:
    location: str  # the lease file's path, or its s3:// URI
    token: str  # this holding's own id: whoever finds it in the lease is the owner
    record: dict[str, Any]  # what the owner wrote (run id, host, pid, token, taken_at)
    version: str | None  # S3: the ETag the owner wrote, the condition of its next write; a file: None
    waited_for: str | None = None  # the run id this run waited for, when it had to wait
    took_over: str | None = None  # the run id whose lease was taken over because it was gone, and why


class LeaseStore(ABC):
    """One output's lease in one place; the owner renews every `heartbeat_s`, a waiter polls every `poll_s`."""

    location: str
    heartbeat_s: float
    poll_s: float

    @abstractmethod
    def try_acquire(self, run_id: str, stale_after_s: float) -> tuple[Lease | None, dict[str, Any] | None]:
        """Take the lease if it is free or its owner is gone; else (None, the owner's record)."""

    @abstractmethod
    def holder(self, stale_after_s: float) -> dict[str, Any] | None:
        """The live owner's record, read only; None when the lease is free or its owner is gone."""

    @abstractmethod
    def renew(self, lease: Lease) -> Lease | None:
        """Renew `lease`; the lease as now written, or None when another run has taken it over."""

    @abstractmethod
    def release(self, lease: Lease) -> None:
        """Remove `lease` (as last written) if it is still this holding's; leave one another run took over."""


def process_start(pid: int) -> str | None:
    """The kernel's start time of `pid` (field 22 of /proc/<pid>/stat), None when it does not exist."""
    if not Path("/proc/self/stat").exists():  # no procfs: only whether the pid exists
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return "alive"
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):  # no such process
        return None


def owner_record(run_id: str, token: str) -> dict[str, Any]:
    """Who holds a lease: the run, and the process on its host (with its start time, against pid reuse)."""
    return {
        "run_id": run_id,
        "token": token,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "pid_start": process_start(os.getpid()),
        "taken_at": time.time(),
    }


def stale_after_s() -> float:
    """How long an owner may go without a heartbeat before its lease is taken over (`ZERO_OUTPUT_LEASE_STALE_S`)."""
    value = zero_env(STALE_VARIABLE)
    if not value:
        return STALE_AFTER_S
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"{STALE_VARIABLE}={value!r} is not a number of seconds") from None
    if seconds < MIN_STALE_S:
        raise ValueError(
            f"{STALE_VARIABLE}={value!r} is shorter than {MIN_STALE_S:g} s: a live owner could be judged gone "
            "between two of its heartbeats; raise it"
        )
    return seconds


def owner_gone(record: dict[str, Any], heartbeat_age_s: float, stale_after_s: float) -> str | None:
    """Why the lease's owner is gone (None while it is alive): a dead process on this host, or a stale heartbeat."""
    if record.get("host") == socket.gethostname() and isinstance(record.get("pid"), int):
        started = process_start(record["pid"])
        if started is None or (record.get("pid_start") is not None and started != record["pid_start"]):
            return f"its process {record['pid']} on {record['host']} is gone"
    if heartbeat_age_s > stale_after_s:
        return f"its heartbeat is {heartbeat_age_s:.0f} s old (stale after {stale_after_s:.0f} s)"
    return None


class FileLeaseStore(LeaseStore):
    heartbeat_s = 2.0
    poll_s = 0.5

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.location = str(self.path)

    def try_acquire(self, run_id: str, stale_after_s: float) -> tuple[Lease | None, dict[str, Any] | None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        token = uuid.uuid4().hex
        with self._guard():
            current = self._read()
            took_over = None
            if current is not None:
                record, age = current
                gone = owner_gone(record, age, stale_after_s)
                if gone is None:
                    return None, record
                took_over = f"{record.get('run_id', 'unknown run')} ({gone})"
            mine = owner_record(run_id, token)
            write_bytes_atomic(self.path, json.dumps(mine, indent=1).encode())
        return Lease(self.location, token, mine, None, took_over=took_over), None

    def holder(self, stale_after_s: float) -> dict[str, Any] | None:
        current = self._read()
        if current is None or owner_gone(*current, stale_after_s) is not None:
            return None
        return current[0]

    def renew(self, lease: Lease) -> Lease | None:
        with self._guard():
            if not self._owns(lease.token):
                return None
            os.utime(self.path)
        return lease

    def release(self, lease: Lease) -> None:
        with self._guard():
            if self._owns(lease.token):
                self.path.unlink()

    @contextmanager
    def _guard(self) -> Iterator[None]:
        with open(self.path.with_name(self.path.name + ".guard"), "a+") as guard:
            fcntl.flock(guard, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(guard, fcntl.LOCK_UN)

    def _read(self) -> tuple[dict[str, Any], float] | None:
        try:
            age = time.time() - self.path.stat().st_mtime
            record = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except ValueError:  # written atomically, so unreadable means foreign or damaged: judge by heartbeat
            record = {}
        return (record if isinstance(record, dict) else {}), age

    def _owns(self, token: str) -> bool:
        current = self._read()
        return current is not None and current[0].get("token") == token
