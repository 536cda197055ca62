"""`fsx_warm_state` on AWS: link the shard prefix to FSx for Lustre, import the metadata of the shards the
set last warmed there did not list, and restore and verify them with a small job (training_code/warm.py);
without FSx, check the set on S3 by size.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict

from training_code.lib.shard_format import MANIFEST
from training_code.lib.storage import join, list_objects, read_bytes, write_bytes_atomic
from zero_assets.backends.sagemaker.training_set_channel import (
    FILE_LIST,
    LINKED_PATH,
    TRAINING_SETS,
    ChannelShard,
    ChannelTrainingSet,
    FsxLocation,
    linked_s3_prefix,
)
from zero_assets.core.fingerprints import UpstreamOutput
from zero_assets.core.job_request import JobRequest
from zero_assets.core.settings import ZeroSettings

WARM_MODULE = "training_code.warm"
WARM_CONFIG = {"batch_files": 64}
ASSOCIATION_TIMEOUT_S = 1800
IMPORT_TIMEOUT_S = 3 * 3600


def verify_on_s3(root: str, shards: list[ChannelShard]) -> dict:
    """Check every listed shard is under the shard root with its manifest's size (listings only); the counts."""
    folders: dict[str, list[ChannelShard]] = defaultdict(list)
    for shard in shards:
        folders[shard.key.rpartition("/")[0]].append(shard)
    wrong = []
    for folder, listed in folders.items():
        sizes = {obj.key: obj.size for obj in list_objects(join(root, folder))}
        wrong += [s.key for s in listed if sizes.get(s.key.rpartition("/")[2]) != s.entry["bytes"]]
    if wrong:
        raise RuntimeError(
            f"{len(wrong)} shards under {root} are missing or differ in size from their set's {MANIFEST}: "
            f"{wrong[:5]}; rematerialize arrow_shards"
        )
    return {
        "shards": len(shards),
        "bytes": sum(s.entry["bytes"] for s in shards),
        "rows": sum(s.entry["rows"] for s in shards),
    }


def counted_on_s3(channel: ChannelTrainingSet, shards: list[ChannelShard]) -> dict:
    """Without FSx: the set verified on S3, counted as the FSx warm job counts it (shards plus the set's files)."""
    counts = verify_on_s3(channel.root, shards)
    listed = {o.key: o.size for o in list_objects(channel.uri)}
    return {**counts, "bytes": counts["bytes"] + sum(size for name, size in listed.items() if name != FILE_LIST)}


def warmed_set_record(channel: ChannelTrainingSet, file_system_id: str) -> str:
    """Where the last set warmed on `file_system_id` is recorded, under the shard root."""
    return join(channel.root, f"{TRAINING_SETS}/warm-{file_system_id}.json")


def new_to_file_system(channel: ChannelTrainingSet, shards: list[ChannelShard], file_system_id: str) -> list[str]:
    """Keys of the listed shards the last set warmed on the file system did not list (all, without a record)."""
    try:
        record = json.loads(read_bytes(warmed_set_record(channel, file_system_id)))
        earlier = json.loads(read_bytes(join(channel.root, f"{record['folder']}/{MANIFEST}")))
        known = {path.removeprefix("../../") for path in (e["path"] for e in earlier["shards"])}
    except (FileNotFoundError, KeyError, ValueError):
        return [shard.key for shard in shards]
    return [shard.key for shard in shards if shard.key not in known]


def record_warmed_set(channel: ChannelTrainingSet, file_system_id: str) -> None:
    """Record the set as the last one warmed (and fully verified) on the file system."""
    data = json.dumps({"folder": channel.folder, "file_system_id": file_system_id}).encode()
    write_bytes_atomic(warmed_set_record(channel, file_system_id), data)


def association_params(file_system_id: str, lake_uri: str) -> dict:
    """CreateDataRepositoryAssociation: `<lake>/arrow_shards/` linked to `/arrow_shards`."""
    return {
        "FileSystemId": file_system_id,
        "FileSystemPath": LINKED_PATH,
        "DataRepositoryPath": linked_s3_prefix(lake_uri),
        "BatchImportMetaDataOnCreate": True,
        # New shard sets appear by themselves; the import task makes it certain.
        "S3": {"AutoImportPolicy": {"Events": ["NEW", "CHANGED", "DELETED"]}},
    }


IMPORT_PATHS_PER_TASK = 100  # CreateDataRepositoryTask takes at most 100 paths


def import_task_params(file_system_id: str, paths: list[str]) -> dict:
    """CreateDataRepositoryTask: import the metadata of the files under `paths` from S3."""
    return {
        "Type": "IMPORT_METADATA_FROM_REPOSITORY",
        "FileSystemId": file_system_id,
        "Paths": [path.lstrip("/") for path in paths],
        "Report": {"Enabled": False},
    }


def ensure_association(fsx, file_system_id: str, lake_uri: str, log) -> str:
    """The data repository association linking `<lake>/arrow_shards/` to `/arrow_shards`; created when missing."""
    repository = linked_s3_prefix(lake_uri)
    pages = fsx.get_paginator("describe_data_repository_associations").paginate(
        Filters=[{"Name": "file-system-id", "Values": [file_system_id]}]
    )
    for page in pages:
        for association in page["Associations"]:
            if association["FileSystemPath"] == LINKED_PATH:
                if association["DataRepositoryPath"].rstrip("/") != repository.rstrip("/"):
                    raise RuntimeError(
                        f"{file_system_id}:{LINKED_PATH} is linked to {association['DataRepositoryPath']}, "
                        f"not {repository}; delete that association or use another file system"
                    )
                return _wait_available(fsx, association["AssociationId"], log)
    created = fsx.create_data_repository_association(**association_params(file_system_id, lake_uri))["Association"]
    log.info(f"created data repository association {created['AssociationId']}: {LINKED_PATH} <-> {repository}")
    return _wait_available(fsx, created["AssociationId"], log)


def _wait_available(fsx, association_id: str, log) -> str:
    deadline = time.monotonic() + ASSOCIATION_TIMEOUT_S
    while True:
        association = fsx.describe_data_repository_associations(AssociationIds=[association_id])["Associations"][0]
        if association["Lifecycle"] == "AVAILABLE":
            return association_id
        if association["Lifecycle"] in ("FAILED", "MISCONFIGURED", "DELETING"):
            raise RuntimeError(
                f"data repository association {association_id} is {association['Lifecycle']}: "
                f"{association.get('FailureDetails')}"
            )
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"data repository association {association_id} not AVAILABLE after {ASSOCIATION_TIMEOUT_S}s"
            )
        log.info(f"data repository association {association_id}: {association['Lifecycle']}")
        time.sleep(15)


def import_metadata(fsx, file_system_id: str, paths: list[str], log) -> list[str]:
    """IMPORT_METADATA_FROM_REPOSITORY tasks on `paths` (100 a task), each waited for until it succeeds."""
    return [
        _import_batch(fsx, file_system_id, paths[start : start + IMPORT_PATHS_PER_TASK], log)
        for start in range(0, len(paths), IMPORT_PATHS_PER_TASK)
    ]


def _import_batch(fsx, file_system_id: str, paths: list[str], log) -> str:
    task = fsx.create_data_repository_task(**import_task_params(file_system_id, paths))["DataRepositoryTask"]
    deadline = time.monotonic() + IMPORT_TIMEOUT_S
    while True:
        task = fsx.describe_data_repository_tasks(TaskIds=[task["TaskId"]])["DataRepositoryTasks"][0]
        if task["Lifecycle"] == "SUCCEEDED":
            return task["TaskId"]
        if task["Lifecycle"] in ("FAILED", "CANCELED"):
            raise RuntimeError(
                f"metadata import {task['TaskId']} on {file_system_id}:{paths} {task['Lifecycle']}: "
                f"{task.get('FailureDetails')}"
            )
        if time.monotonic() > deadline:
            raise TimeoutError(f"metadata import {task['TaskId']} still {task['Lifecycle']} after {IMPORT_TIMEOUT_S}s")
        log.info(f"metadata import {task['TaskId']}: {task['Lifecycle']}")
        time.sleep(15)


def warm_job_request(shards: UpstreamOutput, location: FsxLocation, settings: ZeroSettings, lease: str) -> JobRequest:
    """The job that restores and verifies a shard set on the file system; `lease`: fsx_warm_state's."""
    from zero_assets.core.job_request import build_job_request

    return build_job_request(
        "fsx_warm_state",
        settings=settings,
        kind="training",
        module=WARM_MODULE,
        config=WARM_CONFIG,
        upstream=[shards],
        inputs={"shards": location.uri},
        launcher="python",
        fsx_access="rw",  # lfs hsm_restore writes
        lease=lease,
    )
