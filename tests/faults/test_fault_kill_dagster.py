"""Local jobs die with their run: kill -9 of the Dagster process during a job takes the job process
and its children (torchrun's launcher and workers) down within seconds, and a rerun completes; the
rerun's first step marks the killed run failed (its recorded run worker is gone), so it does not stay
STARTED. Jobs also see an allow-listed environment: no secret of the Dagster process reaches them.

Real processes: a Dagster process (fault_driver.py) launches the test-only job of fault_job.py, which
pauses while writing; the test kills the Dagster process with SIGKILL.
"""

import json
import os
import signal
import time
from pathlib import Path

import pytest
from dagster import DagsterInstance, DagsterRunStatus
from fault_processes import make_lab, paused_pids, wait_for, wait_gone
from helpers.process_tree import alive, descendants

from zero_assets.core.output_marker import OUTPUT_MARKER, output_is_complete

SECRETS = {
    "DAGSTER_PG_PASSWORD": "pg-secret",
    "WANDB_API_KEY": "wandb-secret",
    "SECRET": "random-secret",
    "AWS_SECRET_ACCESS_KEY": "aws-secret",
    "ZERO_API_TOKEN": "zero-secret",
}


@pytest.mark.parametrize("asset, processes", [("fault_output", 1), ("fault_training", 3)])
def test_kill_9_of_dagster_kills_the_job_and_its_children_then_a_rerun_completes(
    tmp_path, tiny_raw_root, asset, processes
):
    lab = make_lab(tmp_path, tiny_raw_root)
    dagster = lab.start(asset, env={"ZERO_FAULT_PAUSE_AT": "writing"})
    ranks = 2 if asset == "fault_training" else 1
    wait_for(lambda: len(paused_pids(lab.lake, asset, "writing")) == ranks, what="every rank pausing mid-write")
    job = descendants(dagster.pid)
    assert len(job) >= processes, f"the job's processes (torchrun launcher and workers): {job}"
    killed_at = time.monotonic()
    dagster.kill()  # SIGKILL: no handler, no cleanup in the Dagster process
    dagster.wait(timeout=30)
    left = wait_gone(job, timeout=10)
    print(f"{asset}: {len(job)} job processes gone {time.monotonic() - killed_at:.2f} s after kill -9 of Dagster")
    for pid in left:  # leave no sleeper behind when the property is broken
        os.kill(pid, signal.SIGKILL)
    assert not left, f"job processes outlived the Dagster process: {[(pid, alive(pid)) for pid in left]}"

    rerun = lab.run(asset, env=SECRETS)
    assert rerun["success"], rerun["log"][-3000:]
    with DagsterInstance.from_config(str(lab.home)) as instance:
        [killed] = [run for run in instance.get_runs() if run.run_id != rerun["run_id"]]
        assert killed.status == DagsterRunStatus.FAILURE, "the killed run does not stay STARTED"
        assert f"run {killed.run_id}: its run worker, pid {dagster.pid}" in rerun["log"]
    decision = rerun["assets"][asset]
    assert decision["cache"] == "miss"
    out = Path(decision["dagster/uri"])
    assert output_is_complete(str(out), json.loads((out / OUTPUT_MARKER).read_text())["fingerprint"])
    [job_folder] = lab.lake.glob(f"_jobs/{asset}/*/runs/{rerun['run_id']}/*")
    assert not list(job_folder.rglob("part-*.bin")), "no copy of the published output stays in the job folder"

    seen_file = job_folder / "opt/ml/output/environment.json"
    seen = set(json.loads(seen_file.read_text()))
    assert not seen & set(SECRETS), f"secrets of the Dagster process reached the job: {sorted(seen & set(SECRETS))}"
    assert {"PATH", "HOME", "ZERO_OPT_ML", "PYTHONPATH", "DAGSTER_PIPES_CONTEXT", "DAGSTER_PIPES_MESSAGES"} <= seen
    assert "DAGSTER_HOME" not in seen and all(not name.startswith("AWS_") for name in seen), (
        "no S3 input: no AWS settings"
    )
