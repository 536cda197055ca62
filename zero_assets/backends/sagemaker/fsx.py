"""FSx for Lustre naming: which file system path holds a shard set, and the S3 prefix behind it.

`<lake>/arrow_shards/` is linked to `/arrow_shards` by a data repository association; warm sets are
`fsx://<fs-id>/<mount>/<path>`. Processing jobs cannot mount FSx, so they read the S3 side.
"""

from __future__ import annotations

from dataclasses import dataclass

SHARDS_ASSET = "arrow_shards"
LINKED_PATH = f"/{SHARDS_ASSET}"


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
