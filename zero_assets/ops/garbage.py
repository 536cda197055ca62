"""`zero-assets gc`: the lake outputs and job folders that nothing the instance holds refers to.

Kept (referenced), by unit:
- an output `<asset>[/<source>]/<fingerprint16>/`: any stored materialization (not only the latest: the
  cache and lineage reuse older ones) names it by `dagster/uri` or `warm_s3_uri`, inside, at or above it;
- a run's job folder `_jobs/<asset>/<fingerprint16>/runs/<run id>/`: its run recorded a stored
  materialization or is live, or stored metadata points inside it;
- `_jobs/<asset>/<fingerprint16>/` (lease, checkpoints): its output is referenced, a stored
  materialization records that fingerprint, or one of its run folders is kept;
- `_jobs/<job name>/` (the layout before per-run folders): named by stored metadata or a live run's id;
- shard sets and the warm mount: see `garbage_shards`.
An s3:// lake's job folders are on this machine (`.zero/jobs`), judged the same. Unreferenced folders
written since the oldest live run started, or within the grace period, stay all the same. Nothing
outside the asset folders, the job folders and the warm mount's sets and shards is touched.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

from training_code.lib.storage import delete_file, delete_prefix, is_s3, join, list_objects, newest_write
from zero_assets.core.settings import JOBS_FOLDER
from zero_assets.ops.garbage_shards import (
    SHARD_ASSET,
    WARM_ASSET,
    WARM_MOUNT_KEY,
    Folder,
    Verdict,
    age,
    kept_for_their_shards,
    unit_of,
    unreferenced_on_mounts,
)

URI_KEYS = ("dagster/uri", "warm_s3_uri")
PAGE = 1000  # materializations fetched per query
# Runs that may still write: their folders are never collected.
LIVE_STATUSES = [
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
    DagsterRunStatus.CANCELING,
]
DEFAULT_GRACE_HOURS = 24.0


@dataclass
class References:
    """What the instance's stored materializations and live runs name."""

    paths: set[str]  # normalized uris and path metadata
    names: set[str]  # text metadata (job names)
    run_ids: dict[str, set[str]]  # asset -> the runs that recorded a stored materialization of it
    live_run_ids: set[str]
    oldest_live: tuple[float, str] | None  # (start in epoch seconds, run id) of the oldest run in progress
    warm_mounts: set[str] = field(default_factory=set)  # the local warm mounts fsx_warm_state recorded
    # asset -> the input fingerprints (first 16) its stored materializations record: an output's lease
    # folder is named by it, even where the output is not (the warm state's, on the mount)
    fingerprints: dict[str, set[str]] = field(default_factory=dict)

    def all_run_ids(self) -> set[str]:
        return set().union(*self.run_ids.values())

    def names_path(self, uri: str) -> bool:
        here = normalize(uri)
        return any(path == here or path.startswith(here + "/") or here.startswith(path + "/") for path in self.paths)

    def names_output(self, lake: str, asset: str, fingerprint16: str) -> bool:
        """Whether a stored materialization names `<asset>[/<source>]/<fingerprint16>`."""
        base = normalize(join(lake, asset)) + "/"
        for path in self.paths:
            if path.startswith(base) and fingerprint16 in path[len(base) :].split("/")[:2]:
                return True
        return self.names_path(join(lake, f"{asset}/{fingerprint16}"))

    def cutoff(self, grace_s: float) -> tuple[float, str]:
        """Folders written at or after this time may belong to a run still writing; and why."""
        graced = time.time() - grace_s
        if self.oldest_live is not None and self.oldest_live[0] < graced:
            return self.oldest_live[0], f"written since run {self.oldest_live[1]} (still in progress) started"
        return graced, f"written within the grace period ({grace_s / 3600:g} h)"


def lake_folders(lake: str, assets: Iterable[str], jobs_root: str | None = None) -> list[Folder]:
    """Every collectable unit, run folders first; `jobs_root`: job folders kept elsewhere."""
    assets = set(assets)
    roots = {"": lake}
    separate_jobs = jobs_root is not None and normalize(jobs_root) != normalize(join(lake, JOBS_FOLDER))
    units: dict[tuple[str, str], int] = defaultdict(int)  # (key, kind) -> bytes
    for key, size in _listed(lake):
        unit = unit_of(key, assets)
        if unit is not None and not (separate_jobs and unit[1] != "output"):
            units[unit] += size
    if separate_jobs:
        roots[JOBS_FOLDER] = jobs_root
        for key, size in _listed(jobs_root):
            unit = unit_of(f"{JOBS_FOLDER}/{key}", assets)
            if unit is not None:
                units[unit] += size
    for key, kind in list(units):  # a run folder implies the folder above it, even with nothing else in it
        if kind == "run":
            units.setdefault(("/".join(key.split("/")[:3]), "jobs"), 0)
    order = sorted(units, key=lambda unit: (unit[1] == "jobs", unit[0]))
    return [Folder(key, kind, _uri(key, roots), units[key, kind]) for key, kind in order]


def _listed(root: str) -> list[tuple[str, int]]:
    return [(obj.key, obj.size) for obj in list_objects(root)] if is_s3(root) or os.path.isdir(root) else []


def _uri(key: str, roots: dict[str, str]) -> str:
    top, _, rest = key.partition("/")
    return join(roots[top], rest) if top in roots else join(roots[""], key)


def references(instance: DagsterInstance) -> References:
    paths, names, run_ids, mounts, fingerprints = set(), set(), defaultdict(set), set(), defaultdict(set)
    for key in instance.get_asset_keys():
        cursor = None
        while True:
            result = instance.fetch_materializations(key, limit=PAGE, cursor=cursor)
            for record in result.records:
                run_ids[key.to_user_string()].add(record.run_id)
                for name, entry in record.asset_materialization.metadata.items():
                    value = entry.value
                    if not isinstance(value, str) or not value:
                        continue
                    if key.to_user_string() == WARM_ASSET and name == WARM_MOUNT_KEY:
                        mounts.add(normalize(value))  # where its sets are, not one: naming it keeps nothing
                        continue
                    if name == "fingerprint":
                        fingerprints[key.to_user_string()].add(value[:16])
                    if name in URI_KEYS or value.startswith(("/", "s3://")):  # any path it records: a job log, a mount
                        paths.add(normalize(value))
                    else:
                        names.add(value)  # a job name among them
            if not result.has_more:
                break
            cursor = result.cursor
    live = instance.get_run_records(filters=RunsFilter(statuses=LIVE_STATUSES))
    starts = [(record.start_time or record.create_timestamp.timestamp(), record.dagster_run.run_id) for record in live]
    live_ids = {run_id for _, run_id in starts}
    local_mounts = {m for m in mounts if "://" not in m}
    return References(paths, names, run_ids, live_ids, min(starts, default=None), local_mounts, fingerprints)


def normalize(uri: str) -> str:
    """One spelling per location: no trailing `/` on S3, an absolute real path locally."""
    return uri.rstrip("/") if is_s3(uri) else os.path.realpath(uri)


def why_unreferenced(folder: Folder, lake: str, refs: References, kept_runs: set[str]) -> str | None:
    """None when something refers to the folder, else why nothing does; `kept_runs`: the run folders that stay."""
    if refs.names_path(folder.uri):
        return None
    parts = folder.parts
    if folder.kind == "output":
        return "output: no stored materialization names it"
    if folder.kind == "run":  # `_jobs/<asset>/<fingerprint16>/runs/<run id>`
        if parts[4] in refs.run_ids.get(parts[1], set()) or parts[4] in refs.live_run_ids:
            return None
        return f"run job folder: its run recorded no stored materialization of {parts[1]} and is not in progress"
    if len(parts) == 3:  # an output's lease and checkpoints
        if (
            refs.names_output(lake, parts[1], parts[2])
            or parts[2] in refs.fingerprints.get(parts[1], set())
            or any(run.startswith(folder.key + "/") for run in kept_runs)
        ):
            return None
        return "lease and checkpoints of an output no stored materialization names, no run folder kept"
    name = parts[1]
    if name in refs.names or _names_a_run(name, refs.all_run_ids() | refs.live_run_ids):
        return None
    return "job folder: no stored materialization or run in progress names it or its run"


def _names_a_run(name: str, run_ids: set[str]) -> bool:
    # A folder may carry the whole run id or its first 8 characters (Dagster's short id).
    return any(run_id in name or run_id[:8] in name for run_id in run_ids)


def find_unreferenced(
    instance: DagsterInstance,
    lake: str,
    assets: Iterable[str],
    grace_s: float = DEFAULT_GRACE_HOURS * 3600,
    jobs_root: str | None = None,
) -> list[Verdict]:
    """The unreferenced units of the lake, `jobs_root` and the known warm mounts, each with why and whether it stays."""
    return _find(instance, lake, assets, grace_s, jobs_root)[1]


def _find(
    instance: DagsterInstance, lake: str, assets: Iterable[str], grace_s: float, jobs_root: str | None
) -> tuple[References, list[Verdict]]:
    refs = references(instance)
    folders = lake_folders(lake, assets, jobs_root)
    if folders and not refs.all_run_ids() and not refs.live_run_ids:
        raise LookupError(
            f"the Dagster instance holds no materializations and no runs in progress, so all {len(folders)} folders of "
            f"{lake} would count as unreferenced. Point DAGSTER_HOME at the instance that built this lake (`source "
            ".venv/bin/activate` sets the repo's); to drop a lake whose history is gone, delete the folder yourself."
        )
    cutoff, recent = refs.cutoff(grace_s)
    warm = unreferenced_on_mounts(sorted(refs.warm_mounts), refs.names_path, cutoff, recent)
    return refs, _judge(folders, lake, refs, grace_s, set(assets)) + warm


def _judge(folders: list[Folder], lake: str, refs: References, grace_s: float, assets: set[str]) -> list[Verdict]:
    cutoff, recent = refs.cutoff(grace_s)
    outputs = [(f.key, f.uri) for f in folders if f.kind == "output" and f.parts[0] == SHARD_ASSET]
    by_shards = kept_for_their_shards(  # an output stays on its own merits: named, or written since the cutoff
        outputs, lambda uri: refs.names_path(uri) or (newest_write(uri) or 0.0) >= cutoff, assets
    )
    verdicts, kept_runs = [], set()
    for folder in folders:  # run folders come first: a "jobs" folder above them needs their verdicts
        why = None if folder.key in by_shards else why_unreferenced(folder, lake, refs, kept_runs)
        written = newest_write(folder.uri) if why is not None else None
        kept = f"last {recent}, {age(written)} ago" if written is not None and written >= cutoff else None
        if folder.kind == "run" and (why is None or kept is not None):
            kept_runs.add(folder.key)
        if why is not None:
            verdicts.append(Verdict(folder, why, kept))
    return verdicts


def delete_unreferenced(
    instance: DagsterInstance,
    lake: str,
    assets: Iterable[str],
    grace_s: float = DEFAULT_GRACE_HOURS * 3600,
    jobs_root: str | None = None,
) -> tuple[list[Verdict], list[Folder]]:
    """Judge afresh (seeing what changed since a dry run) and remove what is collectable: (verdicts, deleted)."""
    refs, verdicts = _find(instance, lake, assets, grace_s, jobs_root)
    roots = [normalize(root) for root in (lake, jobs_root, *sorted(refs.warm_mounts)) if root is not None]
    deleted = []
    for verdict in verdicts:  # runs first, then the folders above them; warm sets before their shards
        folder = verdict.folder
        if verdict.kept_because is not None:
            continue
        if not any(normalize(folder.uri).startswith(root + "/") for root in roots):
            raise ValueError(
                f"refusing to delete {folder.uri}: it is not inside the lake {lake}, the jobs folder {jobs_root} "
                f"or a warm mount fsx_warm_state recorded ({', '.join(sorted(refs.warm_mounts)) or 'none'})"
            )
        for path in reversed(folder.files):  # a shard's verdict goes before the shard
            delete_file(path)
        if not folder.files:
            delete_prefix(folder.uri)
        deleted.append(folder)
    return verdicts, deleted


def report_lines(verdicts: list[Verdict], deleted: list[Folder] | None) -> list[str]:
    """The table (path, bytes, why unreferenced), then what stays anyway, then a total."""
    collectable = [v for v in verdicts if v.kept_because is None]
    width = max([len(v.folder.uri) for v in collectable] + [4])
    lines = [f"{'path':<{width}}  {'bytes':>14}  why unreferenced"]
    lines += [f"{v.folder.uri:<{width}}  {v.folder.bytes:>14,}  {v.why}" for v in collectable]
    kept = [v for v in verdicts if v.kept_because is not None]
    if kept:
        lines.append("")
        lines += [f"kept: {v.folder.uri} ({v.folder.bytes:,} bytes): {v.why}; {v.kept_because}" for v in kept]
    total = sum(v.folder.bytes for v in collectable)
    lines.append("")
    if deleted is None:
        lines.append(
            f"total: {len(collectable)} unreferenced folders, {total:,} bytes "
            "(dry run: nothing deleted; --delete removes them)"
        )
    else:
        lines.append(
            f"total: deleted {len(deleted)} unreferenced folders, {sum(f.bytes for f in deleted):,} bytes freed"
        )
    return lines
