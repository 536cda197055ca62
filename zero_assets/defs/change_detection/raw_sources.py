"""The raw root's sources (its top-level folders, from one delimiter listing), and registering, checking and
removing them as partitions of the per-source assets."""

from __future__ import annotations

import os
from pathlib import Path

from dagster import DagsterInstance, Failure

from training_code.lib.storage import is_s3, s3_call, s3_client, split_s3
from zero_assets.defs.change_detection.sources import partition_problem
from zero_assets.defs.partitions import RAW_SOURCES

REMOVE_COMMAND = "zero-assets sources --remove"


def missing_root(raw_uri: str) -> str:
    return (
        f"raw root {raw_uri} does not exist: check ZERO_RAW_URI (a typo?), or write the demo's with "
        f"`zero-assets make-demo-data --out {raw_uri}`"
    )


def list_sources(raw_uri: str) -> list[str]:
    """The top-level folder names under `raw_uri`, sorted."""
    if not is_s3(raw_uri):
        root = Path(raw_uri)
        if not root.is_dir():
            raise FileNotFoundError(missing_root(raw_uri))
        with os.scandir(root) as entries:
            return sorted(e.name for e in entries if e.is_dir(follow_symlinks=False) and not e.name.startswith("."))
    bucket, prefix = split_s3(raw_uri)
    base = f"{prefix}/" if prefix else ""

    def listed() -> list[str]:
        folders = []
        for page in s3_client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=base, Delimiter="/"):
            folders += [p["Prefix"][len(base) :].rstrip("/") for p in page.get("CommonPrefixes", [])]
        return folders

    return sorted(s3_call(listed, f"LIST s3://{bucket}/{base} (Delimiter=/)"))


def register_sources(instance: DagsterInstance, sources: list[str]) -> tuple[list[str], dict[str, str]]:
    """Add the sources that are not partitions yet; returns (added, refused name -> why)."""
    refused = {s: problem for s in sources if (problem := partition_problem(s))}
    known = set(instance.get_dynamic_partitions(RAW_SOURCES.name))
    added = [s for s in sources if s not in known and s not in refused]
    if added:
        instance.add_dynamic_partitions(RAW_SOURCES.name, added)
    return added, refused


def _has_objects(bucket: str, prefix: str) -> bool:
    """Whether any object lies under `prefix` (one ListObjectsV2 of one key); a missing bucket has none."""

    def listed() -> bool:
        try:
            return s3_client().list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1).get("KeyCount", 0) > 0
        except s3_client().exceptions.NoSuchBucket:
            return False

    return s3_call(listed, f"LIST s3://{bucket}/{prefix} (MaxKeys=1)")


def source_problem(raw_uri: str, source: str) -> str | None:
    """Why `source` is not a source of the raw root, or None when it is; never lists the source."""
    if not is_s3(raw_uri):
        root = Path(raw_uri)
        if not root.is_dir():
            return missing_root(raw_uri)
        folder = root / source
        if folder.is_dir() and not folder.is_symlink():
            return None
        found = "a symlink (not followed)" if folder.is_symlink() else "not there"
    else:
        bucket, prefix = split_s3(raw_uri)
        base = f"{prefix}/" if prefix else ""
        if not _has_objects(bucket, base):
            return missing_root(raw_uri)
        if _has_objects(bucket, f"{base}{source}/"):
            return None
        found = "no object under it"
    return (
        f"partition {source!r} of raw_sources is not a source of the raw root {raw_uri}: its folder "
        f"{raw_uri.rstrip('/')}/{source}/ is {found}. A partition is a top-level folder of the raw root; one "
        "added by hand (the UI's 'Add a partition') or whose folder was removed fails every time. Remove it "
        f"with `{REMOVE_COMMAND} {source}` (from the repo root, the instance at $DAGSTER_HOME), or create the folder"
    )


def require_source(raw_uri: str, source: str) -> None:
    """Fail the materialization at once, with no retry, when `source` is not a source of the raw root."""
    problem = source_problem(raw_uri, source)
    if problem:
        raise Failure(description=problem, allow_retries=False)


def remove_source(instance: DagsterInstance, source: str) -> None:
    """Delete the partition `source` (its materializations stay in the event log)."""
    if not instance.has_dynamic_partition(RAW_SOURCES.name, source):
        known = sorted(instance.get_dynamic_partitions(RAW_SOURCES.name))
        raise LookupError(f"{source!r} is not a partition of raw_sources in this instance; its partitions: {known}")
    instance.delete_dynamic_partition(RAW_SOURCES.name, source)
