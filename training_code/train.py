"""torchrun --standalone --nproc_per_node 2 -m training_code.train --max-steps 200 --batch-size 8

SageMaker Training job script: train a detector on the shards in the `train` channel
(`SM_CHANNEL_TRAIN`, split `train`), checkpoint to `ZERO_CHECKPOINT_DIR` and resume from there,
write `SM_MODEL_DIR/model.pt` and `training_summary.json`, and report through Dagster Pipes.
One process per device; every side effect happens on rank 0.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from training_code.lib import job_env
from training_code.lib.detection_data import Augmentation, ShardDetectionStream, build_train_loader, verified_split
from training_code.lib.distributed import (
    DistributedContext, all_reduce_sum, broadcast_from_main, distributed_session, gather_to_all, log0,
)
from training_code.lib.model import ARCHITECTURES, DEFAULT_ARCH, atomic_torch_save, build_model, model_config, save_model_file
from training_code.lib.shard_format import sha256_file

log = logging.getLogger("zero.train")
CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)\.pt$")


class NonFiniteLossError(RuntimeError):
    pass


class TrainingInterrupted(RuntimeError):
    pass


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def get_args_parser() -> argparse.ArgumentParser:
    # Hyperparameters arrive as `--kebab-case value` pairs, as SageMaker script mode passes them.
    parser = argparse.ArgumentParser(description="Train the ZERO detector on Arrow shards")
    parser.add_argument("--arch", default=DEFAULT_ARCH, choices=ARCHITECTURES)
    parser.add_argument("--width", type=int, default=32, help="fcos_tiny backbone width")
    parser.add_argument("--fpn-channels", type=int, default=64, help="fcos_tiny FPN channels (multiple of 32)")
    parser.add_argument("--min-size", type=int, default=160, help="shorter image side fed to the model")
    parser.add_argument("--max-size", type=int, default=320, help="longer image side cap")
    parser.add_argument("--max-steps", type=positive_int, default=200, help="optimizer steps in total, including resumed ones")
    parser.add_argument("--batch-size", type=positive_int, default=8, help="images per rank per step")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--warmup-steps", type=int, default=50)
    parser.add_argument("--final-lr-fraction", type=float, default=0.05, help="cosine decays the lr to lr * this")
    parser.add_argument("--clip-grad", type=float, default=10.0, help="max gradient norm; 0 disables clipping")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hflip-prob", type=float, default=0.5)
    parser.add_argument("--color-jitter", type=float, default=0.2, help="brightness/contrast factor spread; 0 disables")
    parser.add_argument("--shuffle-buffer", type=int, default=256)
    parser.add_argument("--max-bad-samples", type=int, default=10, help="undecodable samples tolerated per reader")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader workers per rank")
    parser.add_argument("--threads", type=int, default=None, help="torch threads per rank (default: CPUs / local ranks)")
    parser.add_argument("--checkpoint-every", type=positive_int, default=50)
    parser.add_argument("--keep-checkpoints", type=positive_int, default=3)
    parser.add_argument("--log-every", type=positive_int, default=10)
    parser.add_argument("--pg-timeout-min", type=float, default=30.0)
    parser.add_argument("--wandb-mode", default="disabled", choices=("disabled", "offline", "online"))
    parser.add_argument("--wandb-project", default="zero")
    return parser


def log_event(ctx: DistributedContext, event: str, **fields: Any) -> None:
    """One structured JSON line per event, tagged with the job name, from rank 0."""
    log0(json.dumps({"job": job_env.job_name(), "event": event, **fields}), context=ctx)


def warmup_cosine(warmup_steps: int, max_steps: int, final_fraction: float):
    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, max_steps - warmup_steps))
        return final_fraction + (1 - final_fraction) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def list_checkpoints(folder: Path) -> list[tuple[int, Path]]:
    found = [(int(m.group(1)), p) for p in folder.glob("checkpoint-*.pt") if (m := CHECKPOINT_NAME.match(p.name))]
    return sorted(found)


def save_checkpoint(folder: Path, keep: int, state: dict[str, Any], ctx: DistributedContext) -> None:
    """Collective (every rank sends its RNG state); only rank 0 writes, then prunes to the newest `keep`."""
    rng_by_rank = gather_to_all(rng_state())
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


def resume_if_possible(folder: Path, model, optimizer, scheduler, config: dict[str, Any], batch_size: int,
                       ctx: DistributedContext) -> ResumePoint:
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
        restore_rng(state["rng"][ctx.rank])
    elif ctx.is_main:
        log.warning("%s was written by %d processes with batch %d, this job has %d with batch %d: weights and optimizer "
                    "resume exactly, the sample order starts afresh", path, written_by, state["args"]["batch_size"],
                    ctx.world_size, batch_size)
    log_event(ctx, "resumed", step=state["step"], path=path)
    return ResumePoint(int(state["step"]), int(state["images_seen"]), same_layout)


class StopRequest:
    """SIGTERM (SageMaker stop, spot reclaim, torchrun teardown) becomes a flag the loop checks each step."""

    def __init__(self) -> None:
        self.requested = False
        self._previous = signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame) -> None:
        self.requested = True

    def restore(self) -> None:
        signal.signal(signal.SIGTERM, self._previous)


def start_wandb(args: argparse.Namespace, ctx: DistributedContext, config: dict[str, Any]):
    if args.wandb_mode == "disabled" or not ctx.is_main:
        return None
    import wandb  # optional: imported only when tracking is asked for

    # SageMaker uploads SM_OUTPUT_DATA_DIR with the job's output, so offline runs can be synced later.
    run_dir = Path(os.environ.get("SM_OUTPUT_DATA_DIR", job_env.opt_ml() / "output" / "data"))
    run_dir.mkdir(parents=True, exist_ok=True)
    return wandb.init(mode=args.wandb_mode, project=args.wandb_project, name=job_env.job_name(), dir=str(run_dir),
                      config={**vars(args), "model_config": config})


def train_step(model, model_without_ddp, optimizer, images, targets, step: int, args, ctx: DistributedContext,
               stop: StopRequest) -> tuple[float, bool]:
    """Forward, agree across ranks, backward, clip, update. Returns the sample-weighted mean loss over
    all ranks and whether any rank was asked to stop."""
    images = [image.to(ctx.device, non_blocking=True).float().div_(255) for image in images]
    targets = [{k: v.to(ctx.device, non_blocking=True) for k, v in t.items()} for t in targets]
    with torch.autocast(ctx.device.type, dtype=torch.bfloat16, enabled=ctx.device.type == "cuda"):
        losses = model(images, targets)
    loss = sum(losses.values())
    # One collective per step: the loss weighted by sample count, and whether any rank got SIGTERM, so
    # every rank stops (or fails) at the same step instead of hanging in the next all-reduce.
    shared = all_reduce_sum(torch.tensor([loss.item() * len(images), len(images), float(stop.requested)], dtype=torch.float64))
    mean_loss = shared[0].item() / shared[1].item()
    if not math.isfinite(mean_loss):
        parts = {k: round(v.item(), 4) for k, v in losses.items()}
        raise NonFiniteLossError(f"step {step + 1}: loss is {mean_loss} (this rank's parts: {parts}); "
                                 f"lower --lr (now {args.lr}) or check the training shards")
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if args.clip_grad > 0:
        torch.nn.utils.clip_grad_norm_(model_without_ddp.parameters(), args.clip_grad)
    optimizer.step()
    return mean_loss, shared[2].item() > 0


def train(args: argparse.Namespace, ctx: DistributedContext) -> tuple[dict[str, Any], torch.nn.Module, dict[str, Any]]:
    """Run (or finish) training; return the summary, the unwrapped model and its config."""
    started = time.perf_counter()
    torch.set_num_threads(args.threads or max(1, len(os.sched_getaffinity(0)) // ctx.local_world_size))
    manifest, shards = verified_split(job_env.channel_dir("train"), "train", ctx.rank, ctx.world_size)
    config = model_config(args.arch, manifest["categories"], args.width, args.fpn_channels, args.min_size, args.max_size)
    torch.manual_seed(args.seed)  # identical initial weights on every rank
    # channels_last: oneDNN convolutions run ~25% faster on CPU (measured here), and GPUs prefer it too.
    model_without_ddp = build_model(config).to(ctx.device, memory_format=torch.channels_last)
    optimizer = torch.optim.AdamW(model_without_ddp.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(args.warmup_steps, args.max_steps, args.final_lr_fraction))
    checkpoints = job_env.checkpoint_dir()
    if ctx.is_main:
        checkpoints.mkdir(parents=True, exist_ok=True)
    random.seed(args.seed + ctx.rank)
    torch.manual_seed(args.seed + ctx.rank)
    resumed = resume_if_possible(checkpoints, model_without_ddp, optimizer, scheduler, config, args.batch_size, ctx)
    start_step = resumed.step
    model = model_without_ddp
    if ctx.is_distributed:
        model = DistributedDataParallel(model_without_ddp, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)
    dataset = ShardDetectionStream(
        shards, rank=ctx.rank, world_size=ctx.world_size, seed=args.seed, batch_size=args.batch_size,
        augmentation=Augmentation(args.hflip_prob, args.color_jitter), shuffle_buffer=args.shuffle_buffer,
        max_bad_samples=args.max_bad_samples, resume_batches=start_step if resumed.data_continues else 0,
    )
    batches = iter(build_train_loader(dataset, args.batch_size, args.workers, ctx.device))
    tracker = start_wandb(args, ctx, config)
    stop = StopRequest()

    def checkpoint_state(at_step: int) -> dict[str, Any]:
        return {"model": model_without_ddp.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "step": at_step, "images_seen": images_seen(at_step), "args": vars(args), "model_config": config,
                "categories": config["categories"]}

    def images_seen(at_step: int) -> int:  # batches are always full: the stream never runs dry
        return resumed.images_seen + (at_step - start_step) * args.batch_size * ctx.world_size

    step, data_wait, recent_losses, window_first_step = start_step, 0.0, [], start_step
    loop_started = window_started = time.perf_counter()
    try:
        while step < args.max_steps:
            waited = time.perf_counter()
            images, targets = next(batches)
            data_wait += time.perf_counter() - waited
            mean_loss, stop_agreed = train_step(model, model_without_ddp, optimizer, images, targets, step, args, ctx, stop)
            scheduler.step()
            step += 1
            recent_losses = (recent_losses + [mean_loss])[-args.log_every:]
            if step % args.log_every == 0 or step == args.max_steps:
                now = time.perf_counter()
                line = {"step": step, "loss": round(mean_loss, 5),
                        "lr": scheduler.get_last_lr()[0], "data_wait": round(data_wait / (now - loop_started), 4),
                        "images_per_s": round((step - window_first_step) * args.batch_size * ctx.world_size / (now - window_started), 2)}
                window_started, window_first_step = now, step
                log_event(ctx, "train", **line)
                if tracker is not None:
                    tracker.log({k: v for k, v in line.items() if k != "step"}, step=step)
            if stop_agreed:
                save_checkpoint(checkpoints, args.keep_checkpoints, checkpoint_state(step), ctx)
                raise TrainingInterrupted(f"SIGTERM received: saved a checkpoint at step {step} of {args.max_steps}; "
                                          "the next run with the same ZERO_CHECKPOINT_DIR resumes from it")
            if step % args.checkpoint_every == 0 or step == args.max_steps:
                save_checkpoint(checkpoints, args.keep_checkpoints, checkpoint_state(step), ctx)
    finally:
        stop.restore()
        if tracker is not None:
            tracker.finish()
    loop_seconds = time.perf_counter() - loop_started
    steps_run = step - start_step
    # Per-rank throughput figures, averaged over ranks.
    totals = all_reduce_sum(torch.tensor([data_wait / max(loop_seconds, 1e-9)], dtype=torch.float64))
    return {
        "steps": step,
        "resumed_from_step": start_step,
        "images_seen": images_seen(step),
        "images_per_s": round(steps_run * args.batch_size * ctx.world_size / loop_seconds, 2) if steps_run else 0.0,
        "final_loss": round(sum(recent_losses) / len(recent_losses), 5) if recent_losses else None,
        "wall_s": round(time.perf_counter() - started, 2),
        "data_wait_fraction": round(totals[0].item() / ctx.world_size, 4),
        "world_size": ctx.world_size,
        "arch": args.arch,
        "train_images": sum(s.rows for s in shards),
        "job_name": job_env.job_name(),
        "device": str(ctx.device),
    }, model_without_ddp, config


def main(args: argparse.Namespace) -> None:
    with job_env.pipes_session() as pipes, distributed_session(args.pg_timeout_min) as ctx:
        summary, model, config = train(args, ctx)
        if not ctx.is_main:
            return
        model_path = save_model_file(job_env.model_dir(), model, config, summary["steps"], vars(args))
        digest = sha256_file(model_path)
        summary.update({"model_path": str(model_path), "model_sha256": digest, "checkpoint_dir": str(job_env.checkpoint_dir())})
        summary_path = model_path.with_name("training_summary.json")
        temporary = summary_path.with_name(f".tmp-{summary_path.name}")
        temporary.write_text(json.dumps(summary, indent=2))
        os.replace(temporary, summary_path)
        log_event(ctx, "done", **summary)
        pipes.report_asset_materialization(metadata={k: v for k, v in summary.items() if v is not None}, data_version=digest)


if __name__ == "__main__":
    main(get_args_parser().parse_args())
