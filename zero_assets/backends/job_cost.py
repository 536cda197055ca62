"""What a job cost: instance-seconds (run time summed over instances, on every backend), spot savings and
an estimate in USD: billable instance-hours x the on-demand price (`prices.json`, overlaid by
`ZERO_SM_PRICE_TABLE`), or on a Training Plan the job's share of its fee. No price: `cost_note` says why.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional

from zero_assets.core.settings import zero_env

BUILT_IN_PRICES = Path(__file__).parent / "sagemaker" / "prices.json"
BUILT_IN_NAME = "zero_assets/backends/sagemaker/prices.json"
PRICE_TABLE_ENV = "ZERO_SM_PRICE_TABLE"

# The metadata keys the run summary adds up (see zero_assets/defs/run_cost.py).
INSTANCE_SECONDS = "instance_seconds"
COST_USD = "estimated_cost_usd"
SPOT_SAVINGS_USD = "spot_savings_usd"
COST_NOTE = "cost_note"


@dataclass(frozen=True)
class Price:
    usd_per_instance_hour: float
    source: str  # the table file it came from, with that table's source and date


@dataclass(frozen=True)
class PriceTable:
    prices: dict[tuple[str, str], Price]  # (region, instance type) -> price
    files: tuple[str, ...]

    def price(self, region: str, instance_type: str) -> Optional[Price]:
        return self.prices.get((region, instance_type))


@dataclass(frozen=True)
class PlanFee:
    """A Training Plan's upfront fee and the instance-hours it buys (instances x the plan's hours)."""

    plan: str
    upfront_fee: float
    currency: str
    reserved_instance_hours: float


@dataclass(frozen=True)
class JobUsage:
    instance_type: str
    instance_count: int
    seconds_per_instance: Optional[float]  # None: SageMaker reported no run time (the job never started)
    billable_seconds_per_instance: Optional[float]
    managed_spot: bool = False


def price_table(environ: Optional[Mapping[str, str]] = None) -> PriceTable:
    """The built-in table, overlaid by the file `ZERO_SM_PRICE_TABLE` names; a bad file fails naming it."""
    prices = _read_table(BUILT_IN_PRICES, BUILT_IN_NAME)
    files = [BUILT_IN_NAME]
    override = zero_env(PRICE_TABLE_ENV, environ)
    if override:
        prices |= _read_table(Path(override), f"{PRICE_TABLE_ENV}={override}")
        files.append(override)
    return PriceTable(prices, tuple(files))


def _read_table(path: Path, named: str) -> dict[tuple[str, str], Price]:
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ValueError(
            f"price table {named}: cannot read it as JSON ({error}); fix the file or unset {PRICE_TABLE_ENV}"
        ) from error
    missing = [
        key for key in ("source", "as_of", "usd_per_instance_hour") if not isinstance(table, dict) or key not in table
    ]
    if missing:
        raise ValueError(
            f"price table {named}: missing {missing}; every table names where its prices come from (source) "
            f"and when (as_of), see {BUILT_IN_NAME} for the format"
        )
    source = f"{named} ({table['source']}, as of {table['as_of']})"
    prices = {}
    for region, types in table["usd_per_instance_hour"].items():
        for instance_type, usd in (types or {}).items():
            if isinstance(usd, bool) or not isinstance(usd, (int, float)) or usd < 0:
                raise ValueError(
                    f"price table {named}: usd_per_instance_hour.{region}.{instance_type} is {usd!r}, "
                    "not a price (a number >= 0)"
                )
            prices[(region, instance_type)] = Price(float(usd), source)
    return prices


def usage_of(kind: Literal["training", "processing"], job: dict[str, Any]) -> JobUsage:
    """Instances and seconds from a DescribeTrainingJob or DescribeProcessingJob answer."""
    if kind == "training":
        resources = job.get("ResourceConfig", {})
        ran, billable = job.get("TrainingTimeInSeconds"), job.get("BillableTimeInSeconds")
        spot = bool(job.get("EnableManagedSpotTraining"))
        if ran is None and not spot:
            ran = billable  # on demand, billable time is the time the instances ran
        return JobUsage(
            resources.get("InstanceType", "?"),
            resources.get("InstanceCount", 1),
            ran,
            billable if billable is not None else ran,
            spot,
        )
    resources = job.get("ProcessingResources", {}).get("ClusterConfig", {})
    start, end = job.get("ProcessingStartTime"), job.get("ProcessingEndTime")
    ran = (end - start).total_seconds() if start and end else None
    return JobUsage(resources.get("InstanceType", "?"), resources.get("InstanceCount", 1), ran, ran)


def cost_metadata(
    usage: JobUsage, region: str, prices: PriceTable, plan_fee: Optional[PlanFee] = None
) -> dict[str, Any]:
    """Cost metadata for one SageMaker job; with `plan_fee`, its share of the plan's fee instead of a price."""
    count = usage.instance_count
    metadata: dict[str, Any] = {"instance_type": usage.instance_type, "instance_count": count, "region": region}
    if usage.seconds_per_instance is None:
        return {
            **metadata,
            COST_NOTE: "SageMaker reported no run time for this job (it never started): nothing to count",
        }
    instance_seconds = round(usage.seconds_per_instance * count, 2)
    billable = round((usage.billable_seconds_per_instance or 0.0) * count, 2)
    metadata |= {
        INSTANCE_SECONDS: instance_seconds,
        "billable_instance_seconds": billable,
        "managed_spot": usage.managed_spot,
    }
    if plan_fee is not None:
        return metadata | plan_share(plan_fee, billable)
    price = prices.price(region, usage.instance_type)
    if price is None:
        return {
            **metadata,
            COST_NOTE: f"no price for {usage.instance_type} in {region} in the price table "
            f"({', '.join(prices.files)}): add it to a file named by {PRICE_TABLE_ENV} for an estimate",
        }
    per_second = price.usd_per_instance_hour / 3600
    metadata |= {
        "on_demand_usd_per_instance_hour": price.usd_per_instance_hour,
        COST_USD: round(billable * per_second, 4),
        "price_source": price.source,
    }
    if usage.managed_spot and instance_seconds > 0:
        paid_share = billable / instance_seconds  # SageMaker's own savings formula: 1 - Billable / TrainingTime
        metadata |= {
            "spot_savings_pct": round((1 - paid_share) * 100, 1),
            SPOT_SAVINGS_USD: round((instance_seconds - billable) * per_second, 4),
            "spot_usd_per_instance_hour": round(price.usd_per_instance_hour * paid_share, 4),
        }
    return metadata


def plan_share(fee: PlanFee, billable_instance_seconds: float) -> dict[str, Any]:
    """A job's share of its plan's fee: the instance-hours it used at the fee's rate per reserved instance-hour."""
    rate = fee.upfront_fee / fee.reserved_instance_hours
    share = round(billable_instance_seconds / 3600 * rate, 4)
    metadata: dict[str, Any] = {
        "training_plan_upfront_fee": fee.upfront_fee,
        "training_plan_currency": fee.currency,
        "training_plan_reserved_instance_hours": round(fee.reserved_instance_hours, 2),
        "training_plan_fee_per_instance_hour": round(rate, 4),
        "training_plan_fee_share": share,
    }
    if fee.currency != "USD":
        return {**metadata, COST_NOTE: f"training plan {fee.plan} is billed in {fee.currency}: no USD estimate"}
    source = (
        f"training plan {fee.plan}: its upfront fee of {fee.upfront_fee} USD over its "
        f"{fee.reserved_instance_hours:.1f} reserved instance-hours"
    )
    return {**metadata, COST_USD: share, "price_source": source}


def job_cost(
    kind: Literal["training", "processing"],
    job: dict[str, Any],
    region: str,
    prices: PriceTable,
    plan_fee: Optional[PlanFee] = None,
) -> dict[str, Any]:
    return cost_metadata(usage_of(kind, job), region, prices, plan_fee)


def local_cost(wall_s: float, hosts: int) -> dict[str, Any]:
    """A job run by the local backend: its time, counted as SageMaker's is, and no price."""
    return {INSTANCE_SECONDS: round(wall_s * hosts, 2), COST_NOTE: "local backend: this machine's time is not priced"}
