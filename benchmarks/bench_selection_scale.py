"""`selection_scale`: the selection job on 10,000,000 accepted rows in 100 sources, against 1,000,000.

One policy (`max_images` 400,000), DuckDB held to 1 GB on 2 threads: wall time and peak RSS ratios.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from training_code.lib.selection_plan import DEFAULT_POLICY, SelectionPlan, SelectionPolicy, write_plan

from .accepted_lake import accepted_lake
from .report import BenchResult
from .scripts import run_script

SMALL, LARGE, SOURCES, SELECTED = 1_000_000, 10_000_000, 100, 400_000
MEMORY_LIMIT_GB = 1


def job_run(rows: int) -> tuple[float, int]:
    """(wall seconds, peak RSS bytes) of the selection job over `rows` accepted rows: the peak is the one the
    job reports of its own program (the rusage of a child would count the benchmark's pages it forked from)."""
    sources = accepted_lake(rows, SOURCES)
    with tempfile.TemporaryDirectory(prefix="zero-bench-scale-") as folder:
        work = Path(folder)
        policy = SelectionPolicy(max_images=SELECTED)
        write_plan(str(work / "plan"), SelectionPlan(sources, policy), DEFAULT_POLICY.read_text())
        command = [sys.executable, "-m", "training_code.selection", "--plan", str(work / "plan"), "--out"]
        command += [str(work / "out"), "--memory-limit-gb", str(MEMORY_LIMIT_GB), "--threads", "2"]
        started = time.perf_counter()
        printed = run_script(command, f"the selection job over {rows} rows", env={**os.environ, "ZERO_OPT_ML": folder})
        wall = time.perf_counter() - started
    report = next(json.loads(line) for line in printed.splitlines() if line.startswith('{"event": "materialization"'))
    return wall, int(report["metadata"]["peak_rss_mb"] * 2**20)


def run() -> list[BenchResult]:
    small_s, small_rss = job_run(SMALL)
    large_s, large_rss = job_run(LARGE)
    details = {"small_s": small_s, "large_s": large_s, "us_per_row_large": large_s * 1e6 / LARGE}
    return [
        BenchResult("selection_scale", large_s / small_s, "<=12", details),
        BenchResult(
            "selection_scale_memory",
            large_rss / small_rss,
            "<=1.5",
            {"small_rss_mb": small_rss / 2**20, "large_rss_mb": large_rss / 2**20, "memory_limit_gb": MEMORY_LIMIT_GB},
        ),
    ]
