"""W&B lineage of a job: a run id that follows its fingerprint (`zero-<label>-<fingerprint16>-a<attempt>`
logs into run `<name less attempt>`), the shard set it read (`shards-<sha256(manifest)[:16]>`, references)
and the model it wrote (`model-<fingerprint16>`, a checksummed reference to `model.pt`)."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

from training_code.lib import shard_format

GRAPH_JOB_NAME = re.compile(r"^(?P<run>.+-(?P<fingerprint>[0-9a-f]{16}))-a\d+$")


def run_id(job_name: str) -> str | None:
    """The W&B run id of the graph job `job_name`: its name less the attempt; None for another name."""
    found = GRAPH_JOB_NAME.match(job_name)
    return found.group("run") if found else None


def fingerprint16(job_name: str) -> str | None:
    """The input fingerprint's first 16 hex digits in a graph job's name, else None."""
    found = GRAPH_JOB_NAME.match(job_name)
    return found.group("fingerprint") if found else None


def use(run, artifact) -> None:
    """Declare `artifact` an input of `run` (offline, as the record `wandb sync` turns into the use)."""
    if run.offline:
        run._log_artifact(artifact, is_user_created=True, use_after_commit=True)
    else:
        run.use_artifact(artifact)


def _uri(path: Path) -> str:
    return Path(os.path.realpath(path)).as_uri()  # through the channel's links: one pointer per file


def _reference(path: Path, channel: Path, source: str | None) -> str:
    """Where `path` below the input folder `channel` lies for a reader: under `source`, else file://."""
    if source and source.startswith(("s3://", "fsx://")):
        return f"{source.rstrip('/')}/{path.relative_to(channel).as_posix()}"
    return _uri(path)


def shard_set_artifact(folder: Path, training_set_dir: str | None = None, source: str | None = None):
    """The shard set at `folder` (or its `training_set_dir`) as a reference artifact."""
    import wandb

    channel = Path(folder)
    folder, root = shard_format.set_in_channel(channel, training_set_dir)
    manifest = shard_format.read_manifest(folder)
    manifest_bytes = (Path(folder) / shard_format.MANIFEST).read_bytes()
    splits = sorted({entry["split"] for entry in manifest["shards"]})
    artifact = wandb.Artifact(
        f"shards-{hashlib.sha256(manifest_bytes).hexdigest()[:16]}",
        type="dataset",
        description=f"a {manifest['format']} shard set: pointers to its files (W&B holds no copy)",
        metadata={
            "format": manifest["format"],
            "manifest_sha256": hashlib.sha256(manifest_bytes).hexdigest(),
            "categories": [category["name"] for category in manifest["categories"]],
            "shards": {split: len(shard_format.shards_for_split(manifest, split)) for split in splits},
            "rows": {split: sum(e["rows"] for e in shard_format.shards_for_split(manifest, split)) for split in splits},
        },
    )
    local = not (source or "").startswith(("s3://", "fsx://"))  # a remote file's checksum would be a GET
    for name in [shard_format.MANIFEST, shard_format.MASKED]:
        if name == shard_format.MANIFEST or name in manifest.get("files", {}):
            artifact.add_reference(_reference(Path(folder) / name, channel, source), name=name, checksum=local)
    for entry in manifest["shards"]:
        path = shard_format.shard_path(folder, entry, root)
        artifact.add_reference(_reference(path, channel, source), name=f"shards/{path.name}", checksum=False)
    return artifact


def model_artifact(name: str, model_path: Path, payload: dict[str, Any], data_version: str):
    """`model.pt` at `model_path` as the model artifact `name`, built alike by training and evaluation."""
    import wandb

    config = payload["model_config"]
    artifact = wandb.Artifact(
        name,
        type="model",
        description="model.pt of a trained_checkpoint: a pointer with its checksum (W&B holds no copy)",
        metadata={
            "data_version": data_version,
            "step": int(payload["step"]),
            "arch": config["arch"],
            "categories": [category["name"] for category in config["categories"]],
        },
    )
    artifact.add_reference(_uri(model_path), name=model_path.name)
    return artifact
