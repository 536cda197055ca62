"""The rehearsal gate: production training launches only what a passed rehearsal ran.

`training_gate` derives the rehearsal key (`core/rehearsal_key.py`) of the training about to launch and
looks for a `training_rehearsal` materialization that recorded the same key (a rehearsal is materialized
only when it passed). Its verdict is `trained_checkpoint`'s blocking check `rehearsal_passed` and, where
the gate is enforced, the refusal before launch, naming the missing rehearsal and the command that runs it.

Where it is enforced (`ZERO_REHEARSAL_GATE`): `on` everywhere, `off` nowhere, `auto` (the default) on
the SageMaker backend with the production profile, where a bug costs reserved GPUs. Elsewhere (the local
backend, `ZERO_PROFILE=rehearsal`, whose whole graph is itself a rehearsal) the check still says whether
a rehearsal passed, as a warning that blocks nothing, so `make demo` trains without running one first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dagster import AssetCheckResult, AssetCheckSeverity, AssetKey, DagsterInstance, EventLogRecord, MetadataValue

from zero_assets.backends.job_runner import JobRunner
from zero_assets.backends.sagemaker.profiles import profile_from_env
from zero_assets.core.rehearsal_key import key_differences, rehearsal_key, rehearsal_key_inputs
from zero_assets.core.settings import zero_env
from zero_assets.launch.upstream import latest_materializations

GATE_VARIABLE = "ZERO_REHEARSAL_GATE"
GATE_VALUES = ("auto", "on", "off")
REHEARSAL_ASSET = "training_rehearsal"
REHEARSAL_CHECK = "rehearsal_passed"
REHEARSAL_KEY = "rehearsal_key"  # the metadata keys a rehearsal records its key and key inputs under
REHEARSAL_KEY_INPUTS = "rehearsal_key_inputs"
LOOK_BACK = 50  # rehearsal materializations searched, newest first
REHEARSAL_COMMAND = f"dagster asset materialize -m zero_assets.definitions --select {REHEARSAL_ASSET}"


def sagemaker_settings_of(jobs: JobRunner):
    """The SageMaker backend's settings when `jobs` is its runner, else None."""
    from zero_assets.backends.sagemaker.runner import SageMakerJobRunner  # boto3 and dagster-aws only when used

    return jobs.aws if isinstance(jobs, SageMakerJobRunner) else None


def runner_environment(jobs: JobRunner) -> dict[str, str]:
    """Where the scripts run, as the key covers it: the runner, and on SageMaker the images they run in."""
    aws = sagemaker_settings_of(jobs)
    environment = {"runner": type(jobs).__name__}
    if aws is not None:
        environment.update(training_image=aws.training_image_uri, processing_image=aws.processing_image_uri)
    return environment


def gate_policy(jobs: JobRunner, environ: Mapping[str, str] | None = None) -> tuple[bool, str]:
    """(whether the gate is enforced for `jobs`, and why, in words)."""
    value = (zero_env(GATE_VARIABLE, environ) or "auto").lower()
    if value not in GATE_VALUES:
        raise ValueError(f"{GATE_VARIABLE}={value!r} is not one of {GATE_VALUES}")
    if value != "auto":
        return value == "on", f"{GATE_VARIABLE}={value}"
    if sagemaker_settings_of(jobs) is None:
        return False, f"the local backend ({GATE_VARIABLE}=on enforces it here too)"
    profile = profile_from_env(environ)
    if profile != "production":
        return False, f"ZERO_PROFILE={profile}: the whole graph runs as a rehearsal"
    return True, "the SageMaker backend, production profile"


@dataclass(frozen=True)
class GateVerdict:
    """What the gate found for one training: its key, the rehearsal that passed for it (or None) and,
    without one, how the newest rehearsal differs."""

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
        """`rehearsal_passed`: passed; else an ERROR where the gate is enforced (it blocks), a WARN elsewhere."""
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
            f"config set to this run's {asset} config (README, 'A training campaign'); the gate is enforced here "
            f"({self.policy}); {GATE_VARIABLE}=off trains without a rehearsal"
        )


def training_key_inputs(
    jobs: JobRunner, module: str, hyperparameters: dict[str, Any], tracking: dict[str, Any]
) -> dict[str, Any]:
    """The rehearsal key inputs of a training run as `jobs` would launch it."""
    return rehearsal_key_inputs(module, hyperparameters, tracking, runner_environment(jobs))


def training_gate(
    instance: DagsterInstance, jobs: JobRunner, module: str, hyperparameters: dict[str, Any], tracking: dict[str, Any]
) -> GateVerdict:
    """The gate's verdict on training `module` with `hyperparameters` and `tracking` on `jobs`."""
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
