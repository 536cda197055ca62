"""A killed run never blocks the next one (issue 19, defects 3-5), on a real torchrun training of tiny data.

1. A Python API run (`materialize`, steps in process) is killed with SIGKILL during training: nothing of
   it survives to report, it stays STARTED holding the `training` pool's one slot.
2. `dagster asset materialize` of the training starts anyway: its executor fails the dead run first and
   frees the slot (its recorded run worker is gone), and it trains, resuming from run 1's checkpoint.
   It is killed with SIGKILL mid-training: the multiprocess step worker, torchrun, both ranks, loader
   workers and the W&B service are gone 5 s later, and the run is marked failed within a minute, its
   slot freed, with no daemon running.
3. A rerun from the command line trains to the end, resuming from run 2's last checkpoint, with nobody
   freeing a slot by hand.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import make_resources
from dagster import AssetKey, DagsterInstance, DagsterRunStatus
from fault_processes import wait_for, wait_gone
from helpers.graph_runs import materialize_source, materialize_tail, sources_of
from helpers.process_tree import alive, command_line, descendants

from zero_assets.defs.assets import TAIL_ASSETS, map_report, trained_checkpoint

REPO = Path(__file__).resolve().parents[2]
MAX_STEPS = 120
TINY_TRAINING = {
    "ops": {
        "trained_checkpoint": {
            "config": {
                "max_steps": MAX_STEPS,
                "checkpoint_every": 5,
                "batch_size": 2,
                "width": 16,
                "min_size": 64,
                "max_size": 96,
            }
        }
    }
}
# Run 1: the Python API, in process, as a notebook or a script runs the graph.
PYTHON_API_RUN = """
import json, sys
from dagster import DagsterInstance, materialize
from zero_assets.backends.from_env import resources_from_env
from zero_assets.defs.assets import ALL_ASSETS, SOURCE_SPECS
with DagsterInstance.get() as instance:
    materialize([*SOURCE_SPECS, *ALL_ASSETS], selection=["trained_checkpoint"], instance=instance,
                resources=resources_from_env(), run_config=json.loads(sys.argv[1]))
"""
CLI = [
    str(Path(sys.executable).parent / "dagster"),
    "asset",
    "materialize",
    "-m",
    "zero_assets.definitions",
    "--select",
    "trained_checkpoint",
    "--config-json",
    json.dumps(TINY_TRAINING),
]


def checkpoint_steps(lake: Path) -> list[int]:
    return sorted(
        int(p.stem.split("-")[1]) for p in lake.glob("_jobs/trained_checkpoint/*/checkpoints/checkpoint-*.pt")
    )


def newest_run(instance: DagsterInstance, after: set[str]):
    runs = [run for run in instance.get_runs() if run.run_id not in after]
    return runs[0] if runs else None


def start(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(command, cwd=REPO, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)


def kill_after_a_checkpoint_past(process: subprocess.Popen, lake: Path, step: int, log: Path) -> dict[int, list[str]]:
    """SIGKILL `process` once training saved a checkpoint past `step`; the processes it had below it.

    Their command lines are read before the kill: the job's children end within moments of their parent.
    """
    wait_for(
        lambda: (checkpoint_steps(lake) or [0])[-1] > step or process.poll() is not None or blocked(log),
        timeout=300,
        what=f"a checkpoint past step {step}",
    )
    if blocked(log):
        process.kill()
        raise AssertionError(f"the training waits for a pool slot a dead run holds:\n{log.read_text()[-3000:]}")
    assert process.poll() is None, f"it ended before it was killed:\n{log.read_text()[-3000:]}"
    tree = {pid: command_line(pid) for pid in descendants(process.pid)}
    process.kill()
    process.wait(timeout=30)
    return tree


def blocked(log: Path) -> bool:
    return "blocked by limit for pool training" in log.read_text()


def resumed_line(step: int) -> str:
    """What the trainer logs when it resumes (training_code/lib/checkpoints.py)."""
    return f'"event": "resumed", "step": {step},'


def training_processes(tree: dict[int, list[str]]) -> list[int]:
    return [pid for pid, command in tree.items() if "training_code.train" in command]


@pytest.mark.slow
def test_a_killed_training_run_never_blocks_the_next_one(tmp_path, tiny_raw_root):
    home, state = tmp_path / "dagster_home", tmp_path / "state"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    resources = make_resources(tiny_raw_root, state)
    settings = resources["settings"]
    lake = Path(settings.lake_uri)
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "ZERO_RAW_URI": settings.raw_uri,
        "ZERO_LAKE_URI": settings.lake_uri,
        "ZERO_FSX_MOUNT": settings.fsx_mount,
        "ZERO_BACKEND": "local",
    }
    trees: dict[int, list[str]] = {}
    try:
        with DagsterInstance.from_config(str(home)) as instance:
            for source in sources_of(tiny_raw_root):
                assert materialize_source(source, instance=instance, resources=resources).success
            upstream = [asset for asset in TAIL_ASSETS if asset not in (trained_checkpoint, map_report)]
            assert materialize_tail(instance=instance, resources=resources, assets=upstream).success
            before = {run.run_id for run in instance.get_runs()}

            # 1. A Python API run killed during training: no process of it is left to report.
            log1 = tmp_path / "run1.log"
            api = start([sys.executable, "-c", PYTHON_API_RUN, json.dumps(TINY_TRAINING)], env, log1)
            trees |= kill_after_a_checkpoint_past(api, lake, 0, log1)
            run1 = newest_run(instance, before)
            assert run1.status == DagsterRunStatus.STARTED
            pool = instance.event_log_storage.get_concurrency_info("training")
            assert [slot.run_id for slot in pool.claimed_slots] == [run1.run_id], "the dead run holds the slot"
            wait_gone(training_processes(trees), timeout=30)
            saved1 = checkpoint_steps(lake)[-1]

            # 2. `dagster asset materialize` is not blocked by it, and is killed in turn.
            log2 = tmp_path / "run2.log"
            cli = start(CLI, env, log2)
            tree = kill_after_a_checkpoint_past(cli, lake, saved1, log2)
            trees |= tree
            killed_at = time.monotonic()
            assert len(training_processes(tree)) >= 3, f"torchrun and its two ranks below the CLI: {tree}"
            left = wait_gone(list(tree), timeout=5)
            assert not left, f"processes of the killed run alive 5 s later: {[(p, command_line(p)) for p in left]}"
            print(f"{len(tree)} processes of the run gone {time.monotonic() - killed_at:.2f} s after kill -9")
            assert instance.get_run_by_id(run1.run_id).status == DagsterRunStatus.FAILURE
            run2 = newest_run(instance, before | {run1.run_id})
            failed = wait_for(
                lambda: instance.get_run_by_id(run2.run_id).status == DagsterRunStatus.FAILURE,
                timeout=60,
                what="run 2 marked failed",
            )
            assert failed
            print(f"run 2 marked failed {time.monotonic() - killed_at:.2f} s after kill -9")
            assert not instance.event_log_storage.get_concurrency_info("training").claimed_slots
            saved2 = checkpoint_steps(lake)[-1]
            assert saved1 < saved2 < MAX_STEPS
            log2_text = log2.read_text()
            assert f"run {run1.run_id}: its run worker" in log2_text, "run 2's executor failed run 1 first"
            assert resumed_line(saved1) in log2_text

            # 3. A rerun trains to the end, resuming from run 2's last checkpoint.
            log3 = tmp_path / "run3.log"
            rerun = start(CLI, env, log3)
            wait_for(lambda: rerun.poll() is not None or blocked(log3), timeout=600, what="the rerun")
            if rerun.poll() is None:
                rerun.kill()
                rerun.wait()
            assert rerun.returncode == 0, log3.read_text()[-4000:]
            event = instance.get_latest_materialization_event(AssetKey("trained_checkpoint"))
            trained = {k: v.value for k, v in event.asset_materialization.metadata.items()}
            assert trained["resumed_from_step"] == saved2 and trained["steps"] == MAX_STEPS
            assert resumed_line(saved2) in log3.read_text()
    finally:
        for pid in trees:  # leave nothing behind when a property is broken
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
