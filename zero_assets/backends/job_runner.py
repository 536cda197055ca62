"""The one interface every backend implements: run a `JobRequest`, warm a shard set; plain results back
(a runner never sees an asset)."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dagster import AssetExecutionContext, ConfigurableResource, PipesClientCompletedInvocation

from zero_assets.backends.preflight import (
    TRAINING_ASSETS,
    Finding,
    local_wandb_login,
    wandb_key_finding,
    writable_prefix,
)
from zero_assets.core.fingerprints import UpstreamOutput
from zero_assets.core.job_request import JobRequest, Work
from zero_assets.core.settings import ZeroSettings
from zero_assets.core.tuning import TuningSpec

GATE_VARIABLE = "ZERO_REHEARSAL_GATE"


@dataclass(frozen=True)
class WarmedShards:
    """What a backend's warm step left where the trainer reads: plain values, no Dagster metadata."""

    location: str  # what training reads: a folder, an s3:// prefix or an fsx:// location (`warm_location`)
    rows: int  # rows of every warm shard
    bytes: int  # what the trainer reads there: every shard, the shard-set manifest and the files beside it
    shards: int
    # None where the backend does not count it; `reused_verdicts`: trusted on an earlier verdict, not read.
    copied: int | None = None
    already_warm: int | None = None  # shards found intact and left alone
    copied_bytes: int | None = None
    verified: int | None = None
    verified_bytes: int | None = None
    reused_verdicts: int | None = None
    paths: Mapping[str, str] = field(default_factory=dict)  # other places worth a link: name -> path or URI
    # Plain values for the record, and the warm job's own Pipes report where one ran.
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TuningRun:
    job: str  # the tuning job (SageMaker) or the local search, by name
    # Each trial: job, hyperparameters (the tuned ones), objective (None: no figure), status, seconds.
    trials: list[dict[str, Any]]
    best: dict[str, Any] | None
    cost: Mapping[str, Any]  # instance-seconds and the estimate (or why none), as every job records


class JobRunner(ConfigurableResource):
    """Base of `LocalJobRunner` and `SageMakerJobRunner`; asset code depends on this alone."""

    @abstractmethod
    def run(
        self, context: AssetExecutionContext, request: JobRequest
    ) -> tuple[PipesClientCompletedInvocation, dict[str, Any]]:
        """Run the request's job to completion: the Pipes invocation and the launcher's facts (job, cost, logs)."""

    @abstractmethod
    def instance_count(self, request: JobRequest, work: Work) -> int:
        """Instances the planned Processing job `request` spreads over for `work`; fails when it cannot fit."""

    @abstractmethod
    def read_list_uri(self, request: JobRequest) -> str:
        """Where the read list of `request` is written before launch, for its job to read."""

    @abstractmethod
    def warm_location(self, shards: UpstreamOutput) -> str:
        """Where `warm_shards` makes `shards` readable; known before warming, so a waiting run finds it."""

    @abstractmethod
    def warm_shards(self, context: AssetExecutionContext, shards: UpstreamOutput, lease: str) -> WarmedShards:
        """Make `shards` readable, verified, at `warm_location(shards)`; `lease`: the warm's output lease."""

    @abstractmethod
    def tune(
        self, context: AssetExecutionContext, request: JobRequest, spec: TuningSpec, earlier: Mapping[str, Any] | None
    ) -> TuningRun:
        """Search `spec` over trials of the training `request`; `earlier`: a prior tuning's record to start from."""

    # What differs between backends beyond running jobs; these are the local backend's answers.

    def environment(self) -> dict[str, str]:
        """Where the scripts run, as the rehearsal key covers it: the runner (SageMaker: and its images)."""
        return {"runner": type(self).__name__}

    def rehearsal_gate_default(self, environ: Mapping[str, str] | None = None) -> tuple[bool, str]:
        """Whether the rehearsal gate is enforced where ZERO_REHEARSAL_GATE is `auto`, and why."""
        return False, f"the local backend ({GATE_VARIABLE}=on enforces it here too)"

    def training_plan(self, asset: str = "trained_checkpoint", clients: Any = None) -> Any:
        """The Training Plan `asset`'s compute names, read now; None where there is none."""
        return None

    def preflight(self, settings: ZeroSettings, tracking: Mapping[str, Any]) -> list[Finding]:
        """Checkpoint folders writable and, tracking online, a valid W&B key."""
        findings = [
            writable_prefix(str(settings.jobs_root() / asset), f"{asset} checkpoints") for asset in TRAINING_ASSETS
        ]
        if tracking.get("wandb_mode") == "online":
            findings.append(wandb_key_finding(local_wandb_login(tracking["wandb_base_url"])))
        return findings

    def stop_orphaned_jobs(
        self, orphaned_since: dict[str, float], holder: Callable[[str], Any], log: Any
    ) -> tuple[dict[str, float] | None, str]:
        """Stop jobs no live run (`holder`) held for the grace period: (new `orphaned_since` or None, summary)."""
        return None, "local backend: a job process dies with the process that started it"
