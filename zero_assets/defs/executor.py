"""The code location's executor: Dagster's default (multiprocess, or in process by config), run by a
process that first records itself as the run's worker and fails this host's dead runs, before any step
claims a pool slot: a training launched after a killed one never waits on the slot the dead run holds.

Runs of the code location (`dagster asset materialize`, the UI, sensors and schedules) start through
it; the Python API's `materialize` runs in process without it, and its first step does the same
(see `zero_assets.launch.run_owner`)."""

from __future__ import annotations

from collections.abc import Iterator

from dagster import DagsterEvent, Executor, ExecutorDefinition, multi_or_in_process_executor
from dagster._core.events import EngineEventData  # not exported by dagster
from dagster._core.execution.context.system import PlanOrchestrationContext  # not exported by dagster
from dagster._core.execution.plan.plan import ExecutionPlan  # not exported by dagster
from dagster._core.execution.retries import RetryMode  # not exported by dagster

from zero_assets.launch.run_owner import fail_dead_runs, record_run_worker


class RunWorkerExecutor(Executor):
    """Dagster's executor `inner`, after recording the run worker and failing the dead runs."""

    def __init__(self, inner: Executor) -> None:
        self.inner = inner

    @property
    def retries(self) -> RetryMode:
        return self.inner.retries

    @property
    def step_dependency_config(self):
        return self.inner.step_dependency_config

    def execute(self, plan_context: PlanOrchestrationContext, execution_plan: ExecutionPlan) -> Iterator[DagsterEvent]:
        record_run_worker(plan_context.instance, plan_context.run_id)
        for run_id, reason in fail_dead_runs(plan_context.instance).items():
            yield DagsterEvent.engine_event(
                plan_context, f"run {run_id}: {reason}; marked failed, its pool slots freed", EngineEventData()
            )
        yield from self.inner.execute(plan_context, execution_plan)


def _create(init_context) -> Executor:
    return RunWorkerExecutor(multi_or_in_process_executor.executor_creation_fn(init_context))


run_worker_executor = ExecutorDefinition(
    name="run_worker_executor",
    config_schema=multi_or_in_process_executor.config_schema,
    requirements=multi_or_in_process_executor.get_requirements,
    executor_creation_fn=_create,
    description="Dagster's multi_or_in_process_executor, after failing this host's runs whose worker is gone.",
)
