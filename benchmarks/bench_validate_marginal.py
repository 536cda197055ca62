"""`validate_marginal`: the validation job's cost per image against a plain Pool(2) doing the same strict decode.

Each cost is the slope between runs on 10,000 and 30,000 small JPEGs, so start-up drops out (printed, no goal).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from training_code.lib.raw_index import write_source_index

from .report import BenchResult
from .scripts import run_script
from .small_images import small_source

SIZES, WORKERS, RUNS, SOURCE = (10_000, 30_000), 2, 3, "cam"


def timed(command: list[str]) -> tuple[float, str]:
    started = time.perf_counter()
    stdout = run_script(command, " ".join(command))
    return time.perf_counter() - started, stdout


class Pair:
    """The project's and the baseline's commands on one source of `images` small JPEGs."""

    def __init__(self, images: int, work: Path) -> None:
        raw, _ = small_source(SOURCE, images)
        write_source_index(str(raw), SOURCE, work / "index")  # what raw_image_index writes
        self.images, self.out = images, work / "validated"
        self.job = [sys.executable, "-m", "training_code.validate", "--index", str(work / "index")]
        self.job += ["--raw", str(raw), "--out", str(self.out), "--workers", str(WORKERS)]
        self.plain = [sys.executable, "-m", "benchmarks.plain_decode_pool", str(raw / SOURCE), str(WORKERS)]

    def project(self) -> float:
        shutil.rmtree(self.out, ignore_errors=True)
        elapsed, _ = timed(self.job)
        accepted = json.loads((self.out / "manifest.json").read_text())["counts"]["accepted"]
        if accepted != self.images:
            raise RuntimeError(f"the validation job accepted {accepted} of {self.images} intact JPEGs")
        return elapsed

    def baseline(self) -> float:
        elapsed, stdout = timed(self.plain)
        if json.loads(stdout) != {"files": self.images, "ok": self.images}:
            raise RuntimeError(f"the plain pool judged: {stdout}")
        return elapsed


def run() -> list[BenchResult]:
    with tempfile.TemporaryDirectory(prefix="bench-validate-marginal-") as tmp:
        pairs = [Pair(images, Path(tmp) / str(images)) for images in SIZES]
        # Every round runs all four, so a drift in the host's speed falls on both sizes alike.
        rounds = [[(pair.project(), pair.baseline()) for pair in pairs] for _ in range(RUNS + 1)][1:]
    seconds = {
        pair.images: (min(r[n][0] for r in rounds), min(r[n][1] for r in rounds)) for n, pair in enumerate(pairs)
    }
    (few, many), span = SIZES, SIZES[1] - SIZES[0]
    project_per_image = (seconds[many][0] - seconds[few][0]) / span
    baseline_per_image = (seconds[many][1] - seconds[few][1]) / span
    return [
        BenchResult(
            "validate_marginal",
            baseline_per_image / project_per_image,
            ">=0.8",
            {
                "project_ms_per_image": 1000 * project_per_image,
                "baseline_ms_per_image": 1000 * baseline_per_image,
                "project_fixed_s": seconds[few][0] - few * project_per_image,
                "baseline_fixed_s": seconds[few][1] - few * baseline_per_image,
                **{f"project_{n}_s": seconds[n][0] for n in SIZES},
                **{f"baseline_{n}_s": seconds[n][1] for n in SIZES},
            },
        )
    ]
