"""Training checkpoints: atomic writes every N steps, the newest K kept, and resuming from the latest.

A checkpoint holds model, optimizer, scheduler, step, images seen, every rank's RNG state, arguments and
model config. Rank 0 holds a POSIX record lock on the folder for the whole job, so a second writer fails
at once; not flock, which forked DataLoader workers would inherit and keep after rank 0 is killed.
"""

from __future__ import annotations

import fcntl
import logging
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .distributed import DistributedContext, broadcast_from_main, gather_to_all, log0
from .job_env import job_name
from .model import atomic_torch_save

log = logging.getLogger("zero.checkpoints")
CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)\.pt$")
WRITER_LOCK = ".writer.lock"
_held_locks: dict[Path, Any] = {}  # folder -> open lock file, kept open (locked) until the process exits


class CheckpointFolderBusy(RuntimeError):
    """Another live job is writing the same checkpoint folder."""


def log_event(ctx: DistributedContext, event: str, **fields: Any) -> None:
    """One log line per event from rank 0, its fields (and `event`) keys of the line's JSON object."""
    log0(event, context=ctx, fields={"event": event, **fields})


def list_checkpoints(folder: Path) -> list[tuple[int, Path]]:
    found = [(int(m.group(1)), p) for p in Path(folder).glob("checkpoint-*.pt") if (m := CHECKPOINT_NAME.match(p.name))]
    return sorted(found)


def lock_for_writing(folder: Path) -> None:
    """Hold the folder's writer lock for the rest of this process; `CheckpointFolderBusy` when another holds it."""
    folder = Path(folder).resolve()
    if folder in _held_locks:
        return
    handle = open(folder / WRITER_LOCK, "a+")
    try:  # the handle stays open: closing any descriptor of this file in this process would drop the lock
        fcntl.lockf(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except (BlockingIOError, PermissionError):
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        raise CheckpointFolderBusy(
            f"{folder} is being written by another training job ({holder}); two writers would "
            "interleave checkpoints. Wait for it to end, or point ZERO_CHECKPOINT_DIR elsewhere"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()} job {job_name()}\n")
    handle.flush()
    _held_locks[folder] = handle


def prepare_folder(folder: Path, ctx: DistributedContext) -> None:
    """On rank 0: create the folder, take its writer lock, and drop temporary files a killed writer left."""
    if not ctx.is_main:
        return
    folder.mkdir(parents=True, exist_ok=True)
    lock_for_writing(folder)
    for leftover in folder.glob(".tmp-*"):
        log.warning("removing %s: a partial checkpoint from a job that was killed while writing it", leftover)
        leftover.unlink()


def save_checkpoint(folder: Path, keep: int, state: dict[str, Any], ctx: DistributedContext) -> None:
    """Collective (every rank sends its RNG state); only rank 0 writes, then prunes to the newest `keep`."""
    rng = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state()
    rng_by_rank = gather_to_all(rng)
    if not ctx.is_main:
        return
    path = folder / f"checkpoint-{state['step']:08d}.pt"
    atomic_torch_save({**state, "rng": rng_by_rank}, path)
    for _, old in list_checkpoints(folder)[:-keep]:
        old.unlink()
    log_event(ctx, "checkpoint", step=state["step"], path=str(path))


@dataclass(frozen=True)
class ResumePoint:
    step: int = 0
    images_seen: int = 0
    data_continues: bool = True  # the stream can pick up exactly where it stopped (same ranks and batch size)


def resume_if_possible(
    folder: Path, model, optimizer, scheduler, config: dict[str, Any], batch_size: int, ctx: DistributedContext
) -> ResumePoint:
    """Load the newest checkpoint rank 0 sees (every rank loads the same file) and say where training resumes."""
    found = list_checkpoints(folder) if ctx.is_main else []
    path = broadcast_from_main(str(found[-1][1]) if found else None)
    if path is None:
        return ResumePoint()
    state = torch.load(path, map_location="cpu", weights_only=True)
    if state["model_config"] != config:
        raise ValueError(
            f"{path} was trained with model config {state['model_config']}, this run builds {config}; "
            "point ZERO_CHECKPOINT_DIR at an empty folder to start a new model"
        )
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    written_by = len(state["rng"])  # one RNG state per rank that wrote it
    same_layout = written_by == ctx.world_size and state["args"]["batch_size"] == batch_size
    if same_layout:  # every rank continues its own random stream
        rng = state["rng"][ctx.rank]
        random.setstate(rng["python"])
        torch.set_rng_state(rng["torch"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state(rng["cuda"])
    elif ctx.is_main:
        log.warning(
            "%s was written by %d processes with batch %d, this job has %d with batch %d: weights and optimizer "
            "resume exactly, the sample order starts afresh",
            path,
            written_by,
            state["args"]["batch_size"],
            ctx.world_size,
            batch_size,
        )
    log_event(ctx, "resumed", step=state["step"], path=path)
    return ResumePoint(int(state["step"]), int(state["images_seen"]), same_layout)
