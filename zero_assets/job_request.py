"""What an asset asks a backend to run: one job script, its inputs, outputs and settings.

The same request drives every backend: the local runner lays it out as SageMaker's `/opt/ml`
contract on this machine, a SageMaker runner turns it into a Create*Job call.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

_NAME_UNSAFE = re.compile(r"[^a-zA-Z0-9-]+")


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
    sharded_inputs: tuple[str, ...] = ()
    launcher: Literal["torchrun", "python"] = "torchrun"  # training: torchrun, or one plain process per instance  # processing inputs split across instances by S3 key (multi-instance jobs)

    @property
    def job_name(self) -> str:
        """Deterministic and within SageMaker's rules (alphanumerics and hyphens, at most 63 characters)."""
        stem = _NAME_UNSAFE.sub("-", f"zero-{self.asset}").strip("-")[:46]
        return f"{stem}-{self.fingerprint[:16]}"

    def argument_list(self) -> list[str]:
        return [token for key, value in self.arguments.items() for token in (f"--{key.replace('_', '-')}", str(value))]
