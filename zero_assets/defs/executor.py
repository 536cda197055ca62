"""The code location's executor: Dagster's multi_or_in_process executor, after recording the run worker and
failing this host's dead runs; unless the run config picks a start method, one-step-at-a-time runs without
pool slots run in process and others fork step workers from a preloaded `forkserver`."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator, Sequence
from types import ModuleType

from dagster import (
    DagsterEvent,
    DagsterInstance,
    Executor,
    ExecutorDefinition,
    InitExecutorContext,
    multi_or_in_process_executor,
)
from dagster._core.events import EngineEventData  # engine_event requires one; dagster does not export it

from zero_assets.launch.run_owner import fail_dead_runs, record_run_worker

CODE_LOCATION = "zero_assets.definitions"


class RunWorkerExecutor(Executor):
    """`inner` after recording the run worker and failing dead runs; `in_process` runs one-step-at-a-time plans."""

    def __init__(self, inner: Executor, in_process: Executor | None = None) -> None:
        self.inner, self.in_process = inner, in_process

    @property
    def retries(self):
        return self.inner.retries

    @property
    def step_dependency_config(self):
        return self.inner.step_dependency_config

    def execute(self, plan_context, execution_plan) -> Iterator[DagsterEvent]:
        record_run_worker(plan_context.instance, plan_context.run_id)
        for run_id, reason in fail_dead_runs(plan_context.instance).items():
            yield DagsterEvent.engine_event(
                plan_context, f"run {run_id}: {reason}; marked failed, its pool slots freed", EngineEventData()
            )
        if self.in_process is not None and one_step_at_a_time(execution_plan):
            yield DagsterEvent.engine_event(
                plan_context,
                "its steps run one after another and take no pool slot: they run in this process",
                EngineEventData(),
            )
            yield from self.in_process.execute(plan_context, execution_plan)
        else:
            yield from self.inner.execute(plan_context, execution_plan)


def one_step_at_a_time(execution_plan) -> bool:
    """Whether no step takes a pool slot and no two materializing steps could run side by side."""
    for level in execution_plan.get_steps_to_execute_by_level():
        if any(step.pool for step in level):
            return False
        materializing = [
            step
            for step in level
            if any(
                output.properties.asset_key and not output.properties.asset_check_key for output in step.step_outputs
            )
        ]
        if len(materializing) > 1:
            return False
    return True


def step_worker_preload(instance: DagsterInstance) -> list[str]:
    """Modules a forkserver preloads: the code location, the run worker's `__main__` imports and storages."""
    parts = [
        instance.run_storage,
        instance.event_log_storage,
        instance.schedule_storage,
        instance.run_launcher,
        instance.run_coordinator,
        instance.compute_log_manager,
    ]
    return [CODE_LOCATION, *_main_module_imports(), *sorted({type(part).__module__ for part in parts if part})]


def _main_module_imports() -> Sequence[str]:
    main = sys.modules.get("__main__")
    names = set()
    for value in vars(main).values() if main else ():
        name = value.__name__ if isinstance(value, ModuleType) else getattr(value, "__module__", None)
        if isinstance(name, str) and name in sys.modules and not name.startswith("__"):
            names.add(name)
    return sorted(names)


def _create(init_context: InitExecutorContext) -> Executor:
    gc.freeze()
    config = init_context.executor_config
    if "in_process" in config or config["multiprocess"].get("start_method"):  # or the run config chose
        return RunWorkerExecutor(_default_executor(init_context, config))
    multiprocess = dict(config["multiprocess"])
    multiprocess["start_method"] = {"forkserver": {"preload_modules": step_worker_preload(init_context.instance)}}
    in_process = {
        "retries": multiprocess["retries"],
        "step_dependency_config": multiprocess.get("step_dependency_config"),
    }
    return RunWorkerExecutor(
        _default_executor(init_context, {"multiprocess": multiprocess}),
        _default_executor(init_context, {"in_process": in_process}),
    )


def _default_executor(init_context: InitExecutorContext, config: dict) -> Executor:
    """Dagster's multi_or_in_process executor for `config` (`{"multiprocess": ...}` or `{"in_process": ...}`)."""
    return multi_or_in_process_executor.executor_creation_fn(
        InitExecutorContext(
            job=init_context.job,
            executor_def=multi_or_in_process_executor,
            executor_config=config,
            instance=init_context.instance,
        )
    )


# The loaded code lives as long as the process: frozen, it is not collected again at exit, and forked step
# workers do not copy its pages when they collect.
gc.freeze()

run_worker_executor = ExecutorDefinition(
    name="run_worker_executor",
    config_schema=multi_or_in_process_executor.config_schema,
    requirements=multi_or_in_process_executor.get_requirements,
    executor_creation_fn=_create,
    description=(
        "Dagster's multi_or_in_process_executor, after failing this host's runs whose worker is gone; by default "
        "a run of one step at a time and no pool slot runs in process, others fork their step workers from a "
        "forkserver that has the code location loaded."
    ),
)
