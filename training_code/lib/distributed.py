"""The one place that reads torchrun's RANK / LOCAL_RANK / WORLD_SIZE: process group, device, rank-0 output.

Run under `torchrun` it joins the process group (gloo on CPU, nccl on CUDA); run as plain `python`
it is a world of one with no process group, and every collective here degrades to a no-op.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistributedContext:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError as error:
        raise ValueError(f"environment variable {name}={value!r} is not an integer (torchrun sets it)") from error


def read_context() -> DistributedContext:
    """Rank layout from torchrun's environment; the device follows the local rank."""
    rank, world_size, local_rank = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1), _env_int("LOCAL_RANK", 0)
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    return DistributedContext(rank, local_rank, world_size, _env_int("LOCAL_WORLD_SIZE", world_size), device)


@contextmanager
def distributed_session(timeout_min: float = 30.0) -> Iterator[DistributedContext]:
    """Join the process group for the block and always leave it. The timeout is generous: rank 0 alone does
    slow side effects (checkpoints, shard hashing) while the other ranks wait in a collective."""
    context = read_context()
    die_with_launcher()
    if context.device.type == "cuda":
        torch.cuda.set_device(context.device)
    if context.is_distributed:
        dist.init_process_group(
            backend="nccl" if context.device.type == "cuda" else "gloo",
            timeout=timedelta(minutes=timeout_min),
            device_id=context.device if context.device.type == "cuda" else None,
        )
    try:
        yield context
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def die_with_launcher() -> None:
    """Under torchrun, let the kernel kill this worker when the launcher dies: workers run in their own sessions,
    so they would train on as orphans, writing checkpoints into the folder a retry resumes from."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or not sys.platform.startswith("linux"):
        return
    launcher = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != launcher:  # it died before the request took effect
        os.kill(os.getpid(), signal.SIGKILL)


_rank0_log = logging.getLogger("zero.rank0")


def log0(message: str, context: DistributedContext | None = None, fields: dict[str, Any] | None = None) -> None:
    """Log on rank 0 only (stderr, and the job log where the runner keeps one): one line per event, not one
    per rank. `fields` join the line's own (job_env.JsonLines), each a key of the JSON object."""
    if (context or read_context()).is_main:
        _rank0_log.info(message, extra={"fields": fields or {}})


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum across ranks in place (identity in a world of one)."""
    if dist.is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def broadcast_from_main(value: Any) -> Any:
    """Rank 0's value of a small picklable object, on every rank."""
    if not dist.is_initialized():
        return value
    holder = [value]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]


def gather_to_all(value: Any) -> list[Any]:
    """Every rank's value of a small picklable object, indexed by rank, on every rank."""
    if not dist.is_initialized():
        return [value]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()
