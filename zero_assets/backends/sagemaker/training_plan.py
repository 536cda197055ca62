"""A SageMaker Training Plan as the graph reads it: its window, reserved capacity and upfront fee, and
whether a training request may launch on it (`plan_problems`) and for how long (`bounded_runtime`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Optional

from botocore.exceptions import ClientError

from training_code.lib.aws_clients import endpoint_of, retry_call
from zero_assets.backends.job_cost import PlanFee
from zero_assets.backends.sagemaker.settings import SageMakerSettings, compute_variable

# botocore's patterns for TrainingPlanArn and TrainingPlanName; DescribeTrainingPlan takes the name.
PLAN_ARN = re.compile(
    r"^arn:aws[a-z\-]*:sagemaker:[a-z0-9\-]*:[0-9]{12}:training-plan/(?P<name>[a-zA-Z0-9](-*[a-zA-Z0-9]){0,63})$"
)
WAITING = ("Pending", "Scheduled")  # bought, not started: a job submitted now waits (SecondaryStatus Pending)
ENDED = ("Expired", "Failed")
TRAINING_JOBS = "training-job"  # the TargetResources entry of a plan that training jobs may use


@dataclass(frozen=True)
class TrainingPlan:
    arn: str
    name: str
    status: str  # Pending | Scheduled | Active | Expired | Failed
    status_message: str
    start: Optional[datetime]  # None until SageMaker has scheduled the plan
    end: Optional[datetime]
    instance_type: str  # what it reserves: a plan is bought for one instance type
    instance_count: int
    available_instance_count: Optional[int]  # not in use by other jobs on the plan right now
    upfront_fee: Optional[float]
    currency: str
    target_resources: tuple[str, ...]

    @classmethod
    def from_description(cls, described: Mapping[str, Any]) -> TrainingPlan:
        """From a DescribeTrainingPlan answer."""
        capacities = described.get("ReservedCapacitySummaries") or []
        fee = described.get("UpfrontFee")
        return cls(
            arn=described["TrainingPlanArn"],
            name=described["TrainingPlanName"],
            status=described["Status"],
            status_message=described.get("StatusMessage", ""),
            start=_utc(described.get("StartTime")),
            end=_utc(described.get("EndTime")),
            instance_type=capacities[0]["InstanceType"] if capacities else "(no reserved capacity listed)",
            instance_count=int(described.get("TotalInstanceCount") or sum(c["TotalInstanceCount"] for c in capacities)),
            available_instance_count=described.get("AvailableInstanceCount"),
            upfront_fee=float(fee) if fee not in (None, "") else None,
            currency=described.get("CurrencyCode", "USD"),
            target_resources=tuple(described.get("TargetResources") or ()),
        )

    @property
    def reserved(self) -> str:
        return f"{self.instance_count} x {self.instance_type}"

    def window(self) -> str:
        return f"{_when(self.start)} to {_when(self.end)}"

    def seconds_left(self, now: datetime) -> Optional[float]:
        """Seconds of the reservation a job submitted at `now` can use, from when it can start (None: no window)."""
        if self.start is None or self.end is None:
            return None
        return (self.end - max(now, self.start)).total_seconds()

    def fee(self) -> Optional[PlanFee]:
        """What the plan's upfront fee buys, for the cost of each job on it (see job_cost)."""
        if self.upfront_fee is None or self.start is None or self.end is None:
            return None
        hours = self.instance_count * (self.end - self.start).total_seconds() / 3600
        return PlanFee(self.name, self.upfront_fee, self.currency, hours) if hours else None


def plan_name(arn: str, variable: str = "ZERO_SM_TRAINING_PLAN_ARN") -> str:
    """The plan's name, from its ARN (`arn:aws:sagemaker:<region>:<account>:training-plan/<name>`)."""
    found = PLAN_ARN.match(arn.strip())
    if found is None:
        raise ValueError(
            f"{variable}={arn!r} is not a training plan ARN (arn:aws:sagemaker:<region>:<account>:training-plan/<name>)"
        )
    return found["name"]


def read_training_plan(client, arn: str, variable: str = "ZERO_SM_TRAINING_PLAN_ARN") -> TrainingPlan:
    """The plan `arn` names, described; a plan SageMaker does not know fails naming the setting."""
    name = plan_name(arn, variable)
    try:
        described = retry_call(
            lambda: client.describe_training_plan(TrainingPlanName=name),
            what=f"DescribeTrainingPlan {name}",
            endpoint=endpoint_of(client),
        )
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") in ("ResourceNotFound", "ValidationException"):
            raise ValueError(
                f"{variable}={arn}: SageMaker knows no training plan {name} in this account and region "
                f"({error.response['Error'].get('Message', '')})"
            ) from error
        raise
    plan = TrainingPlan.from_description(described)
    if plan.arn != arn.strip():
        raise ValueError(f"{variable}={arn}: DescribeTrainingPlan {name} answered for {plan.arn}, another plan")
    return plan


def plan_problems(
    plan: TrainingPlan,
    *,
    instance_type: str,
    instance_count: int,
    now: datetime,
    min_time_left_s: float,
    margin_s: float,
    settings_named: Mapping[str, str] = {},
) -> list[str]:
    """Why a job with these instances must not launch on `plan` at `now` ([] when it may)."""

    def setting(field: str) -> str:
        return f" ({settings_named[field]})" if field in settings_named else ""

    where = f"training plan {plan.name} ({plan.arn})"
    if plan.status in ENDED:
        said = f": {plan.status_message}" if plan.status_message else ""
        return [
            f"{where}: Status is {plan.status}{said}; a job on it would never run. "
            f"Point {settings_named.get('TrainingPlanArn', 'ZERO_SM_TRAINING_PLAN_ARN')} at a Scheduled or "
            "Active plan, or unset it"
        ]
    problems = []
    if plan.target_resources and TRAINING_JOBS not in plan.target_resources:
        problems.append(f"{where}: TargetResources is {list(plan.target_resources)}: it reserves no training jobs")
    if instance_type != plan.instance_type:
        problems.append(
            f"{where}: ResourceConfig.InstanceType is {instance_type}{setting('InstanceType')}, "
            f"but the plan reserves {plan.reserved}"
        )
    if instance_count > plan.instance_count:
        problems.append(
            f"{where}: ResourceConfig.InstanceCount is {instance_count}{setting('InstanceCount')}, "
            f"but the plan reserves {plan.reserved}"
        )
    left = plan.seconds_left(now)
    if left is None:
        problems.append(
            f"{where}: no StartTime/EndTime yet (Status {plan.status}): the job's MaxRuntimeInSeconds cannot be "
            "bounded by the plan's end; launch once DescribeTrainingPlan shows its window"
        )
    elif left < min_time_left_s or left - margin_s < 1:
        limit = (
            f"less than the minimum{setting('min_time_left')} of {min_time_left_s:.0f} s"
            if left < min_time_left_s
            else f"no more than the checkpoint margin{setting('margin')} of {margin_s:.0f} s"
        )
        problems.append(
            f"{where}: EndTime is {_when(plan.end)}, {_duration(max(left, 0))} of it left for a job starting "
            f"{'now' if plan.start and plan.start <= now else 'at its start'}, {limit}"
        )
    return problems


def launch_problems(plan: TrainingPlan, aws: SageMakerSettings, asset: str, params: dict, now: datetime) -> list[str]:
    """`plan_problems` of the Create*Job parameters `params` for `asset`, naming `aws`'s settings."""
    resources = params["ResourceConfig"]
    return plan_problems(
        plan,
        instance_type=resources["InstanceType"],
        instance_count=resources["InstanceCount"],
        now=now,
        min_time_left_s=aws.plan_min_time_left_s,
        margin_s=aws.plan_checkpoint_margin_s,
        settings_named={
            "InstanceType": compute_variable(asset, "instance_type"),
            "InstanceCount": compute_variable(asset, "instance_count"),
            "TrainingPlanArn": compute_variable(asset, "training_plan_arn"),
            "min_time_left": "ZERO_SM_PLAN_MIN_TIME_LEFT_S",
            "margin": "ZERO_SM_PLAN_CHECKPOINT_MARGIN_S",
        },
    )


def bounded_runtime(plan: TrainingPlan, max_runtime_s: int, margin_s: float, now: datetime) -> int:
    """MaxRuntimeInSeconds that stops the job `margin_s` before the plan ends."""
    left = plan.seconds_left(now)
    if left is None:
        return max_runtime_s
    return max(1, min(max_runtime_s, int(left - margin_s)))


def plan_metadata(plan: TrainingPlan) -> dict[str, Any]:
    """What a materialization records of the plan its job ran on."""
    return {
        "training_plan": plan.name,
        "training_plan_arn": plan.arn,
        "training_plan_window": plan.window(),
        "training_plan_reserved": plan.reserved,
        "training_plan_status_at_launch": plan.status,
    }


def waiting_message(job_name: str, plan: Optional[TrainingPlan], now: datetime, waited_s: float) -> str:
    """What the Pipes client says of a training job that SageMaker holds `Pending`."""
    if plan is None:
        return f"[pipes] {job_name} is Pending: SageMaker is waiting for capacity ({_duration(waited_s)} so far)"
    starts = (
        f"it starts {_when(plan.start)} (in {_duration((plan.start - now).total_seconds())})"
        if plan.start and plan.start > now
        else "its reserved instances are busy or being provisioned"
    )
    return (
        f"[pipes] {job_name} is waiting for training plan {plan.name} ({plan.window()}, {plan.reserved}): {starts}; "
        f"SageMaker starts the job when the plan is Active. The run waits ({_duration(waited_s)} so far), "
        "with no timeout of its own"
    )


class PendingWait:
    """Logs a training job held `Pending`: when the wait starts, every `every_s`, and when it ends."""

    def __init__(self, job_name: str, plan: Optional[TrainingPlan], every_s: float = 600.0) -> None:
        self.job_name, self.plan, self.every_s = job_name, plan, every_s
        self.since: Optional[float] = None
        self.reported_at = 0.0
        self.waited_s = 0.0  # the last wait's length, once it ended

    def seen(self, log, secondary_status: Optional[str]) -> None:
        """One description's SecondaryStatus (None: a job that is never held, such as a Processing job)."""
        now = time.monotonic()
        if secondary_status == "Pending":
            if self.since is None:
                self.since, self.reported_at = now, -self.every_s
            if now - self.reported_at >= self.every_s:
                log.info(waiting_message(self.job_name, self.plan, utc_now(), now - self.since))
                self.reported_at = now
        elif self.since is not None:
            self.waited_s, self.since = now - self.since, None
            on = f"training plan {self.plan.name}" if self.plan else "capacity"
            log.info(f"[pipes] {self.job_name} waited {_duration(self.waited_s)} for {on}; it is {secondary_status}")


def utc_now() -> datetime:
    return datetime.now(UTC)


def _utc(value: Optional[datetime]) -> Optional[datetime]:
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _when(moment: Optional[datetime]) -> str:
    return "(not scheduled)" if moment is None else moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds} s"
    hours, minutes = divmod(seconds // 60, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min"
