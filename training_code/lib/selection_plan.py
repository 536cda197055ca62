"""The selection job's plan, written before launch: `<plan>/policy.sql` (the policy's SQL) and `plan.json`,
written last, naming each chosen source's validated output and data version, the settings and tables."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .hashing import sha256_bytes
from .perceptual_hash import BITS
from .storage import join, read_bytes, write_bytes_atomic

DEFAULT_POLICY = Path(__file__).resolve().parents[1] / "selection_policy.sql"
PLAN_FORMAT = "zero-selection-plan/1"
PLAN_FILE = "plan.json"
POLICY_FILE = "policy.sql"


@dataclass(frozen=True)
class SelectionPolicy:
    """The policy's settings, the variables its SQL reads (`getvariable('<name>')`)."""

    max_images_per_source: int | None = None
    source_caps: Mapping[str, int] = field(default_factory=dict)
    max_images: int | None = None
    source_weights: Mapping[str, float] = field(default_factory=dict)
    categories: tuple[str, ...] = ()
    negatives: bool = True
    near_duplicate_max_distance: int = 8  # pHash bits apart for a candidate pair
    near_duplicate_confirm_distance: int = 12  # difference-hash bits apart for the pair to count

    def __post_init__(self) -> None:
        for name in ("near_duplicate_max_distance", "near_duplicate_confirm_distance"):
            if not 0 <= getattr(self, name) < BITS:
                raise ValueError(f"{name} must be within 0..{BITS - 1} bits, got {getattr(self, name)}")
        caps = {"max_images_per_source": self.max_images_per_source, "max_images": self.max_images}
        caps |= {f"source_caps[{s}]": cap for s, cap in self.source_caps.items()}
        for name, cap in caps.items():
            if cap is not None and cap < 0:
                raise ValueError(f"{name} must be 0 or more, got {cap}")
        for source, weight in self.source_weights.items():
            if not math.isfinite(weight) or weight < 0:
                raise ValueError(f"source_weights[{source}] must be a finite number >= 0, got {weight}")

    def as_config(self) -> dict[str, Any]:
        """The settings as the plan and the manifest record them."""
        config = asdict(self)
        config["source_caps"] = dict(sorted(self.source_caps.items()))
        config["source_weights"] = dict(sorted(self.source_weights.items()))
        config["categories"] = sorted(self.categories)
        return config

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> SelectionPolicy:
        return cls(**{**config, "categories": tuple(config.get("categories", ()))})


@dataclass(frozen=True)
class SelectionPlan:
    """What a selection job reads: the chosen sources' validated outputs, the policy, the user's tables."""

    sources: list[dict[str, str]]  # source, validated_uri, data_version; by source name
    policy: SelectionPolicy
    tables: dict[str, str] = field(default_factory=dict)  # name the SQL uses -> a Parquet file (local or s3://)
    raw_uri: str = ""  # where the near-duplicate contact sheet reads its few images

    def as_json(self) -> dict[str, Any]:
        return {
            "format": PLAN_FORMAT,
            "sources": self.sources,
            "policy": self.policy.as_config(),
            "tables": dict(sorted(self.tables.items())),
            "raw_uri": self.raw_uri,
        }


def write_plan(folder: str, plan: SelectionPlan, policy_sql: str) -> None:
    """The plan at `folder` (local or s3://): the policy's SQL, then `plan.json` (last, naming its sha256)."""
    write_bytes_atomic(join(folder, POLICY_FILE), policy_sql.encode())
    described = {**plan.as_json(), "policy_sql_sha256": sha256_bytes(policy_sql.encode())}
    write_bytes_atomic(join(folder, PLAN_FILE), json.dumps(described, indent=1, sort_keys=True).encode())


def read_plan(folder: str | os.PathLike) -> tuple[SelectionPlan, str]:
    """The plan at `folder` and its policy's SQL, checked against the sha256 the plan records."""
    uri = join(folder, PLAN_FILE)
    described = json.loads(read_bytes(uri))
    if described.get("format") != PLAN_FORMAT:
        raise ValueError(f"{uri}: format {described.get('format')!r} is not {PLAN_FORMAT!r}")
    sql = read_bytes(join(folder, POLICY_FILE))
    if sha256_bytes(sql) != described["policy_sql_sha256"]:
        raise ValueError(f"{join(folder, POLICY_FILE)} is not the policy {uri} was written with")
    plan = SelectionPlan(
        described["sources"],
        SelectionPolicy.from_config(described["policy"]),
        described["tables"],
        described["raw_uri"],
    )
    return plan, sql.decode()
