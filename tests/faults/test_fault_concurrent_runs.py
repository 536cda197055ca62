"""Runs isolated: two runs with the same inputs at once launch one job; the second waits on the
output's lease, then reports a cache hit; neither deletes the other's work. A lease whose owner was
killed is taken over.

Real processes: each run is its own Dagster process (fault_driver.py) against one instance on disk,
on the cheapest real assets (raw_image_index -> validated_images over the tiny raw root).
"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from fault_processes import REPO, finish, make_lab, wait_for, wait_gone
from helpers.process_tree import descendants

from zero_assets.core.output_marker import OUTPUT_MARKER, output_is_complete
from zero_assets.launch.output_lease import hold_lease, try_acquire


class Tail:
    """Collects a process's output as it comes, so a test can wait for a line while it runs."""

    def __init__(self, process) -> None:
        self.text, self.process = "", process
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.text += line

    def result(self, timeout: float = 180) -> dict:
        self.process.wait(timeout=timeout)
        self._reader.join(timeout=10)
        lines = [line for line in self.text.splitlines() if line.startswith("RESULT ")]
        result = json.loads(lines[-1][len("RESULT ") :]) if lines else {"success": False}
        result["log"] = self.text
        return result


def lease_files(lab) -> list[Path]:
    return list(lab.lake.glob("_jobs/validated_images/*/lease.json"))


def run_folders(lab) -> list[str]:
    return sorted(p.name for p in lab.lake.glob("_jobs/validated_images/*/runs/*"))


def test_two_runs_with_the_same_inputs_launch_one_job_and_both_succeed(tmp_path, tiny_raw_root):
    lab = make_lab(tmp_path, tiny_raw_root)
    assert lab.run("raw_image_index")["success"]

    # The first run builds the output and stays inside its lease, the marker unwritten, until released: alive,
    # renewing the lease. A run frozen with SIGSTOP instead could be frozen holding the instance's database lock
    # (the second run then never reached the lease) or let its heartbeat go stale (the second took it over).
    first = lab.start("validated_images", "--hold-before-marker")
    try:
        wait_for(lambda: (lab.state / "held-before-marker").is_file(), what="the first run holding the lease")
        assert lease_files(lab), "the first run holds the output's lease"
        second = Tail(lab.start("validated_images"))
        wait_for(lambda: "waiting for it" in second.text, what="the second run waiting on the lease")
    finally:
        (lab.state / "release").touch()
    one, two = finish(first), second.result()

    assert one["success"] and two["success"], (one["log"][-2000:], two["log"][-2000:])
    built, reused = one["assets"]["validated_images"], two["assets"]["validated_images"]
    assert built["cache"] == "miss" and reused["cache"] == "hit", (built, reused)
    assert f"run {one['run_id']} built the same inputs while this run waited" in reused["cache_reason"]
    assert reused["dagster/uri"] == built["dagster/uri"]
    assert run_folders(lab) == [one["run_id"]], "one job was launched, by the first run"
    out = Path(built["dagster/uri"])
    marker = json.loads((out / OUTPUT_MARKER).read_text())
    assert output_is_complete(str(out), marker["fingerprint"])
    job_folder = next(lab.lake.glob(f"_jobs/validated_images/*/runs/{one['run_id']}/*"))
    assert (job_folder / "opt/ml/output/job.log").is_file(), "the first run's job folder was left alone"
    # The read list planned before launch (`<jobs folder>/reads/`) is the job's input, not a copy of its output.
    copies = [path for path in lab.lake.glob("_jobs/**/*.parquet") if path.parent.name != "reads"]
    assert not copies, "no copy of the output stays in the job folder"
    assert not lease_files(lab), "the lease is released"


def test_a_lease_left_by_a_killed_run_is_taken_over(tmp_path, tiny_raw_root):
    lab = make_lab(tmp_path, tiny_raw_root)
    assert lab.run("raw_image_index")["success"]
    first = lab.start("validated_images")
    [lease] = wait_for(lambda: lease_files(lab), what="the first run taking the lease")
    # Its job is launched once the read list is planned, a moment after the lease: kill it with its job.
    wait_for(lambda: run_folders(lab), what="the first run launching its job")
    os.kill(first.pid, signal.SIGSTOP)  # freeze it inside the lease, then kill it there
    children = descendants(first.pid)
    os.kill(first.pid, signal.SIGKILL)
    first.wait(timeout=30)
    assert not wait_gone(children, 10), "the killed run's job died with it"
    owner = json.loads(lease.read_text())
    assert owner["pid"] == first.pid, "the dead run's lease is still there"

    started = time.monotonic()
    again = lab.run("validated_images")
    assert again["success"], again["log"][-3000:]
    assert again["assets"]["validated_images"]["cache"] == "miss"
    assert "took over the lease" in again["log"] and f"process {first.pid}" in again["log"]
    assert time.monotonic() - started < 90, "taken over at once (dead owner), not after the heartbeat timeout"
    out = Path(again["assets"]["validated_images"]["dagster/uri"])
    assert output_is_complete(str(out), json.loads((out / OUTPUT_MARKER).read_text())["fingerprint"])
    assert owner["run_id"] in run_folders(lab), "the killed run's job folder was not deleted"


def test_a_live_lease_is_respected_and_a_stale_heartbeat_is_not(tmp_path):
    path = tmp_path / "lease.json"
    with hold_lease(path, "run-a", heartbeat_s=0.2):
        lease, owner = try_acquire(path, "run-b")
        assert lease is None and owner["run_id"] == "run-a" and owner["pid"] == os.getpid()
        time.sleep(0.5)
        assert time.time() - path.stat().st_mtime < 0.5, "the owner's heartbeat renews the lease"
    assert not path.exists()
    # An owner on another host that stopped renewing: judged by its heartbeat alone.
    path.write_text(json.dumps({"run_id": "run-far", "token": "t", "host": socket.gethostname() + "-other", "pid": 1}))
    lease, owner = try_acquire(path, "run-b", stale_after_s=30)
    assert lease is None and owner["run_id"] == "run-far"
    os.utime(path, (time.time() - 60, time.time() - 60))
    lease, _ = try_acquire(path, "run-b", stale_after_s=30)
    assert lease is not None and "run-far" in lease.took_over and "heartbeat" in lease.took_over
    assert json.loads(path.read_text())["run_id"] == "run-b"


HOLD_CHECKPOINTS = """
import sys, time
from pathlib import Path
from training_code.lib.checkpoints import lock_for_writing
lock_for_writing(Path(sys.argv[1]))
print("locked", flush=True)
time.sleep(600)
"""


def test_a_checkpoint_folder_has_one_writer_until_it_dies(tmp_path):
    from training_code.lib.checkpoints import CheckpointFolderBusy, lock_for_writing

    folder = tmp_path / "checkpoints"
    folder.mkdir()
    writer = subprocess.Popen(
        [sys.executable, "-c", HOLD_CHECKPOINTS, str(folder)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        assert writer.stdout.readline().strip() == "locked"
        with pytest.raises(CheckpointFolderBusy, match=f"pid {writer.pid}"):
            lock_for_writing(folder)
    finally:
        writer.kill()  # SIGKILL: the kernel drops its lock
        writer.wait()
    lock_for_writing(folder)  # the dead writer's lock is gone; this process writes now


HOLD_CHECKPOINTS_WITH_A_WORKER = """
import os, sys, time
from pathlib import Path
from training_code.lib.checkpoints import lock_for_writing
lock_for_writing(Path(sys.argv[1]))
worker = os.fork()  # as a DataLoader worker forks from rank 0, holding its open files
if worker == 0:
    time.sleep(600)
    os._exit(0)
print(worker, flush=True)
time.sleep(600)
"""


def test_a_killed_writers_forked_workers_do_not_keep_its_checkpoint_folder(tmp_path):
    """kill -9 of rank 0 frees the folder at once, though its DataLoader workers may live on a while."""
    from training_code.lib.checkpoints import lock_for_writing

    folder = tmp_path / "checkpoints"
    folder.mkdir()
    writer = subprocess.Popen(
        [sys.executable, "-c", HOLD_CHECKPOINTS_WITH_A_WORKER, str(folder)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    worker_pid = int(writer.stdout.readline())
    try:
        writer.kill()
        writer.wait()
        os.kill(worker_pid, 0)  # the forked worker is still alive
        lock_for_writing(folder)  # and yet the folder is free for the rerun
    finally:
        os.kill(worker_pid, signal.SIGKILL)


def output_files(folder: Path) -> dict[str, int]:
    """Every file of an output with its mtime: what a second build would rewrite."""
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    ("asset", "prepare"),
    [("raw_image_index", None), ("training_set", "raw_image_index,validated_images")],
)
def test_two_runs_of_an_in_process_asset_with_the_same_inputs_build_it_once(tmp_path, tiny_raw_root, asset, prepare):
    """The in-process assets follow the same protocol as the job-backed ones: the first run holds the
    output's lease while it builds, the second waits on it, then reports a hit on what the first published."""
    lab = make_lab(tmp_path, tiny_raw_root)
    if prepare:
        assert lab.run(prepare)["success"]
    held = lab.state / "held-before-marker"
    first = Tail(lab.start(asset, "--hold-before-marker"))  # its output published, its marker not yet written
    try:
        wait_for(held.is_file, what=f"the first run holding {asset}'s lease before its marker")
        second = Tail(lab.start(asset))
        wait_for(lambda: "waiting for it" in second.text, what="the second run waiting on the lease")
        [out] = {p.parent for p in lab.lake.glob(f"{asset}/**/manifest.json")}
        published = output_files(out)
    finally:
        (lab.state / "release").touch()
    one, two = first.result(), second.result()

    assert one["success"] and two["success"], (one["log"][-2000:], two["log"][-2000:])
    built, reused = one["assets"][asset], two["assets"][asset]
    assert built["cache"] == "miss" and reused["cache"] == "hit", (built, reused)
    assert f"run {one['run_id']} built the same inputs while this run waited" in reused["cache_reason"]
    assert reused["dagster/uri"] == built["dagster/uri"] == str(out)
    after = output_files(out)
    assert {name: after[name] for name in published} == published, "the second run rewrote none of the output"
    assert set(after) - set(published) == {OUTPUT_MARKER}, "the first run's marker, written once it was released"
    assert output_is_complete(str(out), json.loads((out / OUTPUT_MARKER).read_text())["fingerprint"])
    assert not list(lab.lake.glob(f"_jobs/{asset}/*/lease.json")), "the lease is released"
