"""SageMaker Training job: load a shard set from S3 into FSx for Lustre and prove each shard complete.

FSx is mounted as channel `shards`; with `--training-set` the set's manifest is in that folder of it.
Shards with a holding verdict (lib/warm_verdicts) are not read again; the others are `lfs hsm_restore`d
and verified (size, sha256, rows). Any damaged shard fails the job, naming each; reports through Pipes.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import subprocess
import time
from pathlib import Path

from training_code.lib import job_env, warm_verdicts
from training_code.lib.hashing import sha256_bytes
from training_code.lib.shard_format import MASKED, ShardIntegrityError, masked_keys, read_manifest, shard_path

log = logging.getLogger("zero.warm")


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Load and verify a shard set on FSx for Lustre")
    add = parser.add_argument
    add("--batch-files", type=int, default=64, help="files per `lfs hsm_restore` call")
    add("--training-set", help="the training set's folder inside the channel (the shard root)")
    add("--restore-timeout-s", type=float, default=3 * 3600, help="give up waiting for restores after this")
    return parser


def restore_in_batches(paths: list[str], batch_files: int, timeout_s: float) -> int:
    """Request restores, then wait until none of `paths` is still `released`; returns how many were asked."""
    lfs = shutil.which("lfs")
    if lfs is None:
        log.warning("`lfs` is not in this image: shards load lazily while they are verified")
        return 0
    for start in range(0, len(paths), batch_files):
        subprocess.run([lfs, "hsm_restore", *paths[start : start + batch_files]], check=True)
    deadline = time.monotonic() + timeout_s
    while paths:
        released = len(released_files(paths))
        if released == 0:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{released} of {len(paths)} shards still released after {timeout_s:.0f}s of hsm_restore"
            )
        log.info("%d of %d shards still loading", released, len(paths))
        time.sleep(10)
    return len(paths)


def released_files(paths: list[str]) -> list[str]:
    """Those of `paths` whose data Lustre holds no copy of (`lfs hsm_state`: released); none without lfs."""
    lfs = shutil.which("lfs")
    if lfs is None or not paths:
        return []
    states = subprocess.run([lfs, "hsm_state", *paths], check=True, capture_output=True, text=True).stdout
    return [line.split(":", 1)[0] for line in states.splitlines() if "released" in line]


def listed_shards(root: Path, training_set: str | None) -> tuple[bytes, list[tuple[Path, dict]], int]:
    """The manifest's bytes (of the set at the root, or in `training_set`), (path, entry) of every shard it lists
    resolved inside the channel root, and the bytes of the masked rows beside it."""
    folder = root / training_set if training_set else root
    manifest = read_manifest(folder)  # zero-shards/4, or an error naming the file
    masked_keys(folder, manifest)  # the masked rows are there and are the ones listed, or this job fails
    located = [(shard_path(folder, entry, root), entry) for entry in manifest["shards"]]
    beside = (folder / MASKED).stat().st_size if MASKED in manifest.get("files", {}) else 0
    return (folder / "manifest.json").read_bytes(), located, beside


def verify_unproven(located: list[tuple[Path, dict]]) -> list[tuple[Path, ShardIntegrityError]]:
    """Verify each (path, entry) in full and record its verdict; (path, error) of each that fails."""
    damaged = []
    for path, entry in located:
        try:
            warm_verdicts.verify_and_record(path, entry)
        except ShardIntegrityError as error:
            damaged.append((path, error))
    return damaged


def release_damaged(path: Path, lake_key: str) -> str:
    """Drop the file system's copy of a damaged shard (not deleted: an import brings back only objects changed
    in the lake) so a later read fetches its lake object `lake_key` again; what became of it, in words."""
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


def fail_on_damaged(root: Path, damaged: list[tuple[Path, ShardIntegrityError]], checked: int) -> None:
    """Raise `ShardIntegrityError` naming every damaged shard and what became of it, if there is one."""
    if not damaged:
        return
    described = [
        f"{error} -> {release_damaged(path, f'arrow_shards/{path.relative_to(root)}')}" for path, error in damaged
    ]
    folders = sorted({f"arrow_shards/{path.parent.relative_to(root)}" for path, _ in damaged})
    raise ShardIntegrityError(
        f"{len(damaged)} of {checked} shards under {root} do not match their manifest, and this warm vouches "
        f"for none of them: {'; '.join(described[:10])}{' ...' if len(described) > 10 else ''}. Rebuild the shard "
        f"sets where they are damaged in the lake (delete {', '.join(folders)} there and "
        "rematerialize arrow_shards), then warm again"
    )


def main(args: argparse.Namespace) -> None:
    with job_env.pipes_session() as pipes:
        root = job_env.channel_dir("shards")
        manifest_bytes, located, beside = listed_shards(root, args.training_set)
        holds = [warm_verdicts.verdict_holds(path, entry) for path, entry in located]  # one stat each
        # A proven shard Lustre released since (dropped for space) is rewritten by its restore: verify it again.
        released = set(released_files([str(path) for (path, _), held in zip(located, holds) if held]))
        proven = [shard for shard, held in zip(located, holds) if held and str(shard[0]) not in released]
        pending = [shard for shard, held in zip(located, holds) if not held or str(shard[0]) in released]
        started = time.perf_counter()
        restore_in_batches([str(path) for path, _ in pending], args.batch_files, args.restore_timeout_s)
        restored_s = time.perf_counter() - started
        fail_on_damaged(root, verify_unproven(pending), len(located))
        for path, _ in proven:
            warm_verdicts.note_reuse(path)
        log.info("%d shards verified, %d on their recorded verdict, under %s", len(pending), len(proven), root)
        pipes.report_asset_materialization(
            metadata={
                "dagster/row_count": sum(e["rows"] for _, e in located),
                # The bytes the trainer reads here: every shard, the manifest and the masked rows.
                "dagster/size_bytes": sum(e["bytes"] for _, e in located) + len(manifest_bytes) + beside,
                "shards": len(located),
                "verified": len(pending),
                "verified_bytes": sum(e["bytes"] for _, e in pending),
                "reused_verdicts": len(proven),
                "restored_again": len(released),
                "restore_s": round(restored_s, 1),
                "verify_s": round(time.perf_counter() - started - restored_s, 1),
                "verified_by": "size, sha256 and rows of every shard without a holding verdict, on the file system",
            },
            data_version=sha256_bytes(manifest_bytes),
        )


if __name__ == "__main__":
    main(get_args_parser().parse_args())
