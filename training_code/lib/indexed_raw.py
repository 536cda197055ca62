"""What the raw index recorded of the files a job reads, and the proof that a job read exactly those.

The validation output is cached under the index's fingerprint, so what the job read must be what the
index listed. The index's `manifest.json` names the raw root it listed (`raw_uri`) and records each
source's `annotations.json` (`annotation_files`: size, etag and the sha256 of the bytes it parsed);
`index.parquet` has each image's size and etag. How a job proves its reads depends on where the raw
root is:

- a local raw root is read in place (or at `--raw`, the same root at another path); each file is fstat-checked against
  its listed `<mtime_ns>-<size>` as it is read (`raw_files.read_limited`);
- an S3 raw root: the job fetches exactly the objects it reads, by key, each GetObject with IfMatch
  on the indexed ETag (`raw_fetch`), so S3 itself proves it is the listed object, whatever kind of
  ETag it has; what the index read itself (annotations.json) is checked by its sha256 too.

A file that is not the one listed, or that is gone, is `RawRootChanged`: the run fails, nothing is
published, and the next index picks the change up.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .raw_files import RawRootChanged
from .storage import is_s3

INDEX_MANIFEST = "manifest.json"
ANNOTATION_FILES = "annotation_files"  # index manifest: source -> IndexedFile as JSON, or null (no file)


@dataclass(frozen=True)
class IndexedFile:
    """What the index recorded of one file: its size, its etag (the S3 ETag, or the local file's
    `<mtime_ns>-<size>`) and the sha256 of the bytes it parsed (None when it did not read them: past
    its size limit, refused, or an image, which the index never reads)."""

    size: int
    etag: str
    sha256: str | None = None

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ListedRoot:
    """The raw root an index listed, and what it recorded of each source's annotations.json."""

    raw_uri: str
    annotation_files: dict[str, IndexedFile | None]

    @property
    def local(self) -> bool:
        """A local root: the job reads the listed files themselves, so their fstat is the proof."""
        return not is_s3(self.raw_uri)

    def annotation_file(self, source: str) -> IndexedFile | None:
        if source not in self.annotation_files:
            raise ValueError(
                f"the index records nothing of {source}/annotations.json (its manifest lists "
                f"{sorted(self.annotation_files)}); rematerialize raw_image_index for {source}"
            )
        return self.annotation_files[source]


def read_listed_root(index_dir: Path) -> ListedRoot:
    """What `<index_dir>/manifest.json` says was listed; an error naming the file and what to do when
    it is missing or predates these fields."""
    path = Path(index_dir) / INDEX_MANIFEST
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: the index's manifest records what the raw root held when it was listed, "
            "which the job checks what it reads against; rematerialize raw_image_index"
        )
    manifest = json.loads(path.read_text())
    if ANNOTATION_FILES not in manifest or "raw_uri" not in manifest:
        raise ValueError(
            f"{path} has no `{ANNOTATION_FILES}` (an index written before they were recorded); "
            "rematerialize raw_image_index"
        )
    files = {
        source: None if entry is None else IndexedFile(**entry) for source, entry in manifest[ANNOTATION_FILES].items()
    }
    return ListedRoot(str(manifest["raw_uri"]), files)


def proven_copy_bytes(listed: ListedRoot, key: str, data: bytes, indexed: IndexedFile) -> bytes:
    """The bytes of the indexed object `key`, given `data`, those of the job's fetch of it from the S3
    raw root (`raw_fetch`: with IfMatch on the indexed ETag, so S3 proved it is the listed object):
    `data`, checked against the index's size and, where the index read the file, its sha256."""
    if len(data) != indexed.size:
        raise RawRootChanged(key, f"{len(data)} bytes fetched, the index listed {indexed.size}")
    if indexed.sha256 is not None and hashlib.sha256(data).hexdigest() != indexed.sha256:
        raise RawRootChanged(key, f"its bytes are not those the index read from {listed.raw_uri} (sha256 differs)")
    return data
