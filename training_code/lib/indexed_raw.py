"""What the raw index recorded of the files a job reads, and the proof that a job read exactly those.

The validation output is cached under the index's fingerprint, so what the job read must be what the
index listed. The index's `manifest.json` names the raw root it listed (`raw_uri`) and records each
source's `annotations.json` (`annotation_files`: size, etag and the sha256 of the bytes it parsed);
`index.parquet` has each image's size and etag. How a job proves its reads depends on where its
`--raw` comes from:

- a local raw root: `--raw` is the root itself (or links into it); each file is fstat-checked against
  its listed `<mtime_ns>-<size>` as it is read (`raw_files.read_limited`);
- an S3 raw root: `--raw` is the job's download of it (SageMaker File mode, or the local runner's
  copy), which carries no ETag. A copy is proven by its bytes where the indexed ETag is their MD5 (a
  single-part upload without SSE-KMS: most images); any other copy is replaced by a GetObject of
  exactly that key with IfMatch on the indexed ETag (`prove_copies`).

A file that is not the one listed, or that is gone, is `RawRootChanged`: the run fails, nothing is
published, and the next index picks the change up.
"""

from __future__ import annotations

import hashlib
import json
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .raw_files import RawRootChanged
from .storage import ObjectChanged, is_s3, join, read_bytes_if_match, write_bytes_atomic

INDEX_MANIFEST = "manifest.json"
ANNOTATION_FILES = "annotation_files"  # index manifest: source -> IndexedFile as JSON, or null (no file)
_MD5 = re.compile(r"[0-9a-f]{32}")
PROOF_CHUNK = 1 << 20


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


def prove_copies(
    copy: Path, listed: ListedRoot, rows: list[tuple[str, int, str]], *, max_bytes: int, fetched: Path, workers: int
) -> dict[str, Path]:
    """Prove the downloaded copy under `copy` of each (key, size, etag) in `rows` (keys `key_problem`
    accepts, each with a copy). Returns key -> a file under `fetched` holding the object's bytes, for
    the keys whose copy could not be proven by its bytes (fetched with IfMatch); `RawRootChanged` for
    a copy or object that is not the indexed one. A copy past `max_bytes` is checked by size alone:
    it is never read, and its verdict (`too_large`) depends on nothing else."""

    def prove(row: tuple[str, int, str]) -> tuple[str, Path | None]:
        key, size, etag = row
        path = copy / key
        try:
            copied = path.stat().st_size
        except FileNotFoundError:
            raise RawRootChanged(key, "listed by the index, but not in the job's download of the raw root") from None
        if copied != size:
            raise RawRootChanged(key, f"{copied} bytes downloaded, the index listed {size}")
        if size > max_bytes or (_MD5.fullmatch(etag) and _md5_file(path) == etag):
            return key, None
        return key, fetch_listed(listed, key, etag, fetched / key)

    with ThreadPoolExecutor(max(1, workers)) as pool:  # hashing and reading release the GIL
        found = dict(pool.map(prove, rows))
    return {key: path for key, path in found.items() if path is not None}


def fetch_listed(listed: ListedRoot, key: str, etag: str, dest: Path) -> Path:
    """The object `key` of the S3 raw root, fetched to `dest` only while its ETag is the indexed `etag`."""
    try:
        data = read_bytes_if_match(join(listed.raw_uri, key), etag)
    except ObjectChanged as changed:
        raise RawRootChanged(key, str(changed)) from None
    write_bytes_atomic(dest, data)
    return dest


def proven_copy_bytes(listed: ListedRoot, key: str, data: bytes, indexed: IndexedFile) -> bytes:
    """The bytes of the indexed object `key`, given `data`, those of its downloaded copy: `data` when
    it proves itself (the index's sha256 or an MD5 ETag), else the object fetched with IfMatch."""
    if len(data) != indexed.size:
        raise RawRootChanged(key, f"{len(data)} bytes downloaded, the index listed {indexed.size}")
    if indexed.sha256 is not None:
        if hashlib.sha256(data).hexdigest() != indexed.sha256:
            raise RawRootChanged(key, "its bytes are not those the index read (sha256 differs)")
        return data
    if _MD5.fullmatch(indexed.etag) and hashlib.md5(data, usedforsecurity=False).hexdigest() == indexed.etag:
        return data
    try:
        return read_bytes_if_match(join(listed.raw_uri, key), indexed.etag)
    except ObjectChanged as changed:
        raise RawRootChanged(key, str(changed)) from None


def _md5_file(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as handle:
        while block := handle.read(PROOF_CHUNK):
            digest.update(block)
    return digest.hexdigest()
