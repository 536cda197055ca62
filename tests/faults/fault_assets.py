"""Assets for the fault tests: the test-only job of `fault_job.py` launched like any job-backed asset."""

from dagster import AssetExecutionContext, MaterializeResult, asset

from zero_assets.backends.job_runner import JobRunner
from zero_assets.core.settings import ZeroSettings
from zero_assets.launch.materialize import launch_job


@asset
def fault_output(context: AssetExecutionContext, settings: ZeroSettings, jobs: JobRunner) -> MaterializeResult:
    return launch_job(
        context,
        jobs=jobs,
        settings=settings,
        kind="processing",
        module="fault_job",
        config={"kb": 64},
        upstream=[],
        inputs={},
    )


@asset
def fault_training(context: AssetExecutionContext, settings: ZeroSettings, jobs: JobRunner) -> MaterializeResult:
    return launch_job(
        context,
        jobs=jobs,
        settings=settings,
        kind="training",
        module="fault_job",
        config={"kb": 16},
        upstream=[],
        inputs={},
        processes_per_host=2,
    )


FAULT_ASSETS = [fault_output, fault_training]
