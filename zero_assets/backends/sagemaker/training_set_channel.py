"""A training set of any number of sources as one SageMaker input: the shard root.

Every source's shard sets live under the lake's shard root `<lake>/arrow_shards/` (linked to
`/arrow_shards` on FSx for Lustre), so the training channel is that root: `FileSystemDataSource` on
FSx, or the S3 prefix in FastFile mode, which fetches only the files the trainer opens. The warm
step writes the training set beside the shard sets, at `<root>/_training_sets/<key>/`, with each
source's `folder` rewritten relative to the root; the jobs are told that folder (`--training-set`).
A source folder named `_training_sets` cannot collide: sources are the raw root's folders, and
their shard sets sit one level deeper (`<root>/<source>/<fingerprint16>/`).

Processing jobs cannot mount FSx and must not download the whole root: they read the same bytes
from S3 through a SageMaker manifest file (`files.manifest`) naming exactly the training set's
files, which land under the input folder at their paths relative to the root.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from training_code.lib import training_set as ts
from training_code.lib.storage import join, read_bytes, write_bytes_atomic
from zero_assets.backends.sagemaker.fsx import linked_s3_prefix

TRAINING_SETS = "_training_sets"
FILE_LIST = "files.manifest"  # S3DataType=ManifestFile: a prefix line, then keys relative to it


@dataclass(frozen=True)
class ChannelTrainingSet:
    root: str  # the shard root the channel mounts: s3://<lake>/arrow_shards/ or fsx://<fs>/<mount>/arrow_shards
    folder: str  # the training set inside it: "_training_sets/<key>"

    @property
    def uri(self) -> str:
        return f"{self.root.rstrip('/')}/{self.folder}"


def split_training_set(uri: str) -> ChannelTrainingSet | None:
    """A warmed training set's URI as (shard root, folder inside it); None for any other URI."""
    head, marker, key = uri.rstrip("/").rpartition(f"/{TRAINING_SETS}/")
    if not marker or not key or "/" in key:
        return None
    return ChannelTrainingSet(head, f"{TRAINING_SETS}/{key}")


def channel_training_set(lake_uri: str, data_version: str) -> ChannelTrainingSet:
    """Where the training set of `data_version` is laid out: `<lake>/arrow_shards/_training_sets/<key>/`,
    `<key>` the data version's first 16 characters."""
    return ChannelTrainingSet(linked_s3_prefix(lake_uri), f"{TRAINING_SETS}/{data_version[:16]}")


def write_channel_training_set(
    training_set_uri: str, lake_uri: str, data_version: str
) -> tuple[ChannelTrainingSet, dict]:
    """Write the training set at its `channel_training_set` folder: excluded rows, the file list for
    Processing jobs, and the manifest last, its source folders relative to the shard root.
    Returns where it is on S3 and the manifest."""
    channel = channel_training_set(lake_uri, data_version)
    root = channel.root
    manifest = json.loads(read_bytes(join(training_set_uri, ts.MANIFEST)))
    for source in manifest["sources"]:
        if not source["shards_uri"].startswith(root):
            raise ValueError(
                f"source {source['source']}'s shard set {source['shards_uri']} is not under the shard root {root}; "
                "was it written by another lake? Re-materialize its arrow_shards with this ZERO_LAKE_URI"
            )
        source["folder"] = source["shards_uri"][len(root) :].strip("/")
    files = [f"{channel.folder}/{ts.EXCLUDED}", f"{channel.folder}/{ts.MANIFEST}"]
    files += [f"{source['folder']}/{entry['file']}" for source in manifest["sources"] for entry in source["shards"]]
    write_bytes_atomic(join(channel.uri, ts.EXCLUDED), read_bytes(join(training_set_uri, ts.EXCLUDED)))
    write_bytes_atomic(join(channel.uri, FILE_LIST), json.dumps([{"prefix": root}, *files]).encode())
    write_bytes_atomic(join(channel.uri, ts.MANIFEST), json.dumps(manifest, indent=1).encode())
    return channel, manifest
