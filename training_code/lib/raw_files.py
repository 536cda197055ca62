"""Open a raw file by its key without leaving the raw root, and read it only up to a size limit.

The raw root is untrusted: an unsafe key, a symlink out of the root or an oversized file is `Refused` and
no byte is read. With `listed_etag` a read proves it got the file the index listed, else `RawChanged`."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from .object_keys import local_etag
from .storage import key_problem

READ_CHUNK = 8 << 20
# Never a final symlink's target, never a wait on a FIFO put there after the file was located.
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
RAW_CHANGED = "raw_changed"  # a Refused reason that never reaches a table: the pass fails on it


class Refused(Exception):
    """The file is not read; `reason` is one of `tables.REASONS` (or RAW_CHANGED, see `RawChanged`)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


class RawChanged(Refused):
    """The file is not the one the index listed (edited, replaced or gone): the validation pass fails on it."""

    def __init__(self, detail: str) -> None:
        super().__init__(RAW_CHANGED, detail)


class RawRootChanged(RuntimeError):
    """The raw root changed under the run: what the job would read is not what the index listed."""

    def __init__(self, key: str, detail: str) -> None:
        source = key.split("/", 1)[0]
        super().__init__(
            f"the raw root changed since the index: rematerialize raw_image_index for {source} "
            f"({key}: {detail}); nothing was published"
        )
        self.key, self.detail = key, detail


def locate(raw: Path, key: str) -> Path:
    """The real path (no symlinks left) of `key` under the raw root `raw`, checked to lie inside it."""
    return Path(Locator(raw).located(key))


class Locator:
    """`locate` for many keys of one raw root, resolving each folder's real path once."""

    def __init__(self, raw: Path) -> None:
        self.real_root = os.path.realpath(str(raw))
        # Both sides are real paths (normalised, absolute), so a prefix test suffices.
        self._inside = self.real_root if self.real_root.endswith(os.sep) else self.real_root + os.sep
        self._folders: dict[str, str] = {}

    def located(self, key: str) -> str:
        """`locate` as a str (the pool's items are str); a dangling symlink is `unreadable`."""
        problem = key_problem(key)
        if problem:
            raise Refused("unsafe_key", f"the key has {problem}; not read")
        folder, _, name = key.rpartition("/")
        real_folder = self._folders.get(folder)
        if real_folder is None:
            real_folder = self._folders[folder] = os.path.realpath(os.path.join(self.real_root, folder))
        listed = os.path.join(real_folder, name)
        is_link = os.path.islink(listed)
        real = os.path.realpath(listed) if is_link else listed
        if not (real == self.real_root or real.startswith(self._inside)):
            raise Refused(
                "outside_root",
                "a symlink on its path leads out of the raw root; not followed, the target was not opened",
            )
        if is_link and not os.path.lexists(real):
            raise Refused("unreadable", "a symbolic link to a file that does not exist")
        return real


def read_limited(path: str | Path, max_bytes: int, listed_etag: str | None = None) -> bytes:
    """The bytes of the located file `path`; `too_large` past `max_bytes`, `RawChanged` unless it is listed."""
    return read_with_stat(path, max_bytes, listed_etag)[0]


def read_with_stat(path: str | Path, max_bytes: int, listed_etag: str | None = None) -> tuple[bytes, os.stat_result]:
    """`read_limited` and the fstat of the file read; never follows a final symlink nor blocks on a FIFO."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as error:
        if listed_etag is not None and error.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            raise RawChanged("listed by the index, but gone or replaced by a link") from None
        if error.errno == errno.ELOOP:
            raise Refused("outside_root", "the file became a symlink after it was located; not followed") from None
        raise
    try:
        info = os.fstat(fd)
        _check_listed(info, listed_etag, "when opened")
        if not stat.S_ISREG(info.st_mode):
            raise Refused("unreadable", "not a regular file")
        if _opened_path(fd) not in (None, str(path)):
            raise Refused("outside_root", "a folder on its path became a symlink after it was located; not read")
        if info.st_size > max_bytes:
            raise Refused("too_large", f"{info.st_size} bytes, above the limit of {max_bytes}; not read")
        data = _read_regular_fd(fd, info.st_size, max_bytes)
        _check_listed(os.fstat(fd), listed_etag, "while it was read")
        return data, info
    finally:
        os.close(fd)


def read_regular(path: str) -> bytes:
    """The whole located regular file `path`, for a reader that checks the bytes itself."""
    fd = os.open(path, _OPEN_FLAGS)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Refused("unreadable", "not a regular file")
        return _read_regular_fd(fd, info.st_size)
    finally:
        os.close(fd)


def _read_regular_fd(fd: int, size: int, max_bytes: int | None = None) -> bytes:
    """The rest of the open regular file `fd` of size `size`, in chunks if it grew or read short."""
    limit = size if max_bytes is None else min(size, max_bytes)
    data = os.read(fd, limit + 1)
    if len(data) == size <= limit:
        return data
    chunks, total = [data], len(data)
    while True:
        if max_bytes is not None and total > max_bytes:
            raise Refused("too_large", f"more than {max_bytes} bytes (it grew while being read); not kept")
        block = os.read(fd, READ_CHUNK if max_bytes is None else min(READ_CHUNK, max_bytes + 1 - total))
        if not block:
            return b"".join(chunks)
        chunks.append(block)
        total += len(block)


def _opened_path(fd: int) -> str | None:
    """The path the kernel has for the open `fd` (None where there is no /proc to ask)."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None


def _check_listed(info: os.stat_result, listed_etag: str | None, when: str) -> None:
    if listed_etag is not None and local_etag(info) != listed_etag:
        raise RawChanged(f"its mtime-size is {local_etag(info)} {when}, the index listed {listed_etag}")
