"""Detector construction from a plain config dict, and the `model.pt` file that carries weights and config.

The config travels inside every checkpoint and `model.pt`, so `evaluate.py` rebuilds exactly what
`train.py` trained. Nothing here downloads weights (`weights=None, weights_backbone=None`)."""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torchvision.models import detection
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.fcos import FCOSHead
from torchvision.ops import FeaturePyramidNetwork

from .storage import write_atomically

DEFAULT_ARCH = "fcos_tiny"

# One-stage and two-stage detectors name their post-processing knobs differently.
_ONE_STAGE = {"score": "score_thresh", "detections": "detections_per_img"}
_TWO_STAGE = {"score": "box_score_thresh", "detections": "box_detections_per_img"}
# torchvision builders by name, with the keywords each one uses.
TORCHVISION_BUILDERS: dict[str, tuple[Callable[..., nn.Module], dict[str, str]]] = {
    "fcos_resnet50_fpn": (detection.fcos_resnet50_fpn, _ONE_STAGE),
    "retinanet_resnet50_fpn_v2": (detection.retinanet_resnet50_fpn_v2, _ONE_STAGE),
    "fasterrcnn_mobilenet_v3_large_fpn": (detection.fasterrcnn_mobilenet_v3_large_fpn, _TWO_STAGE),
    "fasterrcnn_resnet50_fpn_v2": (detection.fasterrcnn_resnet50_fpn_v2, _TWO_STAGE),
}
ARCHITECTURES = (DEFAULT_ARCH, *TORCHVISION_BUILDERS)


def model_config(
    arch: str,
    categories: list[dict[str, Any]],
    width: int = 32,
    fpn_channels: int = 64,
    min_size: int = 160,
    max_size: int = 320,
    score_thresh: float = 0.05,
    detections_per_img: int = 100,
) -> dict[str, Any]:
    """The complete, JSON-able description `build_model` needs; categories are the manifest's."""
    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown --arch {arch!r}; choose one of {', '.join(ARCHITECTURES)}")
    ids = [int(c["id"]) for c in categories]
    if not ids or min(ids) < 1 or len(set(ids)) != len(ids):
        raise ValueError(f"manifest categories must have unique ids >= 1 (0 is the background slot); got {ids}")
    if arch == DEFAULT_ARCH and fpn_channels % 32:
        raise ValueError(f"--fpn-channels {fpn_channels} must be a multiple of 32 (FCOSHead uses GroupNorm(32))")
    return {
        "arch": arch,
        # Labels are the category ids themselves, so the class dimension needs max id + 1 slots.
        "num_classes": max(ids) + 1,
        "width": width,
        "fpn_channels": fpn_channels,
        "min_size": min_size,
        "max_size": max_size,
        "score_thresh": score_thresh,
        "detections_per_img": detections_per_img,
        "categories": [{"id": int(c["id"]), "name": str(c["name"])} for c in categories],
    }


def build_model(config: dict[str, Any]) -> nn.Module:
    arch = config["arch"]
    if arch == DEFAULT_ARCH:
        return _fcos_tiny(config)
    if arch not in TORCHVISION_BUILDERS:
        raise ValueError(f"model config names unknown arch {arch!r}; known: {', '.join(ARCHITECTURES)}")
    builder, keywords = TORCHVISION_BUILDERS[arch]
    return builder(
        weights=None,
        weights_backbone=None,
        num_classes=config["num_classes"],
        min_size=config["min_size"],
        max_size=config["max_size"],
        **{keywords["score"]: config["score_thresh"], keywords["detections"]: config["detections_per_img"]},
    )


def _conv_bn_relu(in_channels: int, out_channels: int, stride: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
    )


class TinyBackboneWithFPN(nn.Module):
    """A small strided conv net (strides 8/16/32 at c3/c4/c5) under a torchvision FPN."""

    def __init__(self, width: int, out_channels: int) -> None:
        super().__init__()
        w = width
        self.stem = nn.Sequential(_conv_bn_relu(3, w // 2, 2), _conv_bn_relu(w // 2, w, 2), _conv_bn_relu(w, w, 1))
        self.c3 = nn.Sequential(_conv_bn_relu(w, 2 * w, 2), _conv_bn_relu(2 * w, 2 * w, 1))
        self.c4 = nn.Sequential(_conv_bn_relu(2 * w, 4 * w, 2), _conv_bn_relu(4 * w, 4 * w, 1))
        self.c5 = nn.Sequential(_conv_bn_relu(4 * w, 4 * w, 2), _conv_bn_relu(4 * w, 4 * w, 1))
        self.fpn = FeaturePyramidNetwork([2 * w, 4 * w, 4 * w], out_channels)
        self.out_channels = out_channels  # FCOS reads this to size its head

    def forward(self, images: torch.Tensor) -> OrderedDict[str, torch.Tensor]:
        c3 = self.c3(self.stem(images))
        c4 = self.c4(c3)
        c5 = self.c5(c4)
        return self.fpn(OrderedDict([("c3", c3), ("c4", c4), ("c5", c5)]))


def _fcos_tiny(config: dict[str, Any]) -> nn.Module:
    backbone = TinyBackboneWithFPN(config["width"], config["fpn_channels"])
    # One anchor size per level equal to its stride, as torchvision's FCOS expects.
    anchors = AnchorGenerator(sizes=((8,), (16,), (32,)), aspect_ratios=((1.0,),) * 3)
    return detection.FCOS(
        backbone,
        num_classes=config["num_classes"],
        min_size=config["min_size"],
        max_size=config["max_size"],
        anchor_generator=anchors,
        head=FCOSHead(backbone.out_channels, 1, config["num_classes"], num_convs=2),
        score_thresh=config["score_thresh"],
        detections_per_img=config["detections_per_img"],
    )


MODEL_FILE = "model.pt"


def atomic_torch_save(payload: dict[str, Any], path: Path) -> None:
    """torch.save through an open temporary file, then rename (a name would be recorded in the bytes)."""

    def save(temporary: Path) -> None:
        with open(temporary, "wb") as handle:
            torch.save(payload, handle)

    write_atomically(Path(path), save)


def save_model_file(folder: Path, model: nn.Module, config: dict[str, Any], step: int, args: dict[str, Any]) -> Path:
    """The job's final artifact: weights plus everything needed to rebuild and label them."""
    path = Path(folder) / MODEL_FILE
    payload = {"model": model.state_dict(), "model_config": config, "categories": config["categories"]}
    atomic_torch_save({**payload, "step": step, "args": args}, path)
    return path


def load_model_file(path: Path, device: torch.device) -> tuple[nn.Module, dict[str, Any]]:
    """Rebuild the trained model from `model.pt` (weights only: no pickled code is executed)."""
    path = Path(path)
    if path.is_dir():
        path = path / MODEL_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"no model file at {path}: pass the training job's model folder (it holds {MODEL_FILE})"
        )
    payload = torch.load(path, map_location="cpu", weights_only=True)
    for field in ("model", "model_config"):
        if field not in payload:
            raise ValueError(
                f"{path}: field {field!r} is missing; is this a model file written by training_code.train?"
            )
    model = build_model(payload["model_config"])
    model.load_state_dict(payload["model"])
    return model.to(device).eval(), payload


def model_version(state_dict: dict[str, torch.Tensor], config: dict[str, Any], step: int) -> str:
    """The model's data version: sha256 of the weights (name, dtype, shape, values), config and step, never
    of how `model.pt` was written, so equal weights keep one version whatever else the file records."""
    digest = hashlib.sha256(b"zero-model-version/1\n")
    described = {"model_config": config, "categories": config["categories"], "step": int(step)}
    digest.update(json.dumps(described, sort_keys=True, separators=(",", ":")).encode() + b"\n")
    for name in sorted(state_dict):
        tensor = state_dict[name].detach().to("cpu").contiguous()  # values, whatever the memory format
        digest.update(f"{name}:{tensor.dtype}:{list(tensor.shape)}\n".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def payload_version(payload: dict[str, Any]) -> str:
    """`model_version` of a loaded `model.pt` payload."""
    return model_version(payload["model"], payload["model_config"], payload["step"])
