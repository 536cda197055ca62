"""torchrun --standalone --nproc_per_node 1 -m own_trainer.train_ssd --max-steps 4 --batch-size 2

A training module kept to the README's contract: shards from the `train` channel (SM_CHANNEL_TRAIN),
hyperparameters as `--kebab-case value` (it reads the ones it uses and ignores the rest), a resumable
checkpoint in the checkpoint folder, `ssdlite.pt` and `manifest.json` (last) in SM_MODEL_DIR, and one
Pipes materialization with the model file's sha256 as data version. One process: it refuses more.
"""

from __future__ import annotations

import argparse
import os
import random

import torch
from own_trainer.detector import MODEL_FILE, build_detector, save_atomic

from training_code.lib import job_env
from training_code.lib.detection_samples import iter_eval_samples, verified_split
from training_code.lib.hashing import sha256_file
from training_code.lib.output_manifest import write_output_manifest

CHECKPOINT = "ssd-last.pt"


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Train SSDlite on the warm shards")
    parser.add_argument("--max-steps", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint-every", type=int, default=2)
    parser.add_argument("--training-set", default=None, help="the training set's folder inside the channel (SageMaker)")
    return parser


def train(args: argparse.Namespace) -> dict:
    # One thread: the rehearsal machines are small and shared; more threads contend instead of helping.
    torch.set_num_threads(1)
    manifest, shards = verified_split(job_env.channel_dir("train"), "train", training_set_dir=args.training_set)
    samples = list(iter_eval_samples(shards))  # a handful of demo images: decoded once, kept in memory
    num_classes = max(int(c["id"]) for c in manifest["categories"]) + 1
    torch.manual_seed(args.seed)
    model = build_detector(num_classes).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    checkpoint_path = job_env.checkpoint_dir() / CHECKPOINT
    step = 0
    if checkpoint_path.is_file():  # a rerun of the same inputs resumes where the last one stopped
        state = torch.load(checkpoint_path, map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
    draws = random.Random(args.seed + step)
    loss = None
    while step < args.max_steps:
        batch = draws.sample(samples, min(args.batch_size, len(samples)))
        images = [sample.image.float().div(255) for sample in batch]
        targets = [{"boxes": sample.boxes.float(), "labels": sample.labels.long()} for sample in batch]
        loss = sum(model(images, targets).values())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if step % args.checkpoint_every == 0 or step == args.max_steps:
            save_atomic(
                {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, checkpoint_path
            )
    model_path = job_env.model_dir() / MODEL_FILE
    save_atomic(
        {"model": model.state_dict(), "num_classes": num_classes, "categories": manifest["categories"], "step": step},
        model_path,
    )
    write_output_manifest(model_path.parent, [MODEL_FILE], format="own-ssdlite/1")  # last: the output is complete
    return {
        "steps": step,
        "final_loss": None if loss is None else round(loss.item(), 4),
        "dagster/row_count": len(samples),
        "model_sha256": sha256_file(model_path),
    }


def main(argv: list[str] | None = None) -> None:
    args, _ = get_args_parser().parse_known_args(
        argv
    )  # the graph passes every TrainConfig field; this trainer uses some
    with job_env.pipes_session() as pipes:
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise SystemExit("own_trainer.train_ssd trains in one process: set trained_checkpoint's `processes` to 1")
        summary = train(args)
        pipes.report_asset_materialization(metadata=summary, data_version=summary["model_sha256"])


if __name__ == "__main__":
    main()
