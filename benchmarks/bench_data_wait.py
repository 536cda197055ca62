"""`data_wait`: the fraction of training step time spent waiting for the next batch, in a demo-like run.

Renders demo scenes into shards, trains fcos_tiny under `torchrun` with 2 processes and the demo's
settings (the `trained_checkpoint` defaults) for 100 steps, and reads `data_wait_fraction` from
`training_summary.json` (mean over ranks). Goal: <= 0.1.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from benchmarks.report import BenchResult
from benchmarks.scene_shards import write_scene_shards
from benchmarks.scripts import REPO, run_script
from training_code.train import get_args_parser

PROCESSES = 2
STEPS = 100


def run() -> list[BenchResult]:
    with tempfile.TemporaryDirectory(prefix="bench-data-wait-") as folder:
        root = Path(folder)
        shards = write_scene_shards(root / "shards", {"train": 180}, seed=2)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DAGSTER_PIPES", "SM_", "ZERO_"))}
        env.update(
            {
                "SM_CHANNEL_TRAIN": str(shards),
                "SM_MODEL_DIR": str(root / "model"),
                "ZERO_OPT_ML": str(root / "opt_ml"),
                "ZERO_CHECKPOINT_DIR": str(root / "checkpoints"),
                "ZERO_JOB_NAME": "bench-data-wait",
                "PYTHONPATH": str(REPO),
            }
        )
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={PROCESSES}",
            "-m",
            "training_code.train",
            "--max-steps",
            str(STEPS),
            "--checkpoint-every",
            str(STEPS),
        ]
        run_script(command, "training for the data_wait benchmark", env=env, timeout=900)
        summary = json.loads((root / "model" / "training_summary.json").read_text())
    return [
        BenchResult(
            "data_wait",
            summary["data_wait_fraction"],
            "<=0.1",
            {
                "images_per_s": summary["images_per_s"],
                "steps": summary["steps"],
                "processes": PROCESSES,
                "workers_per_rank": get_args_parser().get_default("workers"),
                "wall_s": summary["wall_s"],
            },
        )
    ]
