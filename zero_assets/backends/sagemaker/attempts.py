"""Which attempt of a materialization's SageMaker job to run, found by deterministic name: a running one
is reattached, a stopping one waited for, a completed one with a complete output reused, else the next launched.
"""

from __future__ import annotations

import json
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Optional

from dagster import Failure, PipesClientCompletedInvocation

from training_code.lib.storage import list_objects, read_bytes, write_bytes_atomic

if TYPE_CHECKING:
    from zero_assets.backends.sagemaker.job_api import Kind
    from zero_assets.backends.sagemaker.training_plan import TrainingPlan

BeforeLaunch = Callable[[dict[str, Any]], None]  # raises to refuse launching a job with these parameters

TERMINAL = ("Completed", "Failed", "Stopped")
MAX_ATTEMPTS = 50


def attempt_of(name: str) -> int:
    """The attempt number a name from `core.job_request.job_name` ends with."""
    found = re.search(r"-a(\d+)$", name)
    if not found:
        raise ValueError(f"{name!r} is not a job name from job_name(): it does not end in -a<attempt>")
    return int(found.group(1))


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
        """InProgress, Completed, Failed, Stopping or Stopped."""

    @abstractmethod
    def run(
        self,
        *,
        context,
        kind: Kind,
        params: dict[str, Any],
        before_launch: Optional[BeforeLaunch] = None,
        training_plan: Optional[TrainingPlan] = None,
    ) -> PipesClientCompletedInvocation:
        """Launch or reattach and wait; `ReportUnreadable` when a reattached job's report cannot be read."""

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
        """Reattach, reuse or launch the next attempt: (name, parameters, invocation)."""
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
        """The first attempt from `first_attempt` free, running or reusable; a `Stopping` one is waited for."""
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


# A map stage writes no manifest or marker: a later run reuses it only while every file its record lists
# is still there with its size.
def record_uri(s3_root: str, job_name: str) -> str:
    return f"{s3_root}/attempts/{job_name}.json"


def record_outputs(s3_root: str, job_name: str, outputs: dict[str, str]) -> None:
    files = {name: {o.key: o.size for o in list_objects(uri)} for name, uri in outputs.items()}
    empty = [name for name, listed in files.items() if not listed]
    if empty:
        raise RuntimeError(
            f"SageMaker job {job_name} Completed but uploaded nothing to {[outputs[n] for n in empty]}; check its logs"
        )
    write_bytes_atomic(
        record_uri(s3_root, job_name),
        json.dumps({"job_name": job_name, "outputs": outputs, "files": files}, indent=1).encode(),
    )


def outputs_as_recorded(s3_root: str, job_name: str, outputs: dict[str, str]) -> bool:
    """True when the job's record exists, names these outputs, and every file it lists is still there."""
    try:
        record = json.loads(read_bytes(record_uri(s3_root, job_name)))
    except (FileNotFoundError, ValueError):
        return False
    if record.get("outputs") != outputs:
        return False
    for name, uri in outputs.items():
        present = {o.key: o.size for o in list_objects(uri)}
        if any(present.get(key) != size for key, size in record["files"][name].items()):
            return False
    return True
