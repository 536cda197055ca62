"""A run whose worker is gone does not stay STARTED or keep its pool slot: zero_assets fails the runs
whose recorded run worker on this host has exited (zero_assets/launch/run_owner.py, also as
`zero-assets fail-dead-runs`), and the daemon frees the slots a finished run still holds
(`free_slots_after_run_end_seconds` in both instance files). Real instances, real processes: a run
worker here is a Python process that records itself and is killed with SIGKILL.

The end-to-end case (kill -9 of `dagster asset materialize` during training) is
tests/faults/test_fault_kill_cli_training.py.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from dagster import DagsterInstance, DagsterRunStatus
from dagster._core.test_utils import create_run_for_test, freeze_time
from dagster._daemon.monitoring import execute_concurrency_slots_iteration
from helpers.postgres_server import PostgresServer
from helpers.process_tree import alive, descendants
from test_postgres_instance import production_config_without_ecs

from zero_assets.backends.local.process import kill_process_tree
from zero_assets.launch.run_owner import HOST_TAG, WORKER_TAG, RunWorker, fail_dead_runs, this_process

REPO = Path(__file__).resolve().parents[2]
POOL, STEP = "training", "trained_checkpoint"

# A run worker: records itself in the run's tags, says so, then waits to be killed.
RUN_WORKER = """
import sys, time
from dagster import DagsterInstance
from zero_assets.launch.run_owner import record_run_worker
with DagsterInstance.from_config(sys.argv[1]) as instance:
    record_run_worker(instance, sys.argv[2])
print("recorded", flush=True)
time.sleep(600)
"""


@pytest.fixture
def home(tmp_path) -> Path:
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    return home


def started_run_holding_the_pool(instance: DagsterInstance) -> str:
    """A STARTED run whose training step holds the `training` pool's one slot."""
    run = create_run_for_test(instance, status=DagsterRunStatus.STARTED)
    storage = instance.event_log_storage
    storage.initialize_concurrency_limit_to_default(POOL)
    assert storage.claim_concurrency_slot(POOL, run.run_id, STEP).is_claimed
    return run.run_id


def holders(instance: DagsterInstance) -> list[str]:
    return [slot.run_id for slot in instance.event_log_storage.get_concurrency_info(POOL).claimed_slots]


def start_run_worker(home: Path, run_id: str) -> subprocess.Popen:
    worker = subprocess.Popen(
        [sys.executable, "-c", RUN_WORKER, str(home), run_id], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    assert worker.stdout.readline().strip() == "recorded"
    return worker


def test_a_run_whose_worker_was_killed_is_failed_and_its_pool_slot_freed(home):
    with DagsterInstance.from_config(str(home)) as instance:
        dead, living = (
            started_run_holding_the_pool(instance),
            create_run_for_test(instance, status=DagsterRunStatus.STARTED).run_id,
        )
        dead_worker, living_worker = start_run_worker(home, dead), start_run_worker(home, living)
        try:
            assert fail_dead_runs(instance) == {}, "both run workers are alive"
            dead_worker.kill()  # SIGKILL: nothing of the run worker reports anything
            dead_worker.wait()
            failed = fail_dead_runs(instance)
        finally:
            living_worker.kill()
            living_worker.wait()
        assert list(failed) == [dead] and f"pid {dead_worker.pid}" in failed[dead]
        run = instance.get_run_by_id(dead)
        assert run.status == DagsterRunStatus.FAILURE
        assert holders(instance) == [], "the dead run's pool slot is free"
        assert instance.get_run_by_id(living).status == DagsterRunStatus.STARTED, "it was alive when judged"
        [failure] = [
            e
            for e in instance.all_logs(dead)
            if e.dagster_event_type and e.dagster_event_type.value == "PIPELINE_FAILURE"
        ]
        assert "has exited" in failure.message and "pool slots are freed" in failure.message


def test_only_what_this_host_can_tell_is_judged(home):
    """A pid reused by another process, or a restarted host, is a dead run worker; a run worker of another
    host, of another container's pid namespace, or tags copied from another run (a re-execution) are not
    judged here."""
    with DagsterInstance.from_config(str(home)) as instance:
        me = this_process("")
        cases = {
            "reused pid": dict(started=str(int(me.started) + 1)),
            "rebooted": dict(boot="another-boot"),
            "other host": dict(host="another-host"),
            "other container": dict(pid_namespace="pid:[1]"),
            "copied tags": dict(run_id="another-run"),
        }
        runs = {}
        for case, change in cases.items():
            run_id = create_run_for_test(instance, status=DagsterRunStatus.STARTED).run_id
            worker = dataclasses.replace(me, **{"run_id": run_id, **change})
            instance.add_run_tags(run_id, {HOST_TAG: me.host, WORKER_TAG: worker.tag_value()})
            if case == "other host":
                instance.add_run_tags(run_id, {HOST_TAG: worker.host})
            runs[case] = run_id
        failed = fail_dead_runs(instance)
        assert set(failed) == {runs["reused pid"], runs["rebooted"]}
        assert "another process" in failed[runs["reused pid"]] and "restarted" in failed[runs["rebooted"]]
        for case in ("other host", "other container", "copied tags"):
            assert instance.get_run_by_id(runs[case]).status == DagsterRunStatus.STARTED, case
        assert RunWorker.from_tags(instance.get_run_by_id(runs["copied tags"])) is None


def test_zero_assets_fail_dead_runs_command(home):
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    with DagsterInstance.from_config(str(home)) as instance:
        dead = started_run_holding_the_pool(instance)
        worker = start_run_worker(home, dead)
        worker.kill()
        worker.wait()
        elsewhere = create_run_for_test(instance, status=DagsterRunStatus.STARTED).run_id  # no worker recorded
    command = [sys.executable, "-m", "zero_assets.ops.cli", "fail-dead-runs"]
    found = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert found.returncode == 0, found.stderr
    assert found.stdout.startswith(f"{dead}\t") and "has exited" in found.stdout
    by_hand = subprocess.run([*command, "--run", elsewhere], env=env, cwd=REPO, capture_output=True, text=True)
    assert (
        by_hand.returncode == 0
        and by_hand.stdout == f"{elsewhere}\tfailed by hand (zero-assets fail-dead-runs --run)\n"
    )
    unknown = subprocess.run([*command, "--run", "no-such-run"], env=env, cwd=REPO, capture_output=True, text=True)
    assert unknown.returncode == 2 and "no run no-such-run" in unknown.stderr
    with DagsterInstance.from_config(str(home)) as instance:
        assert {instance.get_run_by_id(r).status for r in (dead, elsewhere)} == {DagsterRunStatus.FAILURE}
        assert holders(instance) == []


class DaemonWorkspace:
    """What the daemon's concurrency iteration reads of its workspace: the instance."""

    def __init__(self, instance: DagsterInstance) -> None:
        self.instance = instance


def assert_daemon_frees_slots_after_run_end(instance: DagsterInstance) -> None:
    after = instance.run_monitoring_settings.get("free_slots_after_run_end_seconds")
    assert after, "run_monitoring.free_slots_after_run_end_seconds is not set"
    run_id = started_run_holding_the_pool(instance)
    instance.report_run_failed(instance.get_run_by_id(run_id))  # failed from outside: its step never freed it
    ended = time.time()
    workspace, logger = DaemonWorkspace(instance), logging.getLogger("dagster.daemon")
    list(execute_concurrency_slots_iteration(workspace, logger))
    assert holders(instance) == [run_id], "freed only once the run has been over for the configured time"
    with freeze_time(ended + after + 1):  # the daemon's clock, that far on
        list(execute_concurrency_slots_iteration(workspace, logger))
    assert holders(instance) == []


def test_the_daemon_frees_the_slots_a_finished_run_holds(home):
    with DagsterInstance.from_config(str(home)) as instance:
        assert_daemon_frees_slots_after_run_end(instance)


@pytest.mark.slow
def test_the_production_instance_frees_the_slots_a_finished_run_holds(tmp_path, monkeypatch):
    with PostgresServer() as server:
        for key, value in server.env().items():
            monkeypatch.setenv(key, value)
        home = tmp_path / "dagster_home"
        home.mkdir()
        (home / "dagster.yaml").write_text(yaml.safe_dump(production_config_without_ecs()))
        with DagsterInstance.from_config(str(home)) as instance:
            assert type(instance.run_storage).__name__ == "PostgresRunStorage"
            assert_daemon_frees_slots_after_run_end(instance)


def test_kill_process_tree_reaches_children_in_their_own_sessions():
    """torchrun starts its workers in new sessions, and a W&B service starts its own: a group kill misses
    them, the tree kill does not."""
    script = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import subprocess, sys, time; "
        'subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]); time.sleep(600)\'], '
        "start_new_session=True)\n"
        "print(child.pid, flush=True); time.sleep(600)\n"
    )
    root = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, process_group=0)
    tree = []
    try:
        root.stdout.readline()
        deadline = time.monotonic() + 30
        while len(tree := descendants(root.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(tree) == 2, tree
        killed = kill_process_tree(root.pid)
        assert set(killed) == {root.pid, *tree}
        root.wait(timeout=10)
        deadline = time.monotonic() + 5
        while any(alive(pid) for pid in tree) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pid for pid in tree if alive(pid)]
    finally:
        for pid in [root.pid, *tree]:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        root.wait()
