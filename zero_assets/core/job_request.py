"""What an asset asks a backend to run: one job script, its inputs, outputs and settings, backend-neutral
(the local runner lays it out as SageMaker's `/opt/ml` contract, SageMaker makes a Create*Job call).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from training_code.lib.read_list import ReadList, write_read_list
from training_code.lib.storage import is_s3
from zero_assets.core.fingerprints import FingerprintInputs, UpstreamOutput
from zero_assets.core.settings import ZeroSettings

MAX_JOB_NAME = 63
_NAME_UNSAFE = re.compile(r"[^a-zA-Z0-9]+")
VALID_JOB_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")  # SageMaker's rule for job names
# A job script's module: dotted identifiers, so a config value can name a module and nothing else (no flags, no paths).
MODULE_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"


def job_name(label: str, fingerprint: str, attempt: int) -> str:
    """`zero-<label>-<fingerprint16>-a<attempt>`, shortened to SageMaker's 63 characters; deterministic."""
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
class Reads:
    """The raw objects a job fetches by key from `raw_uri`, listed in its read list at `uri` (an input)."""

    uri: str
    raw_uri: str
    objects: int
    bytes: int  # of the objects the job reads
    host_bytes: int  # what the busiest host of the job reads: its volume is sized for these
    disk_factor: float = 1.0  # its disk needs per byte read (a pack also writes shards of about those bytes)

    def on(self, host_bytes: int) -> Reads:
        return replace(self, host_bytes=host_bytes)

    @property
    def disk_bytes(self) -> int:
        """What the busiest host holds on its volume for these reads."""
        return int(self.host_bytes * self.disk_factor)


@dataclass(frozen=True)
class TableScan:
    """Tables a job reads whole, by key; its memory and volume are sized from them."""

    rows: int
    bytes: int
    uris: tuple[str, ...] = ()  # where they are: the job is handed these through a file, not as inputs


@dataclass(frozen=True)
class JobRequest:
    asset: str
    kind: Literal["processing", "training"]
    module: str  # the job script, run as `python -m <module>` (training: under torchrun)
    fingerprint: str  # input fingerprint of the materialization: code, config and upstream versions
    inputs: dict[str, str] = field(default_factory=dict)  # name -> local path or s3:// URI
    outputs: dict[str, str] = field(default_factory=dict)  # name -> destination local path or s3:// URI
    arguments: dict[str, str] = field(default_factory=dict)  # config: `--key value` for the script
    instance_type: str = "local"
    instance_count: int = 1
    processes_per_host: int = 1  # training: torchrun's --nproc_per_node (SageMaker: one per GPU of the instance)
    reads: Reads | None = None  # what the job fetches by key (see `spread_over`), never an input prefix
    scan: TableScan | None = None  # the tables it reads whole
    # Outputs an earlier stage already wrote into (a map stage's shards): the job adds to them, never replaces.
    merged_outputs: tuple[str, ...] = ()
    launcher: Literal["torchrun", "python"] = "torchrun"  # training: torchrun, or one plain process per instance
    fsx_access: Literal["ro", "rw"] = "ro"  # training: how an FSx input is mounted
    stage: Literal["", "map", "reduce"] = ""  # one of the two jobs of a fanned-out materialization (`spread_over`)
    # The output's lease (`output_lease_location`), held while the job runs; see `defs/orphaned_jobs`.
    lease: str = ""

    @property
    def label(self) -> str:
        """What job names start with: the asset, and the stage when the materialization has two jobs."""
        return f"{self.asset}-{self.stage}" if self.stage else self.asset

    @property
    def job_name(self) -> str:
        """The name of the first attempt."""
        return job_name(self.label, self.fingerprint, 1)

    def argument_list(self) -> list[str]:
        return [token for key, value in self.arguments.items() for token in (f"--{key.replace('_', '-')}", str(value))]

    def reads_s3(self) -> bool:
        """Whether the script is handed any s3:// location (input, argument or raw root)."""
        fetched = ([self.reads.raw_uri] if self.reads else []) + list(self.scan.uris if self.scan else ())
        return any(
            str(value).startswith("s3://") for value in [*self.inputs.values(), *self.arguments.values(), *fetched]
        )


RUNS_FOLDER = "runs"  # under a materialization folder: one folder per Dagster run


LEASE_SUFFIX = ".lease.json"


def materialization_folder(jobs_root: Path, request: JobRequest) -> Path:
    """`<jobs root>/<asset>/<fingerprint[:16]>`: the output's lease, checkpoints and run folders."""
    return Path(jobs_root) / request.asset / request.fingerprint[:16]


def output_lease_location(jobs_root: Path, asset: str, fingerprint: str, output: str) -> str:
    """`<output>.lease.json` beside an s3:// output, else `lease.json` in its job folder."""
    if is_s3(output):
        return output.rstrip("/") + LEASE_SUFFIX
    return str(Path(jobs_root) / asset / fingerprint[:16] / "lease.json")


# (inputs, arguments) of a request -> the read list of its job
Planner = Callable[[Mapping[str, str], Mapping[str, Any]], ReadList]


@dataclass(frozen=True)
class FanOut:
    """A Processing job that reads raw objects by key, planned before launch and spread over instances.

    `plan` derives the read list (handed to the job as `reads_input`) from inputs and arguments. On several
    instances a `map` stage reads each host's part and a one-instance `reduce` stage reads their files as
    `collected_input`; the script takes `--phase map|reduce` and `--<collected_input> DIR`."""

    plan: Planner
    collected_input: str
    reads_input: str = "reads"
    map_inputs: tuple[str, ...] = ("reads",)  # those of them the request has
    # True: the map stage writes into the asset's output itself and hands on only its listing.
    map_keeps_output: bool = False
    disk_factor: float = 1.0  # volume bytes per byte read (see Reads)


@dataclass(frozen=True)
class Work:
    """What a planned job reads, for sizing: `host_bytes(n)` is what the busiest of n hosts reads."""

    objects: int
    bytes: int
    host_bytes: Callable[[int], int]
    disk_factor: float = 1.0

    def disk_bytes(self, hosts: int) -> int:
        """What the busiest of `hosts` hosts holds on its volume."""
        return int(self.host_bytes(hosts) * self.disk_factor)


def spread_over(
    request: JobRequest,
    spread: FanOut,
    instance_count: Callable[[JobRequest, Work], int],
    read_list_uri: str,
    write: bool = True,
) -> tuple[JobRequest | None, JobRequest]:
    """(map stage or None, the job writing the output), planned and sized; `write`: write the read list."""
    planned = spread.plan(request.inputs, request.arguments)
    if write:
        write_read_list(read_list_uri, planned)
    work = Work(planned.objects, planned.read_bytes, planned.largest_part_bytes, spread.disk_factor)
    reads = Reads(
        read_list_uri, planned.raw_uri, planned.objects, planned.read_bytes, planned.read_bytes, spread.disk_factor
    )
    request = replace(request, inputs={**request.inputs, spread.reads_input: read_list_uri}, reads=reads)
    instances = instance_count(request, work)
    if instances < 2:
        return None, request
    # Fanned out: both stages keep the fingerprint (caching ignores the instance count); the map output
    # sits in a `-map` folder beside the asset's output.
    collected = request.outputs["out"].rstrip("/") + "-map"
    outputs = {**request.outputs, spread.collected_input: collected} if spread.map_keeps_output else {"out": collected}
    mapped = replace(
        request,
        stage="map",
        instance_count=instances,
        inputs={name: request.inputs[name] for name in spread.map_inputs if name in request.inputs},
        arguments={**request.arguments, "phase": "map"},
        outputs=outputs,
        reads=reads.on(work.host_bytes(instances)),
    )
    reduced = replace(
        request,
        stage="reduce",
        instance_count=1,
        inputs={**request.inputs, spread.collected_input: collected},
        arguments={**request.arguments, "phase": "reduce"},
        reads=reads.on(0),
        merged_outputs=tuple(request.outputs) if spread.map_keeps_output else (),
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
    lease: str | None = None,
    arguments: dict[str, Any] | None = None,
    **options: Any,
) -> JobRequest:
    """The request for one materialization, its output under the input fingerprint (and source).

    `tracking`: script arguments the fingerprint leaves out (W&B). `fingerprint_inputs`: already derived
    by the caller. `lease`: when not its own output's. `arguments`: when they are not its config."""
    fingerprint = (fingerprint_inputs or FingerprintInputs.of(module, config, upstream)).fingerprint
    output = settings.asset_uri(asset, fingerprint[:16], partition)
    return JobRequest(
        asset=asset,
        kind=kind,
        module=module,
        fingerprint=fingerprint,
        inputs=inputs,
        outputs={"out": output},
        lease=lease or output_lease_location(settings.jobs_root(), asset, fingerprint, output),
        arguments={**(config if arguments is None else arguments), **(tracking or {})},
        processes_per_host=processes_per_host,
        **options,
    )
