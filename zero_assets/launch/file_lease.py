"""An output's lease as a file on this machine, for outputs on a local disk.

The heartbeat is the file's mtime; the lease is taken over only when its owner's process is dead or its
heartbeat stale. Changes happen under a `flock` on a guard file, so two waiters never both take it over.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from training_code.lib.storage import write_bytes_atomic
from zero_assets.launch.lease_store import Lease, LeaseStore, owner_record, process_start


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
        """The lease's record and heartbeat age, None when there is no lease."""
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
