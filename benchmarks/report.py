"""The one line format every benchmark prints: `BENCH <name> ratio=<x> goal=<y>` plus its raw figures."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class BenchResult:
    name: str
    ratio: float
    goal: str  # ">=0.85" or "<=0.1"
    details: dict[str, float | int | str] = field(default_factory=dict)

    @property
    def met(self) -> bool:
        bound = float(self.goal[2:])
        return self.ratio >= bound if self.goal.startswith(">=") else self.ratio <= bound

    def line(self) -> str:
        extra = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in self.details.items())
        verdict = "met" if self.met else "MISSED"
        return f"BENCH {self.name} ratio={self.ratio:.3f} goal={self.goal} {verdict} {extra}".rstrip()
