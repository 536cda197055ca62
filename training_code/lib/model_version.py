"""The data version of a trained model: a hash of what was trained, never of how the file was written.

sha256 of the weights (each tensor by name, dtype, shape, values), model config, categories and step,
so equal weights keep one version whatever else `model.pt` records (arguments, logging).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import torch

VERSION_FORMAT = b"zero-model-version/1\n"


def model_version(state_dict: dict[str, torch.Tensor], config: dict[str, Any], step: int) -> str:
    """sha256 hex of the weights in `state_dict`, the model `config` (its categories included) and `step`."""
    digest = hashlib.sha256(VERSION_FORMAT)
    described = {"model_config": config, "categories": config["categories"], "step": int(step)}
    digest.update(json.dumps(described, sort_keys=True, separators=(",", ":")).encode() + b"\n")
    for name in sorted(state_dict):
        tensor = state_dict[name].detach().to("cpu").contiguous()  # values, whatever the memory format
        digest.update(f"{name}:{tensor.dtype}:{list(tensor.shape)}\n".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def payload_version(payload: dict[str, Any]) -> str:
    """`model_version` of a loaded `model.pt` payload (see `model.save_model_file`)."""
    return model_version(payload["model"], payload["model_config"], payload["step"])
