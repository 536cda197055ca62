"""Which attempt of a materialization's SageMaker job to run: the bookkeeping beside the Pipes client.

Attempts are found by deterministic name: a running one is reattached, a stopping one waited for, a
completed one with a complete output reused; otherwise the next name is launched.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Optional

from dagster import Failure, PipesClientCompletedInvocation

from zero_assets.backends.sagemaker.names import attempt_of

if TYPE_CHECKING:
    from zero_assets.backends.sagemaker.job_api import Kind
    from zero_assets.backends.sagemaker.training_plan import TrainingPlan

BeforeLaunch = Callable[[dict[str, Any]], None]  # raises to refuse launching a job with these parameters

TERMINAL = ("Completed", "Failed", "Stopped")
MAX_ATTEMPTS = 50


class ReportUnreadable(Exception):
    """A reattached job ended without a readable Pipes report; the attempt counts as failed."""


class JobAttempts(ABC):
    """The attempts of one materialization's job, found by name; the job calls are the subclass's."""

    poll_interval: float

    @abstractmethod
    def describe_patiently(self, kind: Kind, job_name: str) -> Optional[dict[str, Any]]:
        """The job's description (retried through throttling), or None when no job has that name."""

    @abstractmethod
    def job_status(self, kind: Kind, job: dict[str, Any]) -> str:
        """The job's status in its description: InProgress, Completed, Failed, Stopping or Stopped."""

    @abstractmethod
    def run(
        self,
        *,
        context,
        kind: Kind,
        params: dict[str, Any],
        extras: Optional[dict[str, Any]] = None,
        before_launch: Optional[BeforeLaunch] = None,
        training_plan: Optional[TrainingPlan] = None,
    ) -> PipesClientCompletedInvocation:
        """Launch the job `params` describe (`before_launch` may refuse it), or reattach to it, and wait.

        Raises `ReportUnreadable` when a reattached job's report cannot be read."""

    def run_attempts(
        self,
        *,
        context,
        kind: Kind,
        name_for_attempt: Callable[[int], str],
        params_for: Callable[[str], dict[str, Any]],
        output_ready: Callable[[str, dict], bool],
        before_launch: Optional[BeforeLaunch] = None,
        training_plan: Optional[TrainingPlan] = None,
    ) -> tuple[str, dict[str, Any], PipesClientCompletedInvocation]:
        """Run the materialization's job: reattach, reuse, or launch the next attempt.

        `before_launch` sees only attempts about to be launched. Returns the attempt's name, its
        parameters and the invocation."""
        first_attempt = 1
        while True:
            name = self.resolve_job_name(context, kind, name_for_attempt, output_ready, first_attempt)
            params = params_for(name)
            try:
                invocation = self.run(
                    context=context, kind=kind, params=params, before_launch=before_launch, training_plan=training_plan
                )
                return name, params, invocation
            except ReportUnreadable as unreadable:
                context.log.warning(f"[pipes] {unreadable}: launching the next attempt")
                first_attempt = attempt_of(name) + 1

    def resolve_job_name(
        self,
        context,
        kind: Kind,
        name_for_attempt: Callable[[int], str],
        output_ready: Optional[Callable[[str, dict], bool]] = None,
        first_attempt: int = 1,
    ) -> str:
        """The first attempt name from `first_attempt` that is free, running, or `Completed` with `output_ready`.

        A `Stopping` attempt is waited for, so two attempts never write one output at once."""
        for attempt in range(first_attempt, MAX_ATTEMPTS + 1):
            name = name_for_attempt(attempt)
            job = self.describe_patiently(kind, name)
            if job is not None and self.job_status(kind, job) == "Stopping":
                job = self.wait_until_ended(context, kind, name)
            status = None if job is None else self.job_status(kind, job)
            if status in (None, "InProgress"):
                return name
            if status == "Completed":
                if output_ready is not None and output_ready(name, job):
                    return name
                context.log.warning(
                    f"[pipes] attempt {attempt} ({name}) Completed, but its output is missing or incomplete: "
                    f"not reused; trying attempt {attempt + 1}"
                )
                continue
            context.log.info(f"[pipes] attempt {attempt} ({name}) ended {status}; trying attempt {attempt + 1}")
        raise Failure(
            f"{MAX_ATTEMPTS} attempts of this materialization have ended without success; "
            f"change its inputs or investigate {name}"
        )

    def wait_until_ended(self, context, kind: Kind, name: str) -> dict[str, Any]:
        """Poll a `Stopping` job until it is Stopped, Failed or Completed; its uploads end only then."""
        context.log.info(f"[pipes] {name} is Stopping: waiting for it to stop before the next attempt starts")
        while True:
            job = self.describe_patiently(kind, name)
            if self.job_status(kind, job) in TERMINAL:
                context.log.info(f"[pipes] {name} has ended {self.job_status(kind, job)}")
                return job
            time.sleep(self.poll_interval)
