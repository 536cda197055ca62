"""Pure helpers of Training Plans: the runtime bound, the problems a plan names, the waiting reports,
and a job's share of the plan's fee."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest

from zero_assets.backends.job_cost import JobUsage, PlanFee, cost_metadata, price_table
from zero_assets.backends.sagemaker.training_plan import (
    PendingWait,
    TrainingPlan,
    bounded_runtime,
    plan_name,
    plan_problems,
)

START = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)
ARN = "arn:aws:sagemaker:us-east-1:123456789012:training-plan/zero-p5-campaign"


def plan(status: str = "Active", hours: float = 48, count: int = 2, fee: float | None = 96_000.0) -> TrainingPlan:
    return TrainingPlan(
        arn=ARN,
        name="zero-p5-campaign",
        status=status,
        status_message="",
        start=START,
        end=START + timedelta(hours=hours),
        instance_type="ml.p5.48xlarge",
        instance_count=count,
        available_instance_count=count,
        upfront_fee=fee,
        currency="USD",
        target_resources=("training-job",),
    )


@pytest.mark.parametrize(
    "now, configured, expected",
    [
        (START + timedelta(hours=2), 5 * 24 * 3600, 46 * 3600 - 1800),  # active: from now to the end, less the margin
        (START - timedelta(days=3), 5 * 24 * 3600, 48 * 3600 - 1800),  # scheduled: counted from the plan's start
        (START + timedelta(hours=2), 3600, 3600),  # the configured runtime is shorter: it stays
        (START + timedelta(hours=48) - timedelta(seconds=600), 3600, 1),  # past the margin: refused by the problems
    ],
    ids=["active", "scheduled", "configured-shorter", "inside-the-margin"],
)
def test_the_runtime_ends_a_margin_before_the_plan(now, configured, expected):
    assert bounded_runtime(plan(), configured, 1800, now) == expected


def test_problems_name_the_plan_and_each_field_and_a_fitting_request_has_none():
    now = START + timedelta(hours=1)
    fits = dict(instance_type="ml.p5.48xlarge", instance_count=2, now=now, min_time_left_s=3600, margin_s=1800)
    assert plan_problems(plan(), **fits) == []
    wrong = plan_problems(
        plan(),
        **{**fits, "instance_type": "ml.g5.48xlarge", "instance_count": 3},
        settings_named={"InstanceType": "ZERO_SM_TRAINED_CHECKPOINT_INSTANCE_TYPE"},
    )
    assert len(wrong) == 2 and all(p.startswith(f"training plan zero-p5-campaign ({ARN})") for p in wrong)
    assert "ResourceConfig.InstanceType is ml.g5.48xlarge (ZERO_SM_TRAINED_CHECKPOINT_INSTANCE_TYPE)" in wrong[0]
    assert "ResourceConfig.InstanceCount is 3" in wrong[1] and "reserves 2 x ml.p5.48xlarge" in wrong[1]
    [short] = plan_problems(plan(hours=1.5), **fits)
    assert "30 min of it left" in short and "less than the minimum of 3600 s" in short
    [ended] = plan_problems(plan("Expired"), **fits)
    assert "Status is Expired" in ended and "ZERO_SM_TRAINING_PLAN_ARN" in ended
    with pytest.raises(ValueError, match="ZERO_SM_TRAINING_PLAN_ARN='zero-p5-campaign' is not a training plan ARN"):
        plan_name("zero-p5-campaign")


def test_a_pending_job_is_reported_when_it_starts_waiting_while_it_waits_and_when_it_is_done(caplog):
    log = logging.getLogger("pending-test")
    caplog.set_level(logging.INFO, "pending-test")
    wait = PendingWait("zero-trained-checkpoint-0123456789abcdef-a1", plan(), every_s=0.0)
    for status in ("Starting", "Pending", "Pending", "Training", "Training"):
        wait.seen(log, status)
    said = [record.getMessage() for record in caplog.records]
    assert len(said) == 3, said  # two reports while Pending (every_s=0), one when it ended
    assert "is waiting for training plan zero-p5-campaign" in said[0] and "no timeout of its own" in said[0]
    assert said[2].startswith("[pipes] zero-trained-checkpoint-0123456789abcdef-a1 waited") and "Training" in said[2]


def test_a_job_on_a_plan_costs_its_share_of_the_upfront_fee():
    # 96000 USD for 2 instances x 48 h: 1000 USD an instance-hour; 2 instances for 3 h used 6 of them.
    usage = JobUsage("ml.p5.48xlarge", 2, 3 * 3600, 3 * 3600)
    metadata = cost_metadata(usage, "us-east-1", price_table(), plan().fee())
    assert metadata["training_plan_fee_per_instance_hour"] == 1000.0
    assert metadata["estimated_cost_usd"] == metadata["training_plan_fee_share"] == 6000.0
    assert "on_demand_usd_per_instance_hour" not in metadata  # not billed by the hour
    in_euros = cost_metadata(usage, "us-east-1", price_table(), PlanFee("p", 100.0, "EUR", 10.0))
    assert "estimated_cost_usd" not in in_euros and "billed in EUR" in in_euros["cost_note"]
    assert plan(fee=None).fee() is None
