"""`validate_same_work`: validated_images's job on 20,000 small JPEGs against a plain 2-process pool
doing the same strict decode (goal >= 0.7).

ratio = baseline seconds / project seconds. Both are fresh processes timed from launch to exit, so
interpreter start, imports and pool start-up are inside both clocks: the project is the validation
job exactly as the local backend launches it (`python -m training_code.validate` on the source's
`raw_image_index` output, 2 workers), the baseline `benchmarks/plain_decode_pool.py` (list the
folder, `multiprocessing.Pool(2).map`, per file the strict libjpeg-turbo decode the validator uses).
The project does more per run than the baseline: it checks each read against the index, reads the
labels, hashes, orients, splits and writes its tables; the ratio says what that, and its isolation
(a time limit per file, a hang or crash costing one verdict), cost on small files, where the decode
is about 0.5 ms. Runs interleave (project, baseline, ...) and the best of each counts.

`pandera_import_s` is what the project pays that the baseline never does, apart from any work: a fresh
interpreter importing `pandera.pandas` (and with it pandas), which the job needs to check every table
it reads and writes against its pandera schema (design.md). Timed in the same rounds, best of them.
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

IMAGES, WORKERS, RUNS, SOURCE = 20_000, 2, 2, "cam"


def timed(command: list[str]) -> tuple[float, str]:
    started = time.perf_counter()
    stdout = run_script(command, " ".join(command))
    return time.perf_counter() - started, stdout


def run() -> list[BenchResult]:
    with tempfile.TemporaryDirectory(prefix="bench-same-work-") as tmp:
        work = Path(tmp)
        raw, written = small_source(SOURCE, IMAGES)
        write_source_index(str(raw), SOURCE, work / "index")  # what raw_image_index writes
        out = work / "validated"
        job = [sys.executable, "-m", "training_code.validate", "--index", str(work / "index")]
        job += ["--raw", str(raw), "--out", str(out), "--workers", str(WORKERS)]
        plain = [sys.executable, "-m", "benchmarks.plain_decode_pool", str(raw / SOURCE), str(WORKERS)]
        pandera_import = [sys.executable, "-c", "import pandera.pandas"]

        def project() -> float:
            shutil.rmtree(out, ignore_errors=True)
            elapsed, _ = timed(job)
            accepted = json.loads((out / "manifest.json").read_text())["counts"]["accepted"]
            if accepted != IMAGES:
                raise RuntimeError(f"the validation job accepted {accepted} of {IMAGES} intact JPEGs")
            return elapsed

        def baseline() -> float:
            elapsed, stdout = timed(plain)
            if json.loads(stdout) != {"files": IMAGES, "ok": IMAGES}:
                raise RuntimeError(f"the plain pool judged: {stdout}")
            return elapsed

        project_s, baseline_s, import_s = [], [], []
        for _ in range(RUNS + 1):  # the first round warms the page cache and is not counted
            project_s.append(project())
            baseline_s.append(baseline())
            import_s.append(timed(pandera_import)[0])
    best_project, best_baseline = min(project_s[1:]), min(baseline_s[1:])
    return [
        BenchResult(
            "validate_same_work",
            best_baseline / best_project,
            ">=0.7",
            {
                "baseline_s": best_baseline,
                "project_s": best_project,
                "images": IMAGES,
                "MB": sum(size for _, size in written) / 1e6,
                "workers": WORKERS,
                "project_ms_per_image": 1000 * best_project / IMAGES,
                "pandera_import_s": min(import_s[1:]),
            },
        )
    ]
