"""The rehearsal gate: production training launches only what a passed rehearsal (a `training_rehearsal`
materialization recording its key) ran; `ZERO_REHEARSAL_GATE` decides where a miss blocks, else it warns."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dagster import AssetCheckResult, AssetCheckSeverity, AssetKey, DagsterInstance, EventLogRecord, MetadataValue

from zero_assets.backends.job_runner import GATE_VARIABLE, JobRunner
from zero_assets.core.fingerprints import key_differences, rehearsal_key, rehearsal_key_inputs
from zero_assets.core.settings import zero_env
from zero_assets.launch.upstream import latest_materializations

GATE_VALUES = ("auto", "on", "off")
REHEARSAL_ASSET = "training_rehearsal"
REHEARSAL_CHECK = "rehearsal_passed"
REHEARSAL_KEY = "rehearsal_key"  # the metadata keys a rehearsal records its key and key inputs under
REHEARSAL_KEY_INPUTS = "rehearsal_key_inputs"
LOOK_BACK = 50  # rehearsal materializations searched, newest first
REHEARSAL_COMMAND = f"dg launch --assets {REHEARSAL_ASSET}"


def gate_policy(jobs: JobRunner, environ: Mapping[str, str] | None = None) -> tuple[bool, str]:
    """(whether the gate is enforced for `jobs`, and why, in words)."""
    value = (zero_env(GATE_VARIABLE, environ) or "auto").lower()
    if value not in GATE_VALUES:
        raise ValueError(f"{GATE_VARIABLE}={value!r} is not one of {GATE_VALUES}")
    if value != "auto":
        return value == "on", f"{GATE_VARIABLE}={value}"
    return jobs.rehearsal_gate_default(environ)


@dataclass(frozen=True)
class GateVerdict:
    """What the gate found for one training: its key, the passed rehearsal (or None), else how the newest differs."""

    key: str
    inputs: dict[str, Any]
    enforced: bool
    policy: str
    rehearsal: EventLogRecord | None
    differences: str

    @property
    def passed(self) -> bool:
        return self.rehearsal is not None

    def summary(self) -> str:
        if self.rehearsal is not None:
            return f"rehearsal run {self.rehearsal.run_id} passed for this code version and configuration"
        return (
            f"no passed rehearsal of {self.inputs['module']} at code version {self.inputs['code']} with this "
            f"configuration (rehearsal key {self.key}); {self.differences}"
        )

    def check_result(self) -> AssetCheckResult:
        """`rehearsal_passed`: passed, else an ERROR where the gate is enforced (it blocks), a WARN elsewhere."""
        metadata: dict[str, Any] = {
            REHEARSAL_KEY: self.key,
            REHEARSAL_KEY_INPUTS: MetadataValue.json(self.inputs),
            "enforced": self.enforced,
            "policy": self.policy,
        }
        if self.rehearsal is not None:
            metadata["rehearsal_run_id"] = self.rehearsal.run_id
            uri = self.rehearsal.asset_materialization.metadata.get("dagster/uri")
            if uri is not None:
                metadata["rehearsal_uri"] = uri
            return AssetCheckResult(
                check_name=REHEARSAL_CHECK, passed=True, description=self.summary(), metadata=metadata
            )
        where = "enforced" if self.enforced else "not enforced"
        return AssetCheckResult(
            check_name=REHEARSAL_CHECK,
            passed=False,
            severity=AssetCheckSeverity.ERROR if self.enforced else AssetCheckSeverity.WARN,
            description=f"{self.summary()}; run `{REHEARSAL_COMMAND}` ({where} here: {self.policy})",
            metadata=metadata,
        )

    def refusal(self, asset: str) -> str | None:
        """Why `asset` must not launch (None: it may)."""
        if self.passed or not self.enforced:
            return None
        return (
            f"{asset} not launched: {self.summary()}. Rehearse it first: `{REHEARSAL_COMMAND}`, with its `training` "
            f"config set to this run's {asset} config (docs/training-campaign.md); the gate is enforced here "
            f"({self.policy}); {GATE_VARIABLE}=off trains without a rehearsal"
        )


def training_key_inputs(
    jobs: JobRunner, module: str, hyperparameters: dict[str, Any], tracking: dict[str, Any]
) -> dict[str, Any]:
    """The rehearsal key inputs of a training run as `jobs` would launch it."""
    return rehearsal_key_inputs(module, hyperparameters, tracking, jobs.environment())


def training_gate(
    instance: DagsterInstance, jobs: JobRunner, module: str, hyperparameters: dict[str, Any], tracking: dict[str, Any]
) -> GateVerdict:
    inputs = training_key_inputs(jobs, module, hyperparameters, tracking)
    key = rehearsal_key(inputs)
    enforced, policy = gate_policy(jobs)
    records = latest_materializations(instance, AssetKey(REHEARSAL_ASSET), limit=LOOK_BACK)
    found = next((r for r in records if _recorded(r, REHEARSAL_KEY) == key), None)
    if found is not None or not records:
        return GateVerdict(key, inputs, enforced, policy, found, "no rehearsal has run in this instance")
    newest = _recorded(records[0], REHEARSAL_KEY_INPUTS) or {}
    changes = key_differences(newest, inputs)
    differences = (
        f"the newest rehearsal (run {records[0].run_id}) differs: {'; '.join(changes)}"
        if changes
        else f"the newest rehearsal (run {records[0].run_id}) records no key inputs"
    )
    return GateVerdict(key, inputs, enforced, policy, None, differences)


def _recorded(record: EventLogRecord, name: str) -> Any:
    value = record.asset_materialization.metadata.get(name) if record.asset_materialization else None
    return None if value is None else value.value
