"""The training stream of detection samples (see detection_samples): endless, deterministically mixed, augmented.

Each rank reads its own row ranges of many shards per epoch (see read_order); its DataLoader workers
deal the rank's stream by stride. Augmentation happens here, at read time, never in the shards.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import random
import signal
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from PIL import Image
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
from torchvision import tv_tensors
from torchvision.transforms.v2 import functional as F

from . import read_order
from .detection_samples import BadSampleError, ShardRef, ShardRows, decode_sample

log = logging.getLogger("zero.data")


@dataclass(frozen=True)
class Augmentation:
    hflip_prob: float = 0.5
    color_jitter: float = 0.2  # brightness and contrast factors drawn from [1 - j, 1 + j]


class TooManyBadSamplesError(RuntimeError):
    pass


def augment(picture: Image.Image, target: dict[str, torch.Tensor], settings: Augmentation, draws: random.Random):
    """Flip picture and boxes, and draw the photometric factors into `target["photometric"]` for
    `apply_photometric` (on the training device). No saturation or hue jitter: colour is a class cue for parts."""
    flip, brightness, contrast = draws.random(), draws.random(), draws.random()
    if flip < settings.hflip_prob:
        # No clamping: validation rejected boxes outside the image, and a flip keeps them inside.
        boxes = tv_tensors.BoundingBoxes(target["boxes"], format="XYXY", canvas_size=(picture.height, picture.width))
        picture = F.horizontal_flip(picture)
        target = {**target, "boxes": F.horizontal_flip(boxes).as_subclass(torch.Tensor)}
    spread = settings.color_jitter
    return picture, {
        **target,
        "photometric": [1 - spread + 2 * spread * brightness, 1 - spread + 2 * spread * contrast],
    }


def apply_photometric(images: list[torch.Tensor], targets: list[dict[str, Any]]) -> list[torch.Tensor]:
    """Apply each sample's brightness then contrast factors (popped from its target) to float images in [0, 1]."""
    adjusted = []
    for image, target in zip(images, targets):
        factors = target.pop("photometric", None)  # absent when the stream does not augment
        if factors is not None and factors != [1, 1]:
            brightness, contrast = factors
            image = F.adjust_contrast(F.adjust_brightness(image, brightness), contrast)
        adjusted.append(image)
    return adjusted


class ShardDetectionStream(IterableDataset):
    """Endless training stream of this rank (so `--max-steps` alone decides when training stops); each
    DataLoader worker takes every n-th sample. `resume_batches` skips, undecoded, what each worker delivered
    before a checkpoint, so a resumed job sees the same batches."""

    def __init__(
        self,
        shards: list[ShardRef],
        *,
        rank: int,
        world_size: int,
        seed: int,
        batch_size: int,
        augmentation: Augmentation | None,
        shuffle_buffer: int = 256,
        open_shards: int = 32,
        max_bad_samples: int = 0,
        resume_batches: int = 0,
    ) -> None:
        super().__init__()
        self.shards, self.rank, self.world_size, self.seed = shards, rank, world_size, seed
        self.batch_size, self.augmentation, self.shuffle_buffer = batch_size, augmentation, shuffle_buffer
        self.open_shards, self.max_bad_samples, self.resume_batches = open_shards, max_bad_samples, resume_batches
        # Shared with this rank's DataLoader workers, so the bound holds per rank and the trainer can report it.
        self.bad_samples = multiprocessing.Value("i", 0)
        if sum(s.rows for s in shards) < world_size:
            raise ValueError(
                f"the training shards hold {sum(s.rows for s in shards)} rows, fewer than the {world_size} ranks; "
                "every rank needs rows of its own"
            )

    def rank_order(self) -> Iterator[tuple[int, int, int, int]]:
        """(epoch, position in the epoch, shard index, row) of this rank's stream, endlessly; reads no shard."""
        rows, sources = [s.rows for s in self.shards], [s.source for s in self.shards]
        layout = {name: getattr(self, name) for name in ("seed", "rank", "world_size", "open_shards", "shuffle_buffer")}
        for epoch in itertools.count():
            for position, (shard, row) in enumerate(read_order.rank_epoch(rows, sources, epoch=epoch, **layout)):
                yield epoch, position, shard, row

    def __iter__(self) -> Iterator[tuple[torch.Tensor, dict[str, torch.Tensor]]]:
        info = get_worker_info()
        workers = info.num_workers if info else 1
        # DataLoader takes batches from workers round-robin from worker 0: rotate roles so a resumed
        # stream continues that order.
        worker = ((info.id if info else 0) + self.resume_batches) % workers
        done_batches = self.resume_batches // workers + (1 if worker < self.resume_batches % workers else 0)
        to_skip = done_batches * self.batch_size
        # Opened lazily in the reading process (mapped, not pickled); room for twice the lanes, since the
        # shuffle buffer can still hold rows of a finished shard.
        tables: OrderedDict[int, ShardRows] = OrderedDict()
        current_epoch, mine_this_epoch = 0, 0
        for epoch, position, shard, row in self.rank_order():
            if epoch != current_epoch:
                if not mine_this_epoch:  # a worker dealt nothing would spin forever: the job would hang, not fail
                    raise ValueError(
                        f"rank {self.rank}: epoch {current_epoch} held fewer rows than its {workers} DataLoader "
                        f"workers (masked rows do not count), so worker {worker} got none; use fewer --workers"
                    )
                current_epoch, mine_this_epoch = epoch, 0
            if position % workers != worker:
                continue
            if shard in tables:
                tables.move_to_end(shard)
            else:
                tables[shard] = ShardRows(self.shards[shard].path)
                if len(tables) > 2 * self.open_shards:
                    tables.popitem(last=False)
            if self.shards[shard].masked and tables[shard].key(row) in self.shards[shard].masked:
                continue  # masked: no longer selected (or packed again elsewhere), skipped until compaction
            mine_this_epoch += 1
            if to_skip:  # counts the samples delivered before: exact unless a skipped sample was a bad one
                to_skip -= 1
                continue
            try:
                picture, target, _key = decode_sample(tables[shard], row, min_box_side=1.0)
            except BadSampleError as error:
                with self.bad_samples.get_lock():
                    self.bad_samples.value += 1
                    bad_samples = self.bad_samples.value
                log.warning(
                    "skipping %s row %d: %s (%d bad so far)", self.shards[shard].path.name, row, error, bad_samples
                )
                if bad_samples > self.max_bad_samples:
                    raise TooManyBadSamplesError(
                        f"{bad_samples} undecodable samples on rank {self.rank}, more than --max-bad-samples "
                        f"{self.max_bad_samples}; last: {self.shards[shard].path} row {row}: {error}. "
                        "Re-run validation on the raw data or raise the bound."
                    ) from error
                continue
            if self.augmentation is not None:  # seeded by the sample, so any rank or worker augments it alike
                sample_seed = (((self.seed * 1_000_003 + epoch) * 1_000_003 + shard) * 1_000_003 + row) % 2**63
                picture, target = augment(picture, target, self.augmentation, random.Random(sample_seed))
            yield F.pil_to_tensor(picture), target


def collate_detection(batch: list[tuple[torch.Tensor, dict]]) -> tuple[list[torch.Tensor], list[dict[str, Any]]]:
    """Images and targets as lists (box counts differ per image); a worker's trip costs per tensor, so the
    images share one buffer and the targets travel as plain lists (`targets_on` makes them tensors)."""
    images, targets = zip(*batch)
    lists = [
        {name: value.tolist() if isinstance(value, torch.Tensor) else value for name, value in target.items()}
        for target in targets
    ]
    return _in_one_buffer(list(images)), lists


def _in_one_buffer(images: list[torch.Tensor]) -> list[torch.Tensor]:
    """The CHW uint8 images as views (of HWC memory, as `pil_to_tensor` gives) of one buffer, shared in a worker."""
    flat = [image.permute(1, 2, 0).reshape(-1) for image in images]
    sizes = [part.numel() for part in flat]
    out = None
    if get_worker_info() is not None:
        out = flat[0].new(flat[0]._typed_storage()._new_shared(sum(sizes), device=flat[0].device))
    buffer = torch.cat(flat, out=out)
    return [
        part.view(h, w, c).permute(2, 0, 1)
        for part, (c, h, w) in zip(buffer.split(sizes), (image.shape for image in images))
    ]


def targets_on(targets: list[dict[str, Any]], device: torch.device) -> list[dict[str, torch.Tensor]]:
    """The collated targets as the model's tensors on `device` (boxes [N, 4] float32 xyxy, labels [N] int64)."""
    return [
        {
            "boxes": torch.tensor(target["boxes"], dtype=torch.float32, device=device).reshape(-1, 4),
            "labels": torch.tensor(target["labels"], dtype=torch.int64, device=device),
        }
        for target in targets
    ]


def _ignore_sigterm(worker_id: int) -> None:
    """SIGTERM makes the training process checkpoint, which needs its workers alive until it closes the loader."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def build_train_loader(
    dataset: ShardDetectionStream, batch_size: int, workers: int, device: torch.device
) -> DataLoader:
    # File-system sharing avoids running out of file descriptors when workers pass many tensors.
    torch.multiprocessing.set_sharing_strategy("file_system")
    return DataLoader(
        dataset,
        batch_size=batch_size,
        num_workers=workers,
        collate_fn=collate_detection,
        persistent_workers=workers > 0,
        pin_memory=device.type == "cuda",
        prefetch_factor=4 if workers > 0 else None,
        worker_init_fn=_ignore_sigterm,
    )
