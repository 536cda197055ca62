"""The Training Plan half of the SageMaker fake (`sagemaker_fakes.FakeSageMaker` inherits it).

A plan's status follows the clock as SageMaker's does: `Scheduled` before its start, `Active` until its
end, then `Expired` (`fail_training_plan` makes it `Failed`). DescribeTrainingPlan validates its request
and its answer against botocore's model. CreateTrainingJob with `ResourceConfig.TrainingPlanArn` is
refused (ValidationException) for a plan that is unknown, ended, or reserves other instances, as
SageMaker refuses it; an accepted job stays `InProgress`/`Pending` until its plan is `Active`, and is
killed with no grace when the plan ends under it (its instances go back), `Failed` with a
CapacityError. `extend_training_plan` moves a plan's end later, as a plan extension does.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import botocore.session
from botocore.exceptions import ClientError
from botocore.validate import validate_parameters

_MODEL = botocore.session.get_session().get_service_model("sagemaker")
ACCOUNT = "123456789012"


def validated_response(operation: str, response: dict) -> dict:
    """`response` once it passes botocore's model of what `operation` answers (None values dropped, as
    SageMaker leaves unset members out)."""
    response = {key: value for key, value in response.items() if value is not None}
    validate_parameters(response, _MODEL.operation_model(operation).output_shape)
    return response


def validation_error(operation: str, message: str) -> ClientError:
    return ClientError({"Error": {"Code": "ValidationException", "Message": message}}, operation)


class FakeTrainingPlans:
    """Plans and the plan checks of FakeSageMaker, which holds `calls`, `jobs` and `plans`."""

    calls: list
    jobs: dict[str, dict]
    plans: dict[str, dict]

    @property
    def region(self) -> str:
        return self.meta.region_name

    def add_training_plan(
        self,
        name: str,
        *,
        instance_type: str,
        instance_count: int,
        starts_in_s: float,
        lasts_s: float,
        upfront_fee: str = "7200.00",
        currency: str = "USD",
        target_resources: tuple[str, ...] = ("training-job",),
    ) -> str:
        """A plan bought for `instance_count` x `instance_type`, starting `starts_in_s` from now (negative:
        already started) for `lasts_s`; returns its ARN."""
        start = datetime.now(UTC) + timedelta(seconds=starts_in_s)
        arn = f"arn:aws:sagemaker:{self.region}:{ACCOUNT}:training-plan/{name}"
        self.plans[name] = {
            "arn": arn,
            "instance_type": instance_type,
            "instance_count": instance_count,
            "start": start,
            "end": start + timedelta(seconds=lasts_s),
            "fee": upfront_fee,
            "currency": currency,
            "targets": list(target_resources),
            "failed": False,
        }
        return arn

    def start_plan_once_a_job_waits(self, name: str, held_s: float = 2.0, timeout_s: float = 300.0) -> threading.Thread:
        """Move the Scheduled plan `name` to start now, keeping its length, once a job has waited `Pending`
        on it for `held_s` (long enough for the client's polls to see the wait): a thread, returned to
        join. A start a fixed time ahead can pass on a loaded machine before the job is even submitted,
        and then nothing waits."""

        def start_when_held() -> None:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                if any(
                    job["secondary"] == "Pending" and self._plan_name(job) == name for job in list(self.jobs.values())
                ):
                    time.sleep(held_s)
                    plan = self.plans[name]
                    length = plan["end"] - plan["start"]
                    plan["start"] = datetime.now(UTC)
                    plan["end"] = plan["start"] + length
                    return
                time.sleep(0.05)

        thread = threading.Thread(target=start_when_held, daemon=True)
        thread.start()
        return thread

    def extend_training_plan(self, name: str, seconds: float) -> None:
        self.plans[name]["end"] += timedelta(seconds=seconds)

    def fail_training_plan(self, name: str) -> None:
        self.plans[name]["failed"] = True

    def training_plan_status(self, name: str) -> str:
        plan, now = self.plans[name], datetime.now(UTC)
        if plan["failed"]:
            return "Failed"
        return "Scheduled" if now < plan["start"] else "Active" if now < plan["end"] else "Expired"

    def describe_training_plan(self, **params) -> dict:
        operation = "DescribeTrainingPlan"
        validate_parameters(params, _MODEL.operation_model(operation).input_shape)
        name = params["TrainingPlanName"]
        self.calls.append((operation, name))
        if name not in self.plans:
            raise ClientError(
                {"Error": {"Code": "ResourceNotFound", "Message": f"Training plan {name} not found"}}, operation
            )
        plan, status = self.plans[name], self.training_plan_status(name)
        hours, rest = divmod(int((plan["end"] - plan["start"]).total_seconds()), 3600)
        available = plan["instance_count"] - self._instances_in_use(plan["arn"]) if status == "Active" else 0
        capacity = {
            "ReservedCapacityArn": f"arn:aws:sagemaker:{self.region}:{ACCOUNT}:reserved-capacity/{name}-rc1",
            "InstanceType": plan["instance_type"],
            "TotalInstanceCount": plan["instance_count"],
            "Status": status,
            "AvailabilityZone": f"{self.region}a",
            "DurationHours": hours,
            "DurationMinutes": rest // 60,
            "StartTime": plan["start"],
            "EndTime": plan["end"],
        }
        return validated_response(
            operation,
            {
                "TrainingPlanArn": plan["arn"],
                "TrainingPlanName": name,
                "Status": status,
                "StatusMessage": "payment failed" if plan["failed"] else None,
                "DurationHours": hours,
                "DurationMinutes": rest // 60,
                "StartTime": plan["start"],
                "EndTime": plan["end"],
                "UpfrontFee": plan["fee"],
                "CurrencyCode": plan["currency"],
                "TotalInstanceCount": plan["instance_count"],
                "AvailableInstanceCount": available,
                "InUseInstanceCount": plan["instance_count"] - available if status == "Active" else 0,
                "TargetResources": plan["targets"],
                "ReservedCapacitySummaries": [capacity],
            },
        )

    def check_plan_request(self, params: dict) -> None:
        """CreateTrainingJob's checks of the plan it names, as SageMaker's ValidationException."""
        arn = params["ResourceConfig"].get("TrainingPlanArn")
        if arn is None:
            return
        name = arn.rsplit("/", 1)[-1]
        plan = self.plans.get(name)
        if plan is None or plan["arn"] != arn:
            raise validation_error("CreateTrainingJob", f"Training plan {arn} does not exist")
        status = self.training_plan_status(name)
        if status in ("Expired", "Failed"):
            raise validation_error("CreateTrainingJob", f"Training plan {name} is {status}")
        resources = params["ResourceConfig"]
        if resources["InstanceType"] != plan["instance_type"] or resources["InstanceCount"] > plan["instance_count"]:
            raise validation_error(
                "CreateTrainingJob",
                f"{resources['InstanceCount']} x {resources['InstanceType']} does not fit training plan {name} "
                f"({plan['instance_count']} x {plan['instance_type']})",
            )

    def hold_until_plan_active(self, job: dict) -> bool:
        """Keep a job on a plan `Pending` until the plan is Active; False when it was stopped or the plan
        ended meanwhile (the job has then ended)."""
        name = self._plan_name(job)
        if name is None or self.training_plan_status(name) == "Active":
            return True
        self._enter(job, "Pending")
        while self.training_plan_status(name) == "Scheduled":
            if job["status"] == "Stopping":
                job.update(status="Stopped", ended=datetime.now(UTC))
                self._enter(job, "Stopped")
                return False
            time.sleep(0.05)
        if self.training_plan_status(name) != "Active":
            job.update(status="Failed", failure=f"CapacityError: training plan {name} ended", ended=datetime.now(UTC))
            self._enter(job, "Failed")
            return False
        return True

    def plan_deadline(self, job: dict) -> float | None:
        """When (time.monotonic) the job's plan ends and its instances go back; None off a plan."""
        name = self._plan_name(job)
        if name is None:
            return None
        return time.monotonic() + (self.plans[name]["end"] - datetime.now(UTC)).total_seconds()

    def _plan_name(self, job: dict) -> str | None:
        arn = job["params"].get("ResourceConfig", {}).get("TrainingPlanArn") if job["kind"] == "training" else None
        return None if arn is None else arn.rsplit("/", 1)[-1]

    def _instances_in_use(self, arn: str) -> int:
        return sum(
            job["params"]["ResourceConfig"]["InstanceCount"]
            for job in self.jobs.values()
            if job["kind"] == "training"
            and job["status"] in ("InProgress", "Stopping")
            and job["secondary"] != "Pending"
            and job["params"]["ResourceConfig"].get("TrainingPlanArn") == arn
        )

    @staticmethod
    def _enter(job: dict, status: str) -> None:
        """The job's SecondaryStatus becomes `status`, recorded with its time as SecondaryStatusTransitions lists it."""
        job["secondary"] = status
        job["transitions"].append((status, datetime.now(UTC)))
