"""GPU check (not in `make bench`: needs CUDA): train demo shards through the real loader and step, and
print images/s per GPU and the GPU utilisation `trained_checkpoint` records (goal >= 90%).

    torchrun --standalone --nproc_per_node <GPUs> -m benchmarks.gpu_train [--seconds 180] [--arch fcos_resnet50_fpn]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from multiprocessing import Pool
from pathlib import Path

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel

from benchmarks.scene_shards import CATEGORY_LIST, scene_row, write_shard_set
from training_code.lib.detection_data import Augmentation, ShardDetectionStream, build_train_loader
from training_code.lib.detection_samples import verified_split
from training_code.lib.distributed import all_reduce_sum, barrier, distributed_session
from training_code.lib.gpu_usage import GpuSampler, gpu_report
from training_code.lib.model import ARCHITECTURES, build_model, model_config
from training_code.lib.train_step import StopRequest, train_step

GOAL_UTILIZATION = 0.9


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Train on generated data on CUDA and report images/s and GPU busy time"
    )
    parser.add_argument("--seconds", type=float, default=180.0, help="timed training after warm-up")
    parser.add_argument(
        "--warmup-steps", type=int, default=20, help="steps before timing (cuDNN autotune, worker start)"
    )
    parser.add_argument("--arch", default="fcos_resnet50_fpn", choices=ARCHITECTURES)
    parser.add_argument("--min-size", type=int, default=480)
    parser.add_argument("--max-size", type=int, default=640)
    parser.add_argument("--batch-size", type=int, default=16, help="images per GPU per step")
    parser.add_argument("--workers", type=int, default=6, help="DataLoader workers per GPU")
    parser.add_argument(
        "--scenes", type=int, default=1024, help="distinct rendered scenes (the stream loops over them)"
    )
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--clip-grad", type=float, default=10.0)
    return parser


def _render(index: int) -> dict:
    return scene_row(np.random.default_rng(index), f"train/{index:06d}")


def write_shards(folder: Path, scenes: int) -> Path:
    with Pool() as pool:
        return write_shard_set(folder, {"train": pool.imap(_render, range(scenes), chunksize=16)}, 256 << 20)


def main(args: argparse.Namespace) -> None:
    if not torch.cuda.is_available():
        raise SystemExit(
            "benchmarks.gpu_train needs a CUDA GPU (torch.cuda.is_available() is False); run it on a GPU machine"
        )
    # One folder per launch that every local rank can find (torchrun gives all ranks the same run id).
    shards_dir = Path(tempfile.gettempdir()) / f"zero-gpu-train-{os.environ.get('TORCHELASTIC_RUN_ID', os.getpid())}"
    with distributed_session() as ctx:
        if ctx.local_rank == 0:
            write_shards(shards_dir, args.scenes)
        barrier()
        _, shards = verified_split(shards_dir, "train", ctx.rank, ctx.world_size)
        torch.manual_seed(0)
        config = model_config(args.arch, CATEGORY_LIST, min_size=args.min_size, max_size=args.max_size)
        model_without_ddp = build_model(config).to(ctx.device, memory_format=torch.channels_last)
        model = (
            DistributedDataParallel(model_without_ddp, device_ids=[ctx.device.index])
            if ctx.is_distributed
            else model_without_ddp
        )
        optimizer = torch.optim.AdamW(model_without_ddp.parameters(), lr=args.lr)
        stream = ShardDetectionStream(
            shards,
            rank=ctx.rank,
            world_size=ctx.world_size,
            seed=0,
            batch_size=args.batch_size,
            augmentation=Augmentation(),
        )
        batches = iter(build_train_loader(stream, args.batch_size, args.workers, ctx.device))
        stop = StopRequest()
        step = 0
        for _ in range(args.warmup_steps):
            train_step(model, model_without_ddp, optimizer, *next(batches), step, args, ctx, stop)
            step += 1
        torch.cuda.synchronize()
        images, waited, started = 0, 0.0, time.perf_counter()
        gpu = GpuSampler(ctx.device, every_s=0.5).start()  # what trained_checkpoint records, sampled the same way
        while time.perf_counter() - started < args.seconds:
            before = time.perf_counter()
            batch = next(batches)
            waited += time.perf_counter() - before
            train_step(model, model_without_ddp, optimizer, *batch, step, args, ctx, stop)
            images += len(batch[0])
            step += 1
        torch.cuda.synchronize()
        gpu.stop()
        elapsed = time.perf_counter() - started
        utilization = gpu_report(gpu.sample(), ctx.world_size)
        totals = all_reduce_sum(
            torch.tensor([images / elapsed, waited / elapsed], dtype=torch.float64, device=ctx.device)
        )
        stop.restore()
        del batches
        report = {
            "arch": args.arch,
            "gpus": ctx.world_size,
            "gpu": torch.cuda.get_device_name(ctx.device),
            "batch_per_gpu": args.batch_size,
            "workers_per_gpu": args.workers,
            "steps_timed": step - args.warmup_steps,
            "images_per_s_per_gpu": round(totals[0].item() / ctx.world_size, 1),
            "data_wait_fraction": round(totals[1].item() / ctx.world_size, 4),
            **{k: v for k, v in utilization.items() if k != "gpu_utilization_by_rank"},
            "goal_utilization": GOAL_UTILIZATION,
        }
        report["met"] = report.get("gpu_utilization", 0.0) >= GOAL_UTILIZATION
        if ctx.is_main:
            print("GPU_CHECK " + json.dumps(report), flush=True)
        barrier()
        if ctx.local_rank == 0:
            shutil.rmtree(shards_dir)


if __name__ == "__main__":
    main(get_args_parser().parse_args())
