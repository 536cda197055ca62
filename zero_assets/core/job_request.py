"""What an asset asks a backend to run: one job script, its inputs, outputs and settings.

The same request drives every backend: the local runner lays it out as SageMaker's `/opt/ml`
contract on this machine, a SageMaker runner turns it into a Create*Job call.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from zero_assets.core.fingerprints import FingerprintInputs, UpstreamOutput
from zero_assets.core.settings import ZeroSettings

MAX_JOB_NAME = 63
_NAME_UNSAFE = re.compile(r"[^a-zA-Z0-9]+")
VALID_JOB_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")  # SageMaker's rule for job names
# A job script's module: dotted identifiers, so a config value can name a module and nothing else (no flags, no paths).
MODULE_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"


def job_name(label: str, fingerprint: str, attempt: int) -> str:
    """The name of one attempt of a job, on either backend: `zero-<label>-<fingerprint16>-a<attempt>`,
    the label shortened when the whole would pass SageMaker's 63 characters. Deterministic, so a
    restarted run finds the attempt its predecessor launched instead of launching a second one."""
    if attempt < 1:
        raise ValueError(f"attempt numbers start at 1, got {attempt}")
    if not re.fullmatch(r"[0-9a-f]{16,}", fingerprint):
        raise ValueError(f"fingerprint must be at least 16 hex digits, got {fingerprint!r}")
    tail = f"-{fingerprint[:16]}-a{attempt}"
    stem = _NAME_UNSAFE.sub("-", f"zero-{label}").strip("-")[: MAX_JOB_NAME - len(tail)].rstrip("-")
    name = stem + tail
    if not VALID_JOB_NAME.match(name):
        raise ValueError(f"job name {name!r} built from label {label!r} breaks SageMaker's naming rule")
    return name


@dataclass(frozen=True)
class JobRequest:
    asset: str
    kind: Literal["processing", "training"]
    module: str  # the job script, run as `python -m <module>` (training: under torchrun)
    fingerprint: str  # input fingerprint of the materialization: code, config and upstream versions
    inputs: dict[str, str] = field(default_factory=dict)  # name -> local path or s3:// URI
    # name -> the folder under the input's local path its objects land in: one source's raw folder
    # (`<raw>/<source>`) arrives as `<input>/<source>/...`, so the script reads the raw layout while only
    # that source is listed and transferred.
    input_folders: dict[str, str] = field(default_factory=dict)
    outputs: dict[str, str] = field(default_factory=dict)  # name -> destination local path or s3:// URI
    arguments: dict[str, str] = field(default_factory=dict)  # config: `--key value` for the script
    instance_type: str = "local"
    instance_count: int = 1
    processes_per_host: int = 1  # training: torchrun's --nproc_per_node (SageMaker: one per GPU of the instance)
    sharded_inputs: tuple[str, ...] = ()  # processing inputs split across the instances by S3 key (`map` stage)
    launcher: Literal["torchrun", "python"] = "torchrun"  # training: torchrun, or one plain process per instance
    fsx_access: Literal["ro", "rw"] = "ro"  # training: how an FSx input is mounted
    stage: Literal["", "map", "reduce"] = ""  # one of the two jobs of a fanned-out materialization (see `fan_out`)

    @property
    def label(self) -> str:
        """What job names start with: the asset, and the stage when the materialization has two jobs."""
        return f"{self.asset}-{self.stage}" if self.stage else self.asset

    @property
    def job_name(self) -> str:
        """The name of the first attempt (`job_name(label, fingerprint, 1)`): what the local backend,
        which runs a request once per Dagster run, calls its job, and SageMaker's first attempt."""
        return job_name(self.label, self.fingerprint, 1)

    def argument_list(self) -> list[str]:
        return [token for key, value in self.arguments.items() for token in (f"--{key.replace('_', '-')}", str(value))]

    def reads_s3(self) -> bool:
        """Whether the script itself is handed an s3:// location (an input or an argument)."""
        return any(str(value).startswith("s3://") for value in [*self.inputs.values(), *self.arguments.values()])


RUNS_FOLDER = "runs"  # under a materialization folder: one folder per Dagster run


def materialization_folder(jobs_root: Path, request: JobRequest) -> Path:
    """`<jobs root>/<asset>/<fingerprint[:16]>`: everything the jobs of one output keep on this machine,
    beside the output's own `<lake>/<asset>/<fingerprint[:16]>`: its lease (`lease.json`), training
    checkpoints (`checkpoints/`) and each run's job folders (`runs/<run id>/<job name>/`)."""
    return Path(jobs_root) / request.asset / request.fingerprint[:16]


@dataclass(frozen=True)
class FanOut:
    """How a Processing job spreads over several instances: a `map` stage runs on every instance with
    `split_input` divided among them by S3 key (SageMaker's ShardedByS3Key), each writing its own
    files; a `reduce` stage on one instance reads all of them as `collected_input` and writes the
    asset's output. The job script takes `--phase map|reduce` and `--<collected_input> DIR`."""

    split_input: str
    collected_input: str


def fan_out(request: JobRequest, plan: FanOut, instances: int) -> tuple[JobRequest, JobRequest]:
    """The (map, reduce) requests that replace `request` on `instances` instances.

    Both keep the request's fingerprint, so the result is cached and named as one materialization
    whatever the instance count; the map output sits in a `_map` folder beside the asset's output.
    """
    if plan.split_input not in request.inputs:
        raise ValueError(
            f"{request.asset}: cannot split input {plan.split_input!r}; its inputs are {sorted(request.inputs)}"
        )
    if instances < 2:
        raise ValueError(f"{request.asset}: a fan-out needs at least 2 instances, got {instances}")
    collected = request.outputs["out"].rstrip("/") + "-map"
    mapped = replace(
        request,
        stage="map",
        instance_count=instances,
        sharded_inputs=(plan.split_input,),
        arguments={**request.arguments, "phase": "map"},
        outputs={"out": collected},
    )
    reduce_inputs = {name: uri for name, uri in request.inputs.items() if name != plan.split_input}
    reduced = replace(
        request,
        stage="reduce",
        instance_count=1,
        inputs={**reduce_inputs, plan.collected_input: collected},
        arguments={**request.arguments, "phase": "reduce"},
    )
    return mapped, reduced


def build_job_request(
    asset: str,
    *,
    settings: ZeroSettings,
    kind: Literal["processing", "training"],
    module: str,
    config: dict[str, Any],
    upstream: list[UpstreamOutput],
    inputs: dict[str, str],
    processes_per_host: int = 1,
    partition: str | None = None,
    tracking: dict[str, Any] | None = None,
    fingerprint_inputs: FingerprintInputs | None = None,
    **options: Any,
) -> JobRequest:
    """The request for one materialization; its output goes under the input fingerprint (and, for a
    per-source asset, under its source: `<lake>/<asset>/<source>/<fingerprint16>`). `tracking` are
    arguments the script also gets but the fingerprint leaves out: where a run is logged (W&B), never
    what it computes. `fingerprint_inputs`: those a caller already derived from the same module, config and
    upstream (the code version is read from the files each time, so it is derived once per launch)."""
    fingerprint = (fingerprint_inputs or FingerprintInputs.of(module, config, upstream)).fingerprint
    return JobRequest(
        asset=asset,
        kind=kind,
        module=module,
        fingerprint=fingerprint,
        inputs=inputs,
        outputs={"out": settings.asset_uri(asset, fingerprint[:16], partition)},
        arguments={**config, **(tracking or {})},
        processes_per_host=processes_per_host,
        **options,
    )
