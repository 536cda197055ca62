"""Open a raw file by its key without ever leaving the raw root, and read it only up to a size limit.

The raw root is untrusted: a key may be unsafe (`..`, control characters, bytes that are not UTF-8),
a symlink inside the root may point anywhere on the machine, and a file may be far larger than a
worker can hold. Each of those is a `Refused` with the reason code the quarantine table records, and
none of them reads a byte of the file (or of a symlink's target).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .storage import key_problem

READ_CHUNK = 8 << 20


class Refused(Exception):
    """The file is not read; `reason` is one of `tables.REASONS`."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


def locate(raw: Path, key: str, via_links: bool = False) -> Path:
    """The real path (no symlinks left) of `key` under the raw root `raw`, checked to lie inside it.

    `via_links`: `raw` is one host's part of a split input laid out as one link per key into the
    real root (the local runner's layout; SageMaker downloads real files). The link the runner made
    is followed to find that root; any link further on is judged against it like any other."""
    problem = key_problem(key)
    if problem:
        raise Refused("unsafe_key", f"the key has {problem}; not read")
    root = str(raw)
    if via_links and os.path.islink(raw / key):
        text = os.readlink(raw / key)
        if os.path.isabs(text) and text.endswith(f"/{key}"):
            root = text[: -len(key) - 1]
    real_root = os.path.realpath(root)
    real = os.path.realpath(os.path.join(real_root, key))
    if os.path.commonpath([real, real_root]) != real_root:
        raise Refused(
            "outside_root", "a symlink on its path leads out of the raw root; not followed, the target was not opened"
        )
    return Path(real)


def read_limited(path: Path, max_bytes: int) -> bytes:
    """The bytes of the located file `path`, refused as `too_large` past `max_bytes` before any is read.

    Opened without following a final symlink and without blocking (a FIFO put there after listing
    must not hang the reader), then checked to be a regular file still at the located path."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        if error.errno == getattr(os, "ELOOP", 40):
            raise Refused("outside_root", "the file became a symlink after it was located; not followed") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Refused("unreadable", "not a regular file")
        opened = f"/proc/self/fd/{fd}"
        if os.path.islink(opened) and os.readlink(opened) != str(path):
            raise Refused("outside_root", "a folder on its path became a symlink after it was located; not read")
        if info.st_size > max_bytes:
            raise Refused("too_large", f"{info.st_size} bytes, above the limit of {max_bytes}; not read")
        os.set_blocking(fd, True)
        chunks, total = [], 0
        while block := os.read(fd, min(READ_CHUNK, max_bytes + 1 - total)):
            chunks.append(block)
            total += len(block)
            if total > max_bytes:  # it grew after the size check
                raise Refused("too_large", f"more than {max_bytes} bytes (it grew while being read); not kept")
        return b"".join(chunks)
    finally:
        os.close(fd)
