"""`fsx_warm_state` on AWS: link the shard prefix to FSx for Lustre, import its metadata, load and
verify the shards with a small job that mounts the file system. Without FSx: check the shard set
on S3 against its manifest; training then reads S3 in FastFile mode.
"""

from __future__ import annotations

import json
import time

from training_code.lib import training_set as ts
from training_code.lib.shard_format import MANIFEST
from training_code.lib.storage import join, list_objects, read_bytes
from zero_assets.backends.sagemaker.fsx import LINKED_PATH, FsxLocation, linked_s3_prefix
from zero_assets.core.fingerprints import UpstreamOutput
from zero_assets.core.job_request import JobRequest
from zero_assets.core.settings import ZeroSettings

WARM_MODULE = "training_code.warm"
WARM_CONFIG = {"batch_files": 64}

ASSOCIATION_TIMEOUT_S = 1800
IMPORT_TIMEOUT_S = 3 * 3600


def verify_on_s3(shards_uri: str) -> dict:
    """Every shard of the manifest present with the manifest's size (no download: sizes from the listing)."""
    entries = json.loads(read_bytes(join(shards_uri, MANIFEST)))["shards"]
    sizes = {obj.key: obj.size for obj in list_objects(shards_uri)}
    wrong = [e["file"] for e in entries if sizes.get(e["file"]) != e["bytes"]]
    if wrong:
        raise RuntimeError(
            f"{len(wrong)} shards under {shards_uri} are missing or differ in size from {MANIFEST}: {wrong[:5]}"
        )
    return {"shards": len(entries), "bytes": sum(e["bytes"] for e in entries), "rows": sum(e["rows"] for e in entries)}


def counted_on_s3(channel_uri: str, shard_uris: list[str]) -> dict:
    """Without FSx (training reads S3 in FastFile mode): every shard set verified on S3 (`verify_on_s3`),
    counted as the FSx warm job (training_code.warm) counts it on the file system: rows and shards of
    every shard set; bytes of every shard plus the manifest and excluded rows at `channel_uri`."""
    counts = [verify_on_s3(uri) for uri in shard_uris]
    listed = {o.key: o.size for o in list_objects(channel_uri)}
    return {
        "rows": sum(c["rows"] for c in counts),
        "bytes": sum(c["bytes"] for c in counts) + sum(listed.get(name, 0) for name in (ts.MANIFEST, ts.EXCLUDED)),
        "shards": sum(c["shards"] for c in counts),
    }


def association_params(file_system_id: str, lake_uri: str) -> dict:
    """CreateDataRepositoryAssociation: `<lake>/arrow_shards/` linked to `/arrow_shards`."""
    return {
        "FileSystemId": file_system_id,
        "FileSystemPath": LINKED_PATH,
        "DataRepositoryPath": linked_s3_prefix(lake_uri),
        "BatchImportMetaDataOnCreate": True,
        # New shard sets appear on the file system by themselves; the import task makes it certain.
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
                        f"not {repository}; "
                        "delete that association or use another file system"
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


def warm_job_request(shards: UpstreamOutput, location: FsxLocation, settings: ZeroSettings) -> JobRequest:
    """The job that loads and verifies a shard set, or every shard set of a training set (its folder
    under the shard root, see training_set_channel), on the file system (one plain process, no torchrun)."""
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
    )
