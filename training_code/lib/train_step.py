"""One optimizer step of data-parallel training, with one all-reduce that agrees the loss and any SIGTERM."""

from __future__ import annotations

import math
import signal

import torch

from .detection_data import apply_photometric, targets_on
from .distributed import DistributedContext, all_reduce_sum


class NonFiniteLossError(RuntimeError):
    """The loss over all ranks is NaN or infinite: the job ends with a non-zero exit."""


class StopRequest:
    """SIGTERM (SageMaker stop, spot reclaim, torchrun teardown) becomes a flag the loop checks each step."""

    def __init__(self) -> None:
        self.requested = False
        self._previous = signal.signal(signal.SIGTERM, lambda signum, frame: setattr(self, "requested", True))

    def restore(self) -> None:
        signal.signal(signal.SIGTERM, self._previous)


def train_step(
    model, model_without_ddp, optimizer, images, targets, step: int, args, ctx: DistributedContext, stop: StopRequest
) -> tuple[float, bool]:
    """Forward, agree across ranks, backward, clip, update: (mean loss over all ranks, whether to stop)."""
    images = [image.to(ctx.device, non_blocking=True).float().div_(255) for image in images]
    images = apply_photometric(images, targets)
    targets = targets_on(targets, ctx.device)
    with torch.autocast(ctx.device.type, dtype=torch.bfloat16, enabled=ctx.device.type == "cuda"):
        losses = model(images, targets)
    loss = sum(losses.values())
    # One collective per step: the loss weighted by sample count, and whether any rank got SIGTERM, so
    # every rank stops (or fails) at the same step instead of hanging in the next all-reduce.
    loss_sum, samples, ranks_stopping = all_reduce_sum(
        torch.tensor([loss.item() * len(images), len(images), float(stop.requested)], dtype=torch.float64)
    ).tolist()
    mean_loss = loss_sum / samples
    if not math.isfinite(mean_loss):
        parts = {k: round(v.item(), 4) for k, v in losses.items()}
        raise NonFiniteLossError(
            f"step {step + 1}: loss is {mean_loss} (this rank's parts: {parts}); "
            f"lower --lr (now {args.lr}) or check the training shards"
        )
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if args.clip_grad > 0:
        torch.nn.utils.clip_grad_norm_(model_without_ddp.parameters(), args.clip_grad)
    optimizer.step()
    return mean_loss, ranks_stopping > 0
