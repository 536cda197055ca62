"""A job script for the fault tests: writes its output in stages and can stop at a chosen point.

python -m fault_job --out DIR [--kb 64]

(a Processing job; under torchrun as a Training job it writes SM_MODEL_DIR)

`ZERO_FAULT_PAUSE_AT=writing|manifest` makes it sleep there (after part of the output, or after the
manifest) once it has written its pid to `<opt_ml>/output/paused-<point>` (`-rank<N>` per rank
under torchrun), so a test can kill it at that point. It always writes the names of the environment
variables it sees to `<opt_ml>/output/environment.json`. Like every job script it never imports Dagster.
"""

import argparse
import json
import os
import time
from pathlib import Path

from training_code.lib import job_env
from training_code.lib.distributed import die_with_launcher
from training_code.lib.hashing import sha256_bytes
from training_code.lib.output_manifest import write_output_manifest
from training_code.lib.storage import write_bytes_atomic


def pause_if_asked(point: str) -> None:
    if os.environ.get("ZERO_FAULT_PAUSE_AT") != point:
        return
    rank = os.environ.get("RANK")
    marker = job_env.opt_ml() / "output" / (f"paused-{point}" + (f"-rank{rank}" if rank is not None else ""))
    marker.write_text(str(os.getpid()))
    time.sleep(600)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path)
    parser.add_argument("--kb", type=int, default=64)
    args = parser.parse_args()
    die_with_launcher()  # as distributed_session does for every torchrun worker
    out = args.out or job_env.model_dir()
    with job_env.pipes_session() as pipes:
        (job_env.opt_ml() / "output").mkdir(parents=True, exist_ok=True)
        if job_env.is_rank_zero():
            (job_env.opt_ml() / "output" / "environment.json").write_text(json.dumps(sorted(os.environ)))
        payload = bytes(range(256)) * (args.kb * 4)
        if job_env.is_rank_zero():
            write_bytes_atomic(out / "part-0.bin", payload)
        pause_if_asked("writing")
        if not job_env.is_rank_zero():
            pause_if_asked("manifest")
            return
        write_bytes_atomic(out / "part-1.bin", payload[::-1])
        table = json.dumps({"rows": args.kb}).encode()
        write_bytes_atomic(out / "table.json", table)
        manifest = write_output_manifest(out, ["part-0.bin", "part-1.bin", "table.json"], format="zero-fault/1")
        pause_if_asked("manifest")
        pipes.report_asset_materialization(metadata={"kb": args.kb}, data_version=sha256_bytes(manifest))


if __name__ == "__main__":
    main()
