"""FSx for Lustre naming, and a shard set as one SageMaker input: the shard root as the channel, the set's
folder inside it.

`<lake>/arrow_shards/` is linked to `/arrow_shards` by a data repository association; warm sets are
`fsx://<fs-id>/<mount>/<path>`. Sets list shards across sibling folders of the shard root, so the channel
is that root. The warm step writes `<root>/_training_sets/<key>/` (manifest last, paths rewritten, nothing
copied); Processing jobs, which cannot mount FSx, read exactly its files through `files.manifest`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from training_code.lib import relative_paths
from training_code.lib.hashing import sha256_bytes
from training_code.lib.parquet_bytes import parquet_bytes, read_parquet_bytes
from training_code.lib.shard_format import FORMAT, MANIFEST, MASKED
from training_code.lib.storage import join, read_bytes, write_bytes_atomic
from training_code.lib.verified_read import read_verified

SHARDS_ASSET = "arrow_shards"
LINKED_PATH = f"/{SHARDS_ASSET}"
TRAINING_SETS = "_training_sets"
FILE_LIST = "files.manifest"  # S3DataType=ManifestFile: a prefix line, then keys relative to it


@dataclass(frozen=True)
class FsxLocation:
    file_system_id: str
    mount_name: str
    path: str  # on the file system, "/arrow_shards/<key>"

    @property
    def uri(self) -> str:
        return f"fsx://{self.file_system_id}/{self.mount_name}{self.path}"

    @property
    def directory_path(self) -> str:
        """What `FileSystemDataSource.DirectoryPath` wants: the mount name, then the path."""
        return f"/{self.mount_name}{self.path}"


def is_fsx(uri: str) -> bool:
    return uri.startswith("fsx://")


def parse_fsx_uri(uri: str) -> FsxLocation:
    file_system_id, _, rest = uri[len("fsx://") :].partition("/")
    mount_name, _, path = rest.partition("/")
    if not (uri.startswith("fsx://") and file_system_id and mount_name and path):
        raise ValueError(f"{uri!r} is not an fsx://<file-system-id>/<mount-name>/<path> URI")
    return FsxLocation(file_system_id, mount_name, f"/{path.strip('/')}")


def shards_on_fsx(shards_uri: str, lake_uri: str, file_system_id: str, mount_name: str) -> FsxLocation:
    """Where an `arrow_shards` output of the lake appears on the linked file system."""
    linked = linked_s3_prefix(lake_uri)
    if not shards_uri.startswith(linked):
        raise ValueError(
            f"shard set {shards_uri} is not under the linked prefix {linked}; was it written by another lake?"
        )
    return FsxLocation(file_system_id, mount_name, f"{LINKED_PATH}/{shards_uri[len(linked) :].strip('/')}")


def s3_behind_fsx(uri: str, lake_uri: str) -> str:
    """The S3 prefix that holds the same bytes as an fsx:// shard location."""
    location = parse_fsx_uri(uri)
    if not location.path.startswith(f"{LINKED_PATH}/"):
        raise ValueError(f"{uri} is outside the linked path {LINKED_PATH}; only shard sets are linked")
    return linked_s3_prefix(lake_uri) + location.path[len(LINKED_PATH) + 1 :]


def linked_s3_prefix(lake_uri: str) -> str:
    return f"{lake_uri.rstrip('/')}/{SHARDS_ASSET}/"


@dataclass(frozen=True)
class ChannelTrainingSet:
    root: str  # the shard root the channel mounts: s3://<lake>/arrow_shards/ or fsx://<fs>/<mount>/arrow_shards
    folder: str  # the set inside it: "_training_sets/<key>"

    @property
    def uri(self) -> str:
        return f"{self.root.rstrip('/')}/{self.folder}"


def split_training_set(uri: str) -> ChannelTrainingSet | None:
    """A warm set's URI as (shard root, folder inside it); None for any other URI."""
    head, marker, key = uri.rstrip("/").rpartition(f"/{TRAINING_SETS}/")
    if not marker or not key or "/" in key:
        return None
    return ChannelTrainingSet(head, f"{TRAINING_SETS}/{key}")


def channel_training_set(lake_uri: str, data_version: str) -> ChannelTrainingSet:
    """Where the shard set of `data_version` is laid out: `<lake>/arrow_shards/_training_sets/<version[:16]>/`."""
    return ChannelTrainingSet(linked_s3_prefix(lake_uri), f"{TRAINING_SETS}/{data_version[:16]}")


@dataclass(frozen=True)
class ChannelShard:
    key: str  # below the shard root: "<fp16>/shards/<name>"
    entry: dict[str, Any]  # its manifest entry, as the set lists it


def write_channel_training_set(
    shards_uri: str, lake_uri: str, data_version: str
) -> tuple[ChannelTrainingSet, list[ChannelShard]]:
    """Write the set's channel folder (manifest last): where it is, and each listed shard's key below the root."""
    channel = channel_training_set(lake_uri, data_version)
    manifest, shards = channel_shards(shards_uri, channel.root)
    moved = {shard.entry["path"]: f"../../{shard.key}" for shard in shards}
    files: dict[str, dict[str, Any]] = {}
    if MASKED in manifest.get("files", {}):
        masked = read_parquet_bytes(read_verified(join(shards_uri, MASKED)))
        paths = pa.array([moved[path] for path in masked.column("path").to_pylist()], pa.string())
        data = parquet_bytes(masked.set_column(masked.schema.get_field_index("path"), "path", paths))
        write_bytes_atomic(join(channel.uri, MASKED), data)
        files[MASKED] = {"bytes": len(data), "sha256": sha256_bytes(data)}
    listed = [f"{channel.folder}/{name}" for name in (*files, MANIFEST)] + [shard.key for shard in shards]
    write_bytes_atomic(join(channel.uri, FILE_LIST), json.dumps([{"prefix": channel.root}, *listed]).encode())
    rewritten = {
        **manifest,
        "shards": [{**shard.entry, "path": moved[shard.entry["path"]]} for shard in shards],
        "files": files,  # what the set's folder holds beside the manifest
        "shard_set": shards_uri,
    }
    write_bytes_atomic(join(channel.uri, MANIFEST), json.dumps(rewritten, indent=1, sort_keys=True).encode())
    return channel, shards


def channel_shards(shards_uri: str, root: str) -> tuple[dict[str, Any], list[ChannelShard]]:
    """The manifest of the shard set at `shards_uri` and each shard it lists, with its key below `root`."""
    manifest = json.loads(read_bytes(join(shards_uri, MANIFEST)))
    if manifest.get("format") != FORMAT:
        raise ValueError(
            f"{join(shards_uri, MANIFEST)}: format {manifest.get('format')!r}, the warm step reads {FORMAT!r}; "
            "rematerialize arrow_shards"
        )
    return manifest, [ChannelShard(_below_root(shards_uri, root, entry["path"]), entry) for entry in manifest["shards"]]


def _below_root(shards_uri: str, root: str, path: str) -> str:
    """The key below `root` of the shard listed as `path`; ValueError when it leaves the root."""
    try:
        where = relative_paths.resolve(shards_uri.rstrip("/"), path, root=root.rstrip("/"))
    except ValueError as error:
        raise ValueError(
            f"{join(shards_uri, MANIFEST)}: shard {path!r} is not under the shard root {root} ({error}); "
            "was it written by another lake? Rematerialize arrow_shards with this ZERO_LAKE_URI"
        ) from error
    return where[len(root.rstrip("/")) + 1 :]
