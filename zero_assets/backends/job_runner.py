"""The one interface every backend implements: run a `JobRequest`, warm a shard set; plain results back.

A runner knows `JobRequest` and `UpstreamOutput`, never an asset: the assets turn what it returns into
their materializations.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dagster import AssetExecutionContext, ConfigurableResource, PipesClientCompletedInvocation

from zero_assets.core.fingerprints import UpstreamOutput
from zero_assets.core.job_request import JobRequest, Work


@dataclass(frozen=True)
class WarmedShards:
    """What a backend's warm step left where the trainer reads: plain values, no Dagster metadata."""

    location: str  # what training reads: a folder, an s3:// prefix or an fsx:// location (`warm_location`)
    rows: int  # rows of every warm shard
    bytes: int  # what the trainer reads there: every shard, the shard-set manifest and the files beside it
    shards: int
    copied: int | None = None  # shards copied this time; None where the backend copies nothing itself
    already_warm: int | None = None  # shards found intact and left alone; None where it copies nothing
    # What this warm read: shards (and their bytes) copied, and verified (every copy, and each shard
    # checked in place); shards trusted on a verdict recorded while their file was unchanged, not read.
    # None where the backend does not count it.
    copied_bytes: int | None = None
    verified: int | None = None
    verified_bytes: int | None = None
    reused_verdicts: int | None = None
    paths: Mapping[str, str] = field(default_factory=dict)  # other places worth a link: name -> path or URI
    # What else the backend knows, for the record: plain values (ids, folders, what was verified), and the
    # warm job's own report (its metadata as Dagster Pipes delivered it) where one ran.
    details: Mapping[str, Any] = field(default_factory=dict)


class JobRunner(ConfigurableResource):
    """Base of `LocalJobRunner` and `SageMakerJobRunner`; asset code depends on this alone."""

    @abstractmethod
    def run(
        self, context: AssetExecutionContext, request: JobRequest
    ) -> tuple[PipesClientCompletedInvocation, dict[str, Any]]:
        """Run the request's job to completion: the Pipes invocation (the script's report) and what the
        launcher knows of the run (job name, backend, instances, time, cost, logs)."""

    @abstractmethod
    def instance_count(self, request: JobRequest, work: Work) -> int:
        """Instances the planned Processing job `request` spreads over, for what it reads (`work`; see
        `job_request.spread_over`); fails, naming the setting, when the job cannot fit."""

    @abstractmethod
    def read_list_uri(self, request: JobRequest) -> str:
        """Where the read list of `request` is written before launch, for its job to read."""

    @abstractmethod
    def warm_location(self, shards: UpstreamOutput) -> str:
        """Where `warm_shards` makes the shard set `shards` (an arrow_shards output) readable; known before
        warming, so a run that waited for another one warming it finds that work there."""

    @abstractmethod
    def warm_shards(self, context: AssetExecutionContext, shards: UpstreamOutput, lease: str) -> WarmedShards:
        """Make the shard set `shards` readable by the trainer at `warm_location(shards)`, verified. `lease`:
        the warm's output lease, which the step holds meanwhile; a job the warm launches names it."""
