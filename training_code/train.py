"""SageMaker Training job script: train the detector on the Arrow shards in the `train` channel.

Checkpoints to and resumes from `ZERO_CHECKPOINT_DIR`, writes `SM_MODEL_DIR/model.pt` and
`training_summary.json`, reports through Dagster Pipes. One process per device; side effects on rank 0.
Locally: `torchrun --standalone --nproc_per_node 2 -m training_code.train --max-steps 200 --batch-size 8`.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from training_code.lib import job_env, wandb_artifacts, wandb_run
from training_code.lib.checkpoints import log_event, prepare_folder, resume_if_possible, save_checkpoint
from training_code.lib.detection_data import Augmentation, ShardDetectionStream, build_train_loader
from training_code.lib.detection_samples import verified_split
from training_code.lib.distributed import DistributedContext, all_reduce_sum, distributed_session
from training_code.lib.gpu_usage import GpuSampler, gpu_report
from training_code.lib.model import ARCHITECTURES, DEFAULT_ARCH, build_model, model_config
from training_code.lib.model_output import publish_model
from training_code.lib.train_step import StopRequest, train_step

log = logging.getLogger("zero.train")


class TrainingInterrupted(RuntimeError):
    pass


FORCED_STOP = "forced stop"  # how a `--stop-after-steps` failure reason begins: the rehearsal looks for it


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def get_args_parser() -> argparse.ArgumentParser:
    # Hyperparameters arrive as `--kebab-case value` pairs, as SageMaker script mode passes them.
    parser = argparse.ArgumentParser(description="Train the ZERO detector on Arrow shards")
    add = parser.add_argument
    add("--arch", default=DEFAULT_ARCH, choices=ARCHITECTURES)
    add(
        "--training-set",
        help="the shard set's folder (its manifest.json) inside the `train` channel, when the channel holds the "
        "set and its shards beside it (SageMaker); without it the channel is the set's folder",
    )
    add("--width", type=int, default=32, help="fcos_tiny backbone width")
    add("--fpn-channels", type=int, default=64, help="fcos_tiny FPN channels (multiple of 32)")
    add("--min-size", type=int, default=160, help="shorter image side fed to the model")
    add("--max-size", type=int, default=320, help="longer image side cap")
    add("--max-steps", type=positive_int, default=200, help="optimizer steps in total, including resumed ones")
    add("--batch-size", type=positive_int, default=8, help="images per rank per step")
    add("--lr", type=float, default=2e-3)
    add("--weight-decay", type=float, default=0.01)
    add("--warmup-steps", type=int, default=50)
    add("--final-lr-fraction", type=float, default=0.05, help="cosine decays the lr to lr * this")
    add("--clip-grad", type=float, default=10.0, help="max gradient norm; 0 disables clipping")
    add("--seed", type=int, default=0)
    add("--hflip-prob", type=float, default=0.5)
    add("--color-jitter", type=float, default=0.2, help="brightness/contrast factor spread; 0 disables")
    add("--shuffle-buffer", type=int, default=256)
    add("--max-bad-samples", type=int, default=10, help="undecodable samples tolerated per rank; more fails the job")
    add("--workers", type=int, default=1, help="DataLoader workers per rank (0: decode in the training process)")
    add("--threads", type=int, help="torch threads per rank (default: CPUs / local ranks)")
    add("--checkpoint-every", type=positive_int, default=50)
    add(
        "--stop-after-steps",
        type=positive_int,
        help="the rehearsal's forced stop: after this many steps of this job, checkpoint and fail, "
        "so that the next attempt resumes from the checkpoint",
    )
    add("--keep-checkpoints", type=positive_int, default=3)
    add("--log-every", type=positive_int, default=10)
    add("--pg-timeout-min", type=float, default=30.0)
    wandb_run.add_arguments(parser)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The hyperparameters this trainer reads; the rest (every trainer gets every config field) logged, ignored."""
    parser = get_args_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        log.warning("ignoring arguments this trainer does not read: %s", " ".join(unknown))
    if problem := wandb_run.missing_server(args):
        parser.error(problem)
    return args


def warmup_cosine(warmup_steps: int, max_steps: int, final_fraction: float):
    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, max_steps - warmup_steps))
        return final_fraction + (1 - final_fraction) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


class ProgressReport:
    """Log each training line to the job log; `send` it to the run's event log at most every `every_s`
    seconds, and always the last line."""

    def __init__(self, send: Callable[[str], None] | None, ctx, every_s: float = 60.0, clock=time.monotonic) -> None:
        self._send, self._ctx, self._every_s, self._clock = send, ctx, every_s, clock
        self._last_event = -math.inf

    def __call__(self, line: dict[str, Any], last: bool = False) -> None:
        log_event(self._ctx, "train", **line)
        now = self._clock()
        if self._send is not None and (last or now - self._last_event >= self._every_s):
            self._send(json.dumps({"job": job_env.job_name(), "event": "train", **line}))
            self._last_event = now


def train(
    args: argparse.Namespace, ctx: DistributedContext, pipes
) -> tuple[dict[str, Any], torch.nn.Module, dict[str, Any], Any]:
    """Run (or finish) training: the summary, the unwrapped model, its config and the W&B run (rank 0,
    when tracking), left open for the model artifact."""
    started = time.perf_counter()
    torch.set_num_threads(args.threads or max(1, len(os.sched_getaffinity(0)) // ctx.local_world_size))
    manifest, shards = verified_split(
        job_env.channel_dir("train"), "train", ctx.rank, ctx.world_size, training_set_dir=args.training_set
    )
    config = model_config(
        args.arch, manifest["categories"], args.width, args.fpn_channels, args.min_size, args.max_size
    )
    torch.manual_seed(args.seed)  # identical initial weights on every rank
    # channels_last: faster convolutions on CPU (oneDNN) and on GPU.
    model_without_ddp = build_model(config).to(ctx.device, memory_format=torch.channels_last)
    optimizer = torch.optim.AdamW(model_without_ddp.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, warmup_cosine(args.warmup_steps, args.max_steps, args.final_lr_fraction)
    )
    checkpoints = job_env.checkpoint_dir()
    prepare_folder(checkpoints, ctx)
    random.seed(args.seed + ctx.rank)
    torch.manual_seed(args.seed + ctx.rank)
    resumed = resume_if_possible(checkpoints, model_without_ddp, optimizer, scheduler, config, args.batch_size, ctx)
    start_step = resumed.step
    model = model_without_ddp
    if ctx.is_distributed:
        model = DistributedDataParallel(
            model_without_ddp, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None
        )
    dataset = ShardDetectionStream(
        shards,
        rank=ctx.rank,
        world_size=ctx.world_size,
        seed=args.seed,
        batch_size=args.batch_size,
        augmentation=Augmentation(args.hflip_prob, args.color_jitter),
        shuffle_buffer=args.shuffle_buffer,
        max_bad_samples=args.max_bad_samples,
        resume_batches=start_step if resumed.data_continues else 0,
    )
    batches = iter(build_train_loader(dataset, args.batch_size, args.workers, ctx.device))
    # Rank 0 tracks; SageMaker uploads its output data folder (the default offline location) with the job.
    tracker = wandb_run.start(args, job_type="training", config={"model_config": config}) if ctx.is_main else None
    tracking = wandb_run.recorded(args, tracker)
    if tracker is not None:
        shard_set = wandb_artifacts.shard_set_artifact(
            job_env.channel_dir("train"), args.training_set, job_env.input_uri("train")
        )
        wandb_artifacts.use(tracker, shard_set)
        tracking["shard_set_artifact"] = shard_set.name
    stop = StopRequest()

    def checkpoint_state(at_step: int) -> dict[str, Any]:
        return {
            "model": model_without_ddp.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "step": at_step,
            "images_seen": images_seen(at_step),
            "args": wandb_run.without_tracking(vars(args)),
            "model_config": config,
            "categories": config["categories"],
        }

    def images_seen(at_step: int) -> int:  # batches are always full: the stream never runs dry
        return resumed.images_seen + (at_step - start_step) * args.batch_size * ctx.world_size

    step, data_wait, recent_losses, window_first_step = start_step, 0.0, [], start_step
    report_progress = ProgressReport(
        pipes.log.info if ctx.is_main and isinstance(pipes, job_env.PipesContext) else None, ctx
    )
    loop_started = window_started = time.perf_counter()
    gpu = GpuSampler(ctx.device).start()
    try:
        while step < args.max_steps:
            waited = time.perf_counter()
            images, targets = next(batches)
            data_wait += time.perf_counter() - waited
            mean_loss, stop_agreed = train_step(
                model, model_without_ddp, optimizer, images, targets, step, args, ctx, stop
            )
            scheduler.step()
            step += 1
            recent_losses = (recent_losses + [mean_loss])[-args.log_every :]
            if step % args.log_every == 0 or step == args.max_steps:
                now = time.perf_counter()
                line = {
                    "step": step,
                    "loss": round(mean_loss, 5),
                    "lr": scheduler.get_last_lr()[0],
                    "data_wait": round(data_wait / (now - loop_started), 4),
                    "images_per_s": round(
                        (step - window_first_step) * args.batch_size * ctx.world_size / (now - window_started), 2
                    ),
                }
                window_started, window_first_step = now, step
                report_progress(line, last=step == args.max_steps)
                if tracker is not None:
                    tracker.log({k: v for k, v in line.items() if k != "step"}, step=step)
            if stop_agreed:
                save_checkpoint(checkpoints, args.keep_checkpoints, checkpoint_state(step), ctx)
                raise TrainingInterrupted(
                    f"SIGTERM received: saved a checkpoint at step {step} of {args.max_steps}; "
                    "the next run with the same ZERO_CHECKPOINT_DIR resumes from it"
                )
            forced_stop = bool(args.stop_after_steps) and step - start_step >= args.stop_after_steps
            if step % args.checkpoint_every == 0 or step == args.max_steps or forced_stop:
                save_checkpoint(checkpoints, args.keep_checkpoints, checkpoint_state(step), ctx)
            if forced_stop and step < args.max_steps:
                raise TrainingInterrupted(
                    f"{FORCED_STOP} at step {step} of {args.max_steps} (--stop-after-steps "
                    f"{args.stop_after_steps}): checkpoint saved; the next attempt resumes from it"
                )
    except BaseException:
        if tracker is not None:
            tracker.finish(exit_code=1)  # the run's state says the job failed; the next attempt resumes it
        raise
    finally:
        # Stop the loader's workers now: they ignore SIGTERM (see build_train_loader), and at interpreter
        # exit multiprocessing would SIGTERM them and wait.
        del batches
        stop.restore()
        gpu.stop()
    loop_seconds = time.perf_counter() - loop_started
    steps_run = step - start_step
    data_wait_fractions, bad_samples = all_reduce_sum(
        torch.tensor([data_wait / max(loop_seconds, 1e-9), dataset.bad_samples.value], dtype=torch.float64)
    ).tolist()
    return (
        {
            "steps": step,
            "resumed_from_step": start_step,
            "images_seen": images_seen(step),
            "images_per_s": round(steps_run * args.batch_size * ctx.world_size / loop_seconds, 2) if steps_run else 0.0,
            "final_loss": round(sum(recent_losses) / len(recent_losses), 5) if recent_losses else None,
            "wall_s": round(time.perf_counter() - started, 2),
            "data_wait_fraction": round(data_wait_fractions / ctx.world_size, 4),
            **gpu_report(gpu.sample(), ctx.world_size),
            "bad_samples_skipped": int(bad_samples),
            "world_size": ctx.world_size,
            "arch": args.arch,
            "train_images": sum(shard.live_rows for shard in shards),  # the stream's rows: all but masked ones
            "job_name": job_env.job_name(),
            "device": str(ctx.device),
            "wandb": tracking,
        },
        model_without_ddp,
        config,
        tracker,
    )


def report_metadata(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary as the materialization's metadata: the rows trained on are Dagster's `dagster/row_count`."""
    metadata = {k: v for k, v in summary.items() if v is not None and k not in ("train_images", "wandb")}
    if "gpu_utilization_by_rank" in metadata:
        metadata["gpu_utilization_by_rank"] = job_env.table(metadata["gpu_utilization_by_rank"])
    return {"dagster/row_count": summary["train_images"], **metadata, **wandb_run.report_metadata(summary["wandb"])}


def main(args: argparse.Namespace) -> None:
    with job_env.pipes_session() as pipes, distributed_session(args.pg_timeout_min) as ctx:
        summary, model, config, tracker = train(args, ctx, pipes)
        if not ctx.is_main:
            return
        try:
            publish_model(model, config, summary, wandb_run.without_tracking(vars(args)), tracker)
        except BaseException:
            if tracker is not None:
                tracker.finish(exit_code=1)
            raise
        if tracker is not None:
            tracker.finish()
        log_event(ctx, "done", **summary)
        pipes.report_asset_materialization(metadata=report_metadata(summary), data_version=summary["data_version"])


if __name__ == "__main__":
    main(parse_args())
