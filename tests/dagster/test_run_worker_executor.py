"""Where the code location's executor runs steps: a run of one step at a time that takes no pool slot in
its own process; any other run in step workers forked from a forkserver (never a fresh interpreter a
step), unless the run config picks a start method. Real runs on a real instance (execute_job with the
executor the code location uses), the steps reporting the process they ran in.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from dagster import (
    AssetCheckResult,
    AssetSelection,
    DagsterInstance,
    Definitions,
    MaterializeResult,
    asset,
    asset_check,
    define_asset_job,
    execute_job,
)
from dagster._core.definitions.reconstruct import ReconstructableJob  # not exported by dagster

from zero_assets.defs.executor import run_worker_executor

REPO = Path(__file__).resolve().parents[2]


def where() -> dict[str, object]:
    parent = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    return {"pid": os.getpid(), "parent": parent}


@asset
def first() -> MaterializeResult:
    return MaterializeResult(metadata=where())


@asset(deps=[first])
def second() -> MaterializeResult:
    return MaterializeResult(metadata=where())


@asset_check(asset=second)
def second_is_there() -> AssetCheckResult:
    return AssetCheckResult(passed=True)


@asset
def beside() -> MaterializeResult:
    return MaterializeResult(metadata=where())


@asset(pool="slots")
def pooled() -> MaterializeResult:
    return MaterializeResult(metadata=where())


defs = Definitions(
    assets=[first, second, beside, pooled],
    asset_checks=[second_is_there],
    jobs=[
        define_asset_job("chain", AssetSelection.assets(first, second)),
        define_asset_job("side_by_side", AssetSelection.assets(first, second, beside)),
        define_asset_job("in_a_pool", AssetSelection.assets(pooled)),
    ],
    executor=run_worker_executor,
)


def chain_job():
    return defs.resolve_job_def("chain")


def side_by_side_job():
    return defs.resolve_job_def("side_by_side")


def in_a_pool_job():
    return defs.resolve_job_def("in_a_pool")


@pytest.fixture
def instance(tmp_path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    with DagsterInstance.from_config(str(home)) as instance:
        yield instance


def run_and_report(instance: DagsterInstance, job, run_config=None) -> tuple[dict[str, dict], list[str]]:
    """Each asset's process (pid, parent command line) and the run's engine messages."""
    # By file: a step worker finds the job however pytest put this module on sys.path.
    with execute_job(
        ReconstructableJob.for_file(__file__, job.__name__), instance=instance, run_config=run_config
    ) as result:
        assert result.success
        processes = {
            event.asset_key.to_user_string(): {k: v.value for k, v in event.materialization.metadata.items()}
            for event in result.get_asset_materialization_events()
        }
        engine = [event.message or "" for event in result.all_events if event.event_type_value == "ENGINE_EVENT"]
        checks = [event for event in result.all_events if event.event_type_value == "ASSET_CHECK_EVALUATION"]
        assert len(checks) == (1 if "second" in processes else 0)
    return processes, engine


def test_a_chain_without_pool_slots_runs_in_the_run_worker(instance):
    processes, engine = run_and_report(instance, chain_job)
    assert {asset: where["pid"] for asset, where in processes.items()} == {"first": os.getpid(), "second": os.getpid()}
    assert any("they run in this process" in message for message in engine)


@pytest.mark.parametrize("job", [side_by_side_job, in_a_pool_job])
def test_other_runs_fork_their_step_workers_from_a_forkserver(instance, job):
    processes, engine = run_and_report(instance, job)
    for asset_name, where in processes.items():
        assert where["pid"] != os.getpid(), f"{asset_name} ran in the run worker"
        assert "multiprocessing.forkserver" in where["parent"], f"{asset_name}'s step worker: {where}"
    assert not any("they run in this process" in message for message in engine)


def test_a_start_method_in_the_run_config_is_followed(instance):
    config = {"execution": {"config": {"multiprocess": {"start_method": {"spawn": {}}}}}}
    processes, _ = run_and_report(instance, chain_job, config)
    for asset_name, where in processes.items():
        assert where["pid"] != os.getpid() and "multiprocessing.forkserver" not in where["parent"], asset_name
