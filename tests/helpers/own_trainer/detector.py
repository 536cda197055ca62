"""The detector both scripts share: torchvision's SSDlite (MobileNetV3), built from scratch, and the
model file it travels in (`ssdlite.pt`, not the default trainer's `model.pt`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torchvision.models.detection import ssdlite320_mobilenet_v3_large

MODEL_FILE = "ssdlite.pt"


def build_detector(num_classes: int) -> torch.nn.Module:
    # Nothing is downloaded: no pretrained weights for the detector or its backbone.
    return ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=num_classes)


def save_atomic(payload: dict[str, Any], path: Path) -> None:
    """A reader (the resume, the evaluator) never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".tmp-{path.name}")
    torch.save(payload, temporary)
    os.replace(temporary, path)


def load_detector(folder: Path) -> tuple[torch.nn.Module, dict[str, Any]]:
    path = Path(folder) / MODEL_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no {MODEL_FILE} in {folder}: pass the model folder own_trainer.train_ssd wrote")
    payload = torch.load(path, map_location="cpu", weights_only=True)
    model = build_detector(payload["num_classes"])
    model.load_state_dict(payload["model"])
    return model.eval(), payload
