"""python -m training_code.warm --batch-files 64 [--training-set _training_sets/<key>]
(SageMaker Training job; FSx for Lustre mounted as channel `shards`)

Load a shard set's file contents from S3 into FSx for Lustre ahead of training and prove each shard
is complete. With `--training-set`, the channel is the shard root and every listed shard of every
source of the training set in that folder is loaded and verified. The file system already lists
the files (the data repository association imported their metadata); `lfs hsm_restore` asks Lustre
to fetch the contents of a batch of files in parallel, then every shard is verified against the
manifest (size, sha256, rows), which also reads any file whose restore had not finished. Reports
through Dagster Pipes.

There is no temporary name to fetch to here, as the local warm has: on Lustre a shard's name exists
before its bytes, and a restore fills the file in place with its lake object's bytes, exactly. So a
shard that fails verification is damaged in the lake itself, or was written on the file system after
its restore (`dirty`). The job then fails, naming every such shard and which of the two it is, and
vouches for none of them. A clean one is released (`lfs hsm_release`): the file system keeps no loaded
copy of bytes that did not verify, and any later read fetches the lake's object again (once the shard
set is rebuilt there, the rebuilt bytes). It is not deleted: an import task brings back only objects
changed in the lake since the last import, so a deleted name could stay missing. A dirty one cannot be
released (Lustre will not drop changes the lake does not have): it is named, with the lake object to
copy back over it.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import subprocess
import time
from pathlib import Path

from training_code.lib import job_env
from training_code.lib import training_set as ts
from training_code.lib.hashing import sha256_bytes
from training_code.lib.shard_format import MANIFEST, ShardIntegrityError, verify_shard

log = logging.getLogger("zero.warm")


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Load and verify a shard set on FSx for Lustre")
    parser.add_argument("--batch-files", type=int, default=64, help="files per `lfs hsm_restore` call")
    parser.add_argument(
        "--training-set", default=None, help="the training set's folder inside the channel (the shard root)"
    )
    parser.add_argument(
        "--restore-timeout-s", type=float, default=3 * 3600, help="give up waiting for restores after this"
    )
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
            raise TimeoutError(
                f"{released} of {len(paths)} shards still released after {timeout_s:.0f}s of hsm_restore"
            )
        log.info("%d of %d shards still loading", released, len(paths))
        time.sleep(10)


def listed_shards(root: Path, training_set: str | None) -> tuple[bytes, list[tuple[Path, dict]]]:
    """The manifest's bytes and (folder, entry) of every shard it lists: a shard set's at the channel
    root, or every source's of the training set in `training_set` (source folders relative to the root)."""
    if training_set is None:
        manifest_bytes = (root / MANIFEST).read_bytes()
        return manifest_bytes, [(root, entry) for entry in json.loads(manifest_bytes)["shards"]]
    folder = root / training_set
    manifest_bytes = (folder / ts.MANIFEST).read_bytes()
    manifest = json.loads(manifest_bytes)
    if manifest.get("format") != ts.FORMAT:
        raise ValueError(
            f"{folder / ts.MANIFEST} is not a training-set manifest ({ts.FORMAT}); warm the training set again"
        )
    ts.excluded_keys(folder)  # the excluded rows are there and readable, or this job fails
    return manifest_bytes, [
        (root / source["folder"], entry) for source in manifest["sources"] for entry in source["shards"]
    ]


def damaged_shards(located: list[tuple[Path, dict]]) -> list[tuple[Path, ShardIntegrityError]]:
    """(path, what is wrong) of every listed shard that does not match its manifest entry."""
    damaged = []
    for folder, entry in located:
        try:
            verify_shard(folder, entry)
        except ShardIntegrityError as error:
            damaged.append((folder / entry["file"], error))
    return damaged


def release_damaged(path: Path, lake_key: str) -> str:
    """Drop the file system's copy of a damaged shard when it holds its lake object's bytes (see the
    module docstring); returns what became of it, in words. `lake_key`: its object below the lake."""
    lfs = shutil.which("lfs")
    if not path.is_file():
        return "not on the file system: its metadata was not imported from the lake"
    if lfs is None:
        return "left as read: `lfs` is not in this image, so its copy cannot be released"
    state = subprocess.run([lfs, "hsm_state", str(path)], check=True, capture_output=True, text=True).stdout
    if "dirty" in state:
        return (
            "written on the file system after its restore (hsm state dirty), so Lustre keeps it: the lake's object "
            f"<lake>/{lake_key} may be intact; copy it back over this file, then warm again"
        )
    released = subprocess.run([lfs, "hsm_release", str(path)], capture_output=True, text=True)
    if released.returncode != 0:
        return f"not released ({released.stderr.strip() or f'lfs hsm_release exit {released.returncode}'})"
    return "released: these are its lake object's bytes, so the shard is damaged in the lake"


def fail_on_damaged(root: Path, located: list[tuple[Path, dict]]) -> None:
    """Raise `ShardIntegrityError` naming every damaged shard and what became of it, if there is one."""
    damaged = damaged_shards(located)
    if not damaged:
        return
    described = [
        f"{error} -> {release_damaged(path, f'arrow_shards/{path.relative_to(root)}')}" for path, error in damaged
    ]
    folders = sorted({f"arrow_shards/{path.parent.relative_to(root)}" for path, _ in damaged})
    raise ShardIntegrityError(
        f"{len(damaged)} of {len(located)} shards under {root} do not match their manifest, and this warm vouches "
        f"for none of them: {'; '.join(described[:10])}{' ...' if len(described) > 10 else ''}. Rebuild the shard "
        f"sets where they are damaged in the lake (delete {', '.join(folders)} there and "
        "rematerialize arrow_shards for the source), then warm again"
    )


def main(args: argparse.Namespace) -> None:
    with job_env.pipes_session() as pipes:
        root = job_env.channel_dir("shards")
        manifest_bytes, located = listed_shards(root, args.training_set)
        started = time.perf_counter()
        restore_in_batches([str(folder / e["file"]) for folder, e in located], args.batch_files, args.restore_timeout_s)
        restored_s = time.perf_counter() - started
        fail_on_damaged(root, located)
        log.info("%d shards loaded and verified under %s", len(located), root)
        # The bytes the trainer reads here: every shard, the manifest and (a training set's) excluded rows.
        excluded = root / args.training_set / ts.EXCLUDED if args.training_set else None
        pipes.report_asset_materialization(
            metadata={
                "dagster/row_count": sum(e["rows"] for _, e in located),
                "dagster/size_bytes": sum(e["bytes"] for _, e in located)
                + len(manifest_bytes)
                + (excluded.stat().st_size if excluded else 0),
                "shards": len(located),
                "restore_s": round(restored_s, 1),
                "verify_s": round(time.perf_counter() - started - restored_s, 1),
                "verified": "size, sha256 and row count of every shard, read from the file system",
            },
            data_version=sha256_bytes(manifest_bytes),
        )


if __name__ == "__main__":
    main(get_args_parser().parse_args())
