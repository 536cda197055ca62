"""`loader`: the training DataLoader's images/s over a bare decode of the same shard bytes, same workers and batch.

Both sides are DataLoaders with the same worker count, batch size and collation over the same rows; the
bare side only turns each row's bytes into a uint8 tensor. Our side also pays, in the consuming process,
for making the targets tensors (`targets_on`), which the collation leaves to the training step. The
ratio is what reading targets, EXIF, augmentation and the stride/shuffle order cost on top of decoding. Goal: >= 0.85.
"""

from __future__ import annotations

import io
import itertools
import statistics
import tempfile
import time
from pathlib import Path

import torch
from PIL import Image
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
from torchvision.transforms.v2 import functional as F

from benchmarks.report import BenchResult
from benchmarks.scene_shards import write_scene_shards
from training_code.lib import shard_format
from training_code.lib.detection_data import (
    Augmentation,
    ShardDetectionStream,
    build_train_loader,
    collate_detection,
    targets_on,
)
from training_code.lib.detection_samples import ShardRef, verified_split

ROWS = 240
WORKERS = 2
BATCH = 8
WARMUP_BATCHES = 4
TIMED_BATCHES = 150
ROUNDS = 7


class BareDecode(IterableDataset):
    """Each worker takes every n-th row of the shards, endlessly, and decodes its bytes to a tensor; nothing else."""

    def __init__(self, shards: list[ShardRef]) -> None:
        super().__init__()
        self.shards = shards

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        columns = [shard_format.image_bytes(shard_format.open_shard(s.path)) for s in self.shards]
        rows = [(c, r) for c in columns for r in range(len(c))]
        for position, (column, row) in enumerate(itertools.cycle(rows)):
            if position % workers == worker:
                with Image.open(io.BytesIO(column[row].as_py())) as image:
                    yield F.pil_to_tensor(image.convert("RGB")), {}


def images_per_second(loader: DataLoader, consume=None) -> float:
    batches = iter(loader)
    for _ in range(WARMUP_BATCHES):  # worker start-up and the first shard pages are not throughput
        next(batches)
    started = time.perf_counter()
    count = 0
    for _ in range(TIMED_BATCHES):
        images, targets = next(batches)
        if consume:
            consume(images, targets)
        count += len(images)
    return count / (time.perf_counter() - started)


def targets_as_tensors(images: list[torch.Tensor], targets: list[dict]) -> None:
    targets_on(targets, torch.device("cpu"))


def run() -> list[BenchResult]:
    with tempfile.TemporaryDirectory(prefix="bench-loader-") as folder:
        _, shards = verified_split(write_scene_shards(Path(folder), {"train": ROWS}, seed=1), "train")
        cpu = torch.device("cpu")
        measured: dict[str, list[float]] = {"ours": [], "bare": []}
        # Rounds alternate which side goes first; the figure is the median of each round's ratio, so a load
        # spike from another process on this shared machine moves one round, not the result.
        for round_index in range(ROUNDS):
            for side in ("ours", "bare") if round_index % 2 == 0 else ("bare", "ours"):
                if side == "ours":
                    stream = ShardDetectionStream(
                        shards, rank=0, world_size=1, seed=0, batch_size=BATCH, augmentation=Augmentation()
                    )
                    loader, consume = build_train_loader(stream, BATCH, WORKERS, cpu), targets_as_tensors
                else:
                    loader, consume = (
                        DataLoader(
                            BareDecode(shards),
                            batch_size=BATCH,
                            num_workers=WORKERS,
                            collate_fn=collate_detection,
                            prefetch_factor=4,
                            persistent_workers=True,
                        ),
                        None,
                    )
                measured[side].append(images_per_second(loader, consume))
    ratios = sorted(o / b for o, b in zip(measured["ours"], measured["bare"]))
    return [
        BenchResult(
            "loader",
            ratios[len(ratios) // 2],
            ">=0.85",
            {
                "loader_img_s": statistics.median(measured["ours"]),
                "bare_decode_img_s": statistics.median(measured["bare"]),
                "rounds": ROUNDS,
                "workers": WORKERS,
                "batch": BATCH,
            },
        )
    ]
