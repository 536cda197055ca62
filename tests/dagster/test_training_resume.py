"""A training job killed with SIGKILL mid-way resumes from its last checkpoint when the asset is re-materialized."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
from dagster import materialize
from helpers.graph_runs import materialize_source, materialize_tail, sources_of
from helpers.process_tree import children_of, command_line

from zero_assets.defs.assets import ALL_ASSETS, SOURCE_SPECS, arrow_shards, fsx_warm_state, training_set

ALL = [*SOURCE_SPECS, *ALL_ASSETS]
MAX_STEPS = 60
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


def our_training_launcher() -> int | None:
    """The torchrun launcher of `training_code.train` started by this test process (never anyone else's)."""
    for pid in children_of(os.getpid()):
        line = command_line(pid)
        if "torch.distributed.run" in line and "training_code.train" in line:
            return pid
    return None


def checkpoint_steps(lake: Path) -> list[int]:
    return sorted(
        int(p.stem.split("-")[1]) for p in lake.glob("_jobs/trained_checkpoint/*/checkpoints/checkpoint-*.pt")
    )


def kill_launcher_after_first_checkpoint(lake: Path, killed: dict) -> None:
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        launcher = our_training_launcher()
        if launcher is not None and checkpoint_steps(lake):
            killed["workers"] = children_of(launcher)
            os.kill(launcher, signal.SIGKILL)
            killed["launcher"] = launcher
            return
        time.sleep(0.1)


def metadata(result, asset: str) -> dict:
    return {k: v.value for k, v in result.asset_materializations_for_node(asset)[0].metadata.items()}


def wait_until_gone(pids: list[int], timeout: float = 15) -> list[int]:
    deadline = time.monotonic() + timeout
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [pid for pid in alive if Path(f"/proc/{pid}").exists() and "training_code.train" in command_line(pid)]
    return alive


@pytest.mark.slow
def test_kill_9_of_the_launcher_then_rematerializing_resumes_and_finishes(instance, resources, tiny_raw_root):
    lake = Path(resources["settings"].lake_uri)
    for source in sources_of(tiny_raw_root):  # every source, then the tail up to the warm shards
        assert materialize_source(source, instance=instance, resources=resources).success
    assert materialize_tail(
        instance=instance, resources=resources, assets=[training_set, arrow_shards, fsx_warm_state]
    ).success

    killed: dict = {}
    killer = threading.Thread(target=kill_launcher_after_first_checkpoint, args=(lake, killed), daemon=True)
    killer.start()
    first = materialize(
        ALL,
        selection=["trained_checkpoint"],
        resources=resources,
        instance=instance,
        run_config=TINY_TRAINING,
        raise_on_error=False,
    )
    killer.join(timeout=10)
    assert "launcher" in killed, "the launcher was never seen with a checkpoint written"
    assert not first.success
    assert killed["workers"] and not wait_until_gone(killed["workers"]), "the workers die with their launcher"
    saved = checkpoint_steps(lake)
    assert saved and saved[-1] < MAX_STEPS, f"killed mid-way, with checkpoints {saved}"

    second = materialize(
        ALL, selection=["trained_checkpoint"], resources=resources, instance=instance, run_config=TINY_TRAINING
    )
    assert second.success
    trained = metadata(second, "trained_checkpoint")
    assert trained["resumed_from_step"] == saved[-1]
    assert trained["steps"] == MAX_STEPS
    assert trained["images_seen"] == MAX_STEPS * 2 * 2  # 2 processes x batch 2, resumed images included
    assert checkpoint_steps(lake)[-1] == MAX_STEPS
