"""What the raw index recorded of the files a job reads, and the proof that a job read exactly those.

The index manifest names its `raw_uri` and each source's annotations.json (`annotation_files`: size,
etag, sha256 parsed). Local reads are fstat-checked against `<mtime_ns>-<size>`; S3 fetches use IfMatch
on the ETag. Any file not as listed is `RawRootChanged`: the run fails and publishes nothing.
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
    """What the index recorded of one file: size, etag (S3 ETag or local `<mtime_ns>-<size>`) and the
    sha256 of the bytes it parsed (None when it read none)."""

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
    """What `<index_dir>/manifest.json` says was listed; an error naming the file when it is missing."""
    path = Path(index_dir) / INDEX_MANIFEST
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: the index's manifest records what the raw root held when it was listed, "
            "which the job checks what it reads against; rematerialize raw_image_index"
        )
    manifest = json.loads(path.read_text())
    files = {
        source: None if entry is None else IndexedFile(**entry) for source, entry in manifest[ANNOTATION_FILES].items()
    }
    return ListedRoot(str(manifest["raw_uri"]), files)


def proven_copy_bytes(listed: ListedRoot, key: str, data: bytes, indexed: IndexedFile) -> bytes:
    """`data`, the job's IfMatch fetch of the indexed S3 object `key`, checked against the index's size
    and, where the index read the file, its sha256."""
    if len(data) != indexed.size:
        raise RawRootChanged(key, f"{len(data)} bytes fetched, the index listed {indexed.size}")
    if indexed.sha256 is not None and hashlib.sha256(data).hexdigest() != indexed.sha256:
        raise RawRootChanged(key, f"its bytes are not those the index read from {listed.raw_uri} (sha256 differs)")
    return data
