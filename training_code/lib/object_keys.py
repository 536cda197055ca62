"""Object keys: which keys may name a file under a root, how any key is written printably, and
the (key, size, etag) a listing gives. `storage` joins keys onto roots only through `safe_relative_key`."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

# What a key may not hold: control characters, backslashes (printable_key's escape), lone surrogates (undecodable).
_UNSAFE_CHARS = re.compile(r"[\x00-\x1f\x7f\\\ud800-\udfff]")


@dataclass(frozen=True)
class ObjectInfo:
    key: str  # relative to the listed root, "/"-separated
    size: int
    etag: str


def local_etag(info: os.stat_result) -> str:
    """The etag a local file is listed with, `<mtime_ns>-<size>`, for a reader's fstat to compare."""
    return f"{info.st_mtime_ns}-{info.st_size}"


def safe_relative_key(key: str) -> str:
    """`key` itself when it is safe to join onto a root (see `key_problem`), else a ValueError saying why."""
    problem = key_problem(key)
    if problem:
        raise ValueError(f"unsafe object key {printable_key(key)!r}: {problem}")
    return key


def key_problem(key: str) -> str | None:
    """Why `key` cannot name a file under a root (never normalised: on S3 `a/./b` is another object), or None."""
    if not key:
        return "empty"
    if _UNSAFE_CHARS.search(key):
        return "control characters, backslashes or bytes that are not UTF-8"
    if key.startswith("/"):
        return "absolute"
    segments = key.split("/")
    if ".." in segments:
        return "a '..' segment"
    if "." in segments or "" in segments:
        return "a '.' or empty segment (it names another object's file once normalised)"
    return None


def printable_key(key: str) -> str:
    """`key` with backslashes, control characters and undecodable bytes escaped: distinct, never a safe key."""
    if not _UNSAFE_CHARS.search(key):
        return key
    out = []
    for char in key:
        code = ord(char)
        if char == "\\":
            out.append("\\\\")
        elif 0xDC80 <= code <= 0xDCFF:  # os.fsdecode's stand-in for the byte code - 0xDC00
            out.append(f"\\x{code - 0xDC00:02x}")
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif 0xD800 <= code <= 0xDFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(char)
    return "".join(out)
