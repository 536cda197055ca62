"""A hyperparameter search as SageMaker's tuning takes it: ranges, objective, strategy, limits.

SageMaker runs a `TuningSpec` as one tuning job; the local backend runs the trials `local_trials` samples.
The objective is a number the trainer logs in its JSON lines (`"final_loss": 0.41`), matched in the job's log.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass
from typing import Any, Literal

STRATEGIES = ("Bayesian", "Random", "Hyperband", "Grid")
_NUMBER = r"(-?[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)"


@dataclass(frozen=True)
class ParameterRange:
    """One tuned hyperparameter: a trainer argument (a TrainConfig field such as `lr`) and its range."""

    name: str
    kind: Literal["continuous", "integer", "categorical"]
    low: float = 0.0
    high: float = 0.0
    scaling: Literal["Auto", "Linear", "Logarithmic", "ReverseLogarithmic"] = "Auto"
    values: tuple[str, ...] = ()

    def problem(self) -> str | None:
        if self.kind == "categorical":
            return None if self.values else "lists no values"
        if not self.low < self.high:
            return f"low {self.low} is not below high {self.high}"
        if self.scaling == "Logarithmic" and self.low <= 0:
            return "Logarithmic scaling needs low above 0"
        if self.scaling == "ReverseLogarithmic" and not (self.kind == "continuous" and 0 <= self.low and self.high < 1):
            return "ReverseLogarithmic scaling needs a continuous range within [0, 1)"
        return None

    def sample(self, rng: random.Random) -> Any:
        if self.kind == "categorical":
            return rng.choice(self.values)
        if self.scaling == "Logarithmic":
            value = math.exp(rng.uniform(math.log(self.low), math.log(self.high)))
        elif self.scaling == "ReverseLogarithmic":
            value = 1 - math.exp(rng.uniform(math.log(1 - self.high), math.log(1 - self.low)))
        else:
            value = rng.uniform(self.low, self.high)
        return round(value) if self.kind == "integer" else float(f"{value:.6g}")


@dataclass(frozen=True)
class TuningSpec:
    ranges: tuple[ParameterRange, ...]
    objective_metric: str = "final_loss"
    objective_type: Literal["Minimize", "Maximize"] = "Minimize"
    strategy: str = "Bayesian"
    max_trials: int = 4
    max_parallel_trials: int = 2
    early_stopping: Literal["Off", "Auto"] = "Off"
    seed: int = 0

    def check(self, hyperparameters: dict[str, Any], field: str) -> None:
        """Fail naming `field` (where the spec came from) when the search cannot run on `hyperparameters`."""
        problems = [] if self.ranges else ["no ranges: name at least one hyperparameter to tune"]
        for tuned in self.ranges:
            if tuned.name not in hyperparameters:
                problems.append(f"range {tuned.name!r} names none of the hyperparameters {sorted(hyperparameters)}")
            elif (why := tuned.problem()) is not None:
                problems.append(f"range {tuned.name!r} {why}")
        names = [tuned.name for tuned in self.ranges]
        if len(set(names)) < len(names):
            problems.append(f"a hyperparameter has two ranges: {sorted(n for n in names if names.count(n) > 1)}")
        if self.strategy not in STRATEGIES:
            problems.append(f"strategy {self.strategy!r} is not one of {STRATEGIES}")
        if self.strategy == "Grid" and any(tuned.kind != "categorical" for tuned in self.ranges):
            problems.append("the Grid strategy takes categorical ranges only (SageMaker's rule)")
        if self.strategy == "Hyperband" and self.early_stopping != "Off":
            problems.append("Hyperband stops trials itself: set early_stopping to Off")
        if not 1 <= self.max_parallel_trials <= self.max_trials:
            problems.append(f"max_parallel_trials {self.max_parallel_trials} must be within [1, max_trials]")
        if problems:
            raise ValueError(f"{field}: " + "; ".join(problems))

    def local_trials(self, base: dict[str, Any]) -> list[dict[str, Any]]:
        """The local backend's trials: every Grid combination (at most max_trials), else seeded random draws."""
        rng = random.Random(self.seed)
        if self.strategy == "Grid":
            grid = itertools.product(*(tuned.values for tuned in self.ranges))
            draws = [
                dict(zip([t.name for t in self.ranges], combo)) for combo in itertools.islice(grid, self.max_trials)
            ]
        else:
            draws = [{tuned.name: tuned.sample(rng) for tuned in self.ranges} for _ in range(self.max_trials)]
        return [{**base, **{name: typed_like(base[name], value) for name, value in draw.items()}} for draw in draws]

    def metric_definitions(self) -> list[dict[str, str]]:
        """SageMaker's MetricDefinitions: the objective and the per-step `loss` (what early stopping watches)."""
        names = dict.fromkeys([self.objective_metric, "loss"])
        return [{"Name": name, "Regex": f'"{name}": {_NUMBER}'} for name in names]

    def best(self, trials: list[dict[str, Any]]) -> dict[str, Any] | None:
        """The trial with the best objective (`trials` carry it as `objective`; None where a trial failed)."""
        scored = [trial for trial in trials if isinstance(trial.get("objective"), (int, float))]
        if not scored:
            return None
        sign = 1 if self.objective_type == "Minimize" else -1
        return min(scored, key=lambda trial: sign * trial["objective"])


def typed_like(base: Any, value: Any) -> Any:
    """`value` (a sampled number, or SageMaker's string) as the type of the hyperparameter's default."""
    if isinstance(base, bool):
        return str(value).lower() in ("1", "true", "yes")
    if isinstance(base, int):
        return int(float(value))
    if isinstance(base, float):
        return float(value)
    return str(value)
