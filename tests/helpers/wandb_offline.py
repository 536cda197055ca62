"""Offline W&B runs read back from wandb's own `.wandb` transaction log (wandb 0.31 ships no Python
reader for it): a 7-byte header (`:W&B`, magic 0xBEE1, version), then LevelDB-log style chunks in
32 KiB blocks (crc32 4 bytes, length 2 bytes, type 1 byte: full, first, middle, last), each record a
`wandb_internal_pb2.Record`. A log cut short (its job killed) ends at its last whole record.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from wandb.proto import wandb_internal_pb2

BLOCK = 32 * 1024


def wandb_records(path: Path):
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    position, pending = 7, b""
    while position + 7 <= len(data):
        if BLOCK - position % BLOCK < 7:  # a block's tail too short for a chunk header is padding
            position += BLOCK - position % BLOCK
            continue
        length, kind = struct.unpack("<HB", data[position + 4 : position + 7])
        if kind == 0 or position + 7 + length > len(data):  # zeros past the end, or a chunk cut short
            return
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # full, last
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def offline_run(folder: Path) -> dict:
    """One offline run folder: its run record's id, group, job type and project, the last value of every
    history and summary key, and the artifacts it used and logged ({name: digest})."""
    found = {"folder": folder, "history": {}, "summary": {}, "used": {}, "logged": {}, "artifacts": {}}
    for record in wandb_records(next(folder.glob("run-*.wandb"))):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            found.update(
                run_id=record.run.run_id,
                group=record.run.run_group,
                job_type=record.run.job_type,
                project=record.run.project,
            )
        elif kind in ("history", "summary"):
            items = record.history.item if kind == "history" else record.summary.update
            found[kind].update({item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items})
        elif kind == "artifact":
            artifact = record.artifact
            found["used" if artifact.use_after_commit else "logged"][artifact.name] = artifact.digest
            found["artifacts"][artifact.name] = artifact
    return found


def offline_runs(root: Path) -> list[dict]:
    """Every offline run under `root`, oldest first (W&B names the folders by their start time)."""
    folders = sorted(root.rglob("offline-run-*"), key=lambda folder: folder.name)
    return [offline_run(folder) for folder in folders if folder.is_dir()]
