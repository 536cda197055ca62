"""The raw root's sources: its top-level folders, from one delimiter listing (never the whole lake).

On S3 that is one paginated `ListObjectsV2` with `Delimiter="/"` (1,000 folders a round trip);
locally one directory scan. Registering adds each new source as a partition of the per-source assets.
"""

from __future__ import annotations

import os
from pathlib import Path

from dagster import DagsterInstance

from training_code.lib.storage import is_s3, s3_call, s3_client, split_s3
from zero_assets.defs.change_detection.sources import partition_problem
from zero_assets.defs.partitions import RAW_SOURCES


def list_sources(raw_uri: str) -> list[str]:
    """The top-level folder names under `raw_uri`, sorted."""
    if not is_s3(raw_uri):
        root = Path(raw_uri)
        if not root.is_dir():
            raise FileNotFoundError(
                f"raw root {raw_uri} does not exist; set ZERO_RAW_URI or run `zero-assets make-demo-data`"
            )
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
