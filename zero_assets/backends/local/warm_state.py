"""Make an `arrow_shards` shard set warm in the folder standing in for FSx, copying only what is not there.

Layout: `<mount>/shards/<name>` (flat, content-addressed, verdicts in `.verified/`) and `<mount>/sets/<key>/`
(the set's manifest, written last, its shard paths rewritten to `../../shards/<name>`).
"""

from __future__ import annotations

import json
import secrets
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from training_code.lib import relative_paths, warm_verdicts
from training_code.lib.hashing import sha256_bytes
from training_code.lib.shard_format import FORMAT, MANIFEST, MASKED, SHARDS, ShardIntegrityError, verify_shard_file
from training_code.lib.storage import fetch_file, is_s3, join, read_bytes, write_bytes_atomic
from zero_assets.backends.job_runner import WarmedShards

SETS = "sets"  # beside SHARDS, the mount's flat folder of every warm shard
# What a warm set holds beside its manifest: only what the trainer reads.
SET_FILES = (MASKED,)


@dataclass
class WarmResult:
    path: Path  # the set's folder: what training reads
    shards: int
    rows: int
    bytes: int  # what the trainer reads there, manifest included
    copied: int  # shards fetched from the lake this time
    copied_bytes: int
    already_warm: int  # shards found on the mount intact and left as they were
    verified: int  # shards whose bytes were read this time
    verified_bytes: int
    reused_verdicts: int  # shards trusted on a verdict for their unchanged file: not read

    def summary(self) -> str:
        return (
            f"{self.copied} shards copied ({self.copied_bytes:,} bytes), {self.already_warm} already warm "
            f"({self.reused_verdicts} on their recorded verdict, not read), {self.verified} verified "
            f"({self.verified_bytes:,} bytes read)"
        )

    def as_warmed_shards(self, mount: Path) -> WarmedShards:
        """This result as the runner's `WarmedShards`, the mount among its paths (gc reads it there)."""
        counts = {name: value for name, value in asdict(self).items() if name != "path"}
        verified_by = "size, sha256 and row count of every shard copied or without a holding verdict"
        details = {"verified_by": verified_by, "backend": "local"}
        return WarmedShards(location=str(self.path), **counts, paths={"warm_mount": str(mount)}, details=details)


def set_folder(mount: Path, data_version: str) -> Path:
    """`<mount>/sets/<data version[:16]>`: where the shard set of that arrow_shards data version is warm."""
    return mount / SETS / data_version[:16]


def set_channel(uri: str, mount: Path) -> tuple[Path, str] | None:
    """(the mount, `sets/<key>`) when `uri` is a set's folder on `mount` (the channel is the whole mount)."""
    if "://" in uri:
        return None
    folder, root = Path(uri).resolve(), mount.resolve()
    return (root, f"{SETS}/{folder.name}") if folder.parent == root / SETS else None


def warm_shard_set(shards_uri: str, mount: Path, key: str) -> WarmResult:
    """Warm the set at `shards_uri` into `mount/sets/key`, reading only shards without a holding verdict."""
    manifest_bytes = read_bytes(join(shards_uri, MANIFEST))
    manifest = json.loads(manifest_bytes)
    if manifest.get("format") != FORMAT:
        raise ValueError(
            f"{join(shards_uri, MANIFEST)}: format {manifest.get('format')!r}, the warm step reads {FORMAT!r}; "
            "rematerialize arrow_shards"
        )
    names = mount_names(manifest["shards"], join(shards_uri, MANIFEST))
    listed = manifest.get("files", {})
    files = {name: verified_file(shards_uri, name, listed[name]) for name in listed if name in SET_FILES}
    target, warm = mount / SETS / key, mount / SHARDS
    warm.mkdir(parents=True, exist_ok=True)
    result = WarmResult(target, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    for entry, name in zip(manifest["shards"], names):
        warm_shard(shard_source(shards_uri, entry["path"]), entry, warm / name, target / MANIFEST, result)
        result.shards += 1
        result.rows += entry["rows"]
        result.bytes += entry["bytes"]
    for name, data in files.items():
        write_bytes_atomic(target / name, data)
        result.bytes += len(data)
    rewritten = {
        **manifest,
        "shards": [{**entry, "path": f"../../{SHARDS}/{name}"} for entry, name in zip(manifest["shards"], names)],
        "files": {name: listed[name] for name in files},  # what the set's folder holds beside the manifest
    }
    data = json.dumps(rewritten, indent=1, sort_keys=True).encode()
    write_bytes_atomic(target / MANIFEST, data)
    result.bytes += len(data)
    return result


def warm_shard(source: str, entry: dict[str, Any], dest: Path, set_manifest: Path, result: WarmResult) -> None:
    """Warm one shard: reused on its verdict, else verified in place, else fetched."""
    if warm_verdicts.verdict_holds(dest, entry):
        warm_verdicts.note_reuse(dest)
        result.reused_verdicts += 1
        result.already_warm += 1
        return
    if dest.is_file():
        try:
            warm_verdicts.verify_and_record(dest, entry)
            result.verified += 1
            result.verified_bytes += entry["bytes"]
            result.already_warm += 1
            return
        except ShardIntegrityError:  # damaged on the mount: fetched again below
            result.verified_bytes += entry["bytes"]
    set_manifest.unlink(missing_ok=True)  # the mount changes: nothing may vouch for this set meanwhile
    warm_verdicts.forget_verdict(dest)
    dest.unlink(missing_ok=True)
    fetch_verified(source, entry, dest)
    result.copied += 1
    result.copied_bytes += entry["bytes"]
    result.verified += 1
    result.verified_bytes += entry["bytes"]


def fetch_verified(source: str, entry: dict[str, Any], dest: Path) -> None:
    """Fetch, verify, rename to `dest` and record its verdict; on any failure nothing is left there."""
    fetched = dest.parent / f".{dest.name}.{secrets.token_hex(8)}.tmp"
    try:
        fetch_file(source, fetched)
        verify_shard_file(fetched, entry)
        fetched.replace(dest)
        warm_verdicts.record_verdict(dest, entry)  # the bytes verified are this inode's: no second read
    except ShardIntegrityError as error:
        raise ShardIntegrityError(
            f"{source}, shard {entry['path']} in the lake, does not match its manifest ({error}); nothing of it was "
            f"left on the mount under {dest.parent}. The shard set is damaged where it was built: delete the "
            "arrow_shards folder holding it and rematerialize arrow_shards (a miss that rebuilds it), then "
            "fsx_warm_state"
        ) from error
    finally:
        fetched.unlink(missing_ok=True)


def mount_names(entries: list[dict[str, Any]], where: str) -> list[str]:
    """Each shard's file name in the flat folder; must be content-addressed and unique in the set."""
    names = []
    for entry in entries:
        name = PurePosixPath(entry["path"]).name
        if not name.endswith(f"-{entry['sha256'][:16]}.arrow"):
            raise ValueError(
                f"{where}: shard {entry['path']!r} is not named by its content (`<split>-<sha256[:16]>.arrow`, "
                f"sha256 {entry['sha256']}); the flat warm folder needs content-addressed names: rematerialize "
                "arrow_shards"
            )
        names.append(name)
    if len(set(names)) != len(names):
        twice = sorted({name for name in names if names.count(name) > 1})
        raise ValueError(f"{where}: shards {twice} are listed more than once; rematerialize arrow_shards")
    return names


def shard_source(shards_uri: str, path: str) -> str:
    """Where the shard listed as `path` is in the lake (relative to the manifest, never outside the asset)."""
    folder = shards_uri.rstrip("/")
    asset_folder = folder.rpartition("/")[0] if is_s3(folder) else str(Path(folder).parent)
    try:
        return relative_paths.resolve(folder, path, root=asset_folder)
    except ValueError as error:
        raise ValueError(
            f"{join(shards_uri, MANIFEST)}: shard path {path!r} leaves the arrow_shards folder ({error}); "
            "rematerialize arrow_shards"
        ) from error


def verified_file(shards_uri: str, name: str, facts: dict[str, Any]) -> bytes:
    """The bytes of a file the manifest lists beside the shards, checked against its size and sha256."""
    uri = join(shards_uri, name)
    data = read_bytes(uri)
    if len(data) != facts["bytes"] or sha256_bytes(data) != facts["sha256"]:
        raise ShardIntegrityError(
            f"{uri}: {len(data)} bytes, sha256 {sha256_bytes(data)}; {join(shards_uri, MANIFEST)} says "
            f"{facts['bytes']} and {facts['sha256']}. It changed after arrow_shards wrote it: rematerialize "
            "arrow_shards"
        )
    return data
