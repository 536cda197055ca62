"""Real processes for the fault tests: Dagster runs in their own processes against one instance on
disk, and the waits a test needs to find and kill a job at a chosen point (the /proc look-ups are
tests/helpers/process_tree.py, shared with the training-resume test)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from helpers.process_tree import alive

FAULTS = Path(__file__).resolve().parent
REPO = FAULTS.parents[1]


@dataclass
class Lab:
    """A Dagster home (the repo's dagster.yaml), a raw root and a lake shared by every run of a test."""

    home: Path
    raw: Path
    state: Path

    @property
    def lake(self) -> Path:
        return self.state / "lake"

    def start(self, select: str, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        """One Dagster process materializing `select` (see fault_driver.py); its output is read with `finish`."""
        environment = {
            **os.environ,
            **(env or {}),
            "DAGSTER_HOME": str(self.home),
            "PYTHONPATH": os.pathsep.join([str(FAULTS), str(REPO), os.environ.get("PYTHONPATH", "")]),
        }
        command = [
            sys.executable,
            str(FAULTS / "fault_driver.py"),
            "--home",
            str(self.home),
            "--raw",
            str(self.raw),
            "--state",
            str(self.state),
            "--select",
            select,
            *extra,
        ]
        return subprocess.Popen(
            command, cwd=REPO, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )

    def run(self, select: str, *extra: str, env: dict[str, str] | None = None, timeout: float = 180) -> dict:
        return finish(self.start(select, *extra, env=env), timeout)


def make_lab(tmp_path: Path, raw: Path) -> Lab:
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    return Lab(home, raw, tmp_path / "state")


def finish(process: subprocess.Popen, timeout: float = 180) -> dict:
    """Wait for a Dagster process; its RESULT line (or {"success": False, "killed": True} when it was killed)."""
    output, _ = process.communicate(timeout=timeout)
    lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
    result = json.loads(lines[-1][len("RESULT ") :]) if lines else {"success": False, "killed": process.returncode < 0}
    result["log"] = output
    return result


def wait_for(find, timeout: float = 120, what: str = "the condition"):
    """Poll `find()` until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = find()
        if found:
            return found
        time.sleep(0.1)
    raise TimeoutError(f"{what} did not happen within {timeout} s")


def paused_pids(lake: Path, asset: str, point: str) -> list[int]:
    """Pids of job processes of `asset` paused at `point` (see fault_job.py)."""
    return [
        int(p.read_text())
        for p in lake.glob(f"_jobs/{asset}/*/runs/*/*/opt/ml/output/paused-{point}*")
        if p.read_text()
    ]


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """The pids still alive after up to `timeout` seconds."""
    deadline = time.monotonic() + timeout
    left = list(pids)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [pid for pid in left if alive(pid)]
    return left
