"""python -m training_code.warm --batch-files 64   (SageMaker Training job; FSx for Lustre mounted as channel `shards`)

Load a shard set's file contents from S3 into FSx for Lustre ahead of training and prove each shard
is complete. The file system already lists the files (the data repository association imported
their metadata); `lfs hsm_restore` asks Lustre to fetch the contents of a batch of files in
parallel, then every shard is verified against the manifest (size, sha256, rows), which also reads
any file whose restore had not finished. Reports through Dagster Pipes.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import subprocess
import time

from training_code.lib import job_env
from training_code.lib.hashing import sha256_bytes
from training_code.lib.shard_format import MANIFEST, verify_shard

log = logging.getLogger("zero.warm")


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Load and verify a shard set on FSx for Lustre")
    parser.add_argument("--batch-files", type=int, default=64, help="files per `lfs hsm_restore` call")
    parser.add_argument("--restore-timeout-s", type=float, default=3 * 3600, help="give up waiting for restores after this")
    return parser


def restore_in_batches(paths: list[str], batch_files: int, timeout_s: float) -> int:
    """Request restores, then wait until no file is still `released`; returns how many were released."""
    lfs = shutil.which("lfs")
    if lfs is None:
        log.warning("`lfs` is not in this image: shards load lazily while they are verified")
        return 0
    for start in range(0, len(paths), batch_files):
        subprocess.run([lfs, "hsm_restore", *paths[start : start + batch_files]], check=True)
    deadline = time.monotonic() + timeout_s
    while True:
        states = subprocess.run([lfs, "hsm_state", *paths], check=True, capture_output=True, text=True).stdout
        released = sum("released" in line for line in states.splitlines())
        if released == 0:
            return len(paths)
        if time.monotonic() > deadline:
            raise TimeoutError(f"{released} of {len(paths)} shards still released after {timeout_s:.0f}s of hsm_restore")
        log.info("%d of %d shards still loading", released, len(paths))
        time.sleep(10)


def main(args: argparse.Namespace) -> None:
    with job_env.pipes_session() as pipes:
        root = job_env.channel_dir("shards")
        manifest_bytes = (root / MANIFEST).read_bytes()
        entries = json.loads(manifest_bytes)["shards"]
        started = time.perf_counter()
        restore_in_batches([str(root / e["file"]) for e in entries], args.batch_files, args.restore_timeout_s)
        restored_s = time.perf_counter() - started
        for entry in entries:
            verify_shard(root, entry)
        log.info("%d shards loaded and verified under %s", len(entries), root)
        pipes.report_asset_materialization(
            metadata={
                "shards": len(entries),
                "bytes": sum(e["bytes"] for e in entries),
                "restore_s": round(restored_s, 1),
                "verify_s": round(time.perf_counter() - started - restored_s, 1),
                "verified": "size, sha256 and row count of every shard, read from the file system",
            },
            data_version=sha256_bytes(manifest_bytes),
        )


if __name__ == "__main__":
    main(get_args_parser().parse_args())
