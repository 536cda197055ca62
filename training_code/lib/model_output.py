"""The training job's model folder: `model.pt`, `training_summary.json`, the W&B artifact, the manifest last."""

from __future__ import annotations

import json
from typing import Any

from torch import nn

from training_code.lib import job_env, wandb_artifacts
from training_code.lib.model import model_version, save_model_file
from training_code.lib.output_manifest import write_output_manifest
from training_code.lib.shard_format import sha256_file
from training_code.lib.storage import write_bytes_atomic
from training_code.lib.wandb_run import SUMMARY_FILE


def publish_model(
    model: nn.Module, config: dict[str, Any], summary: dict[str, Any], arguments: dict[str, Any], tracker
) -> None:
    """Write the model folder, `summary` updated with the data version (`model_version`, so equal
    weights leave downstream fresh) and files, and log the model artifact to `tracker` (or None)."""
    model_path = save_model_file(job_env.model_dir(), model, config, summary["steps"], arguments)
    version = model_version(model.state_dict(), config, summary["steps"])
    summary.update(
        {
            "data_version": version,
            "model_path": str(model_path),
            "model_sha256": sha256_file(model_path),
            "checkpoint_dir": str(job_env.checkpoint_dir()),
        }
    )
    if tracker is not None:
        name = f"model-{wandb_artifacts.fingerprint16(job_env.job_name()) or version[:16]}"
        payload = {"model_config": config, "step": summary["steps"]}
        tracker.log_artifact(wandb_artifacts.model_artifact(name, model_path, payload, version))
        summary["wandb"]["model_artifact"] = name  # the evaluation uses it by this name
    summary_path = model_path.with_name(SUMMARY_FILE)
    write_bytes_atomic(summary_path, json.dumps(summary, indent=2).encode())
    # Written last: what proves the model folder complete (see zero_assets/core/output_marker.py).
    write_output_manifest(model_path.parent, [model_path.name, summary_path.name], format="zero-model/1")
