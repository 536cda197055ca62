"""Object keys: which keys may name a file under a root, how any key is written printably, and the
(key, size, etag) a listing gives for each object.

`storage` joins keys onto roots only through `safe_relative_key`, so a key from a raw root, an index
or a manifest can never reach a file outside the root or another object's file.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

# What a key may not hold: control characters, backslashes (a separator elsewhere, and printable_key's
# escape) and lone surrogates (undecodable name bytes, as os.listdir hands them over).
_UNSAFE_CHARS = re.compile(r"[\x00-\x1f\x7f\\\ud800-\udfff]")


@dataclass(frozen=True)
class ObjectInfo:
    key: str  # relative to the listed root, "/"-separated
    size: int
    etag: str


def local_etag(info: os.stat_result) -> str:
    """The etag a local file is listed with, `<mtime_ns>-<size>`, which a reader compares with its
    fstat to know it reads the file the listing saw."""
    return f"{info.st_mtime_ns}-{info.st_size}"


def safe_relative_key(key: str) -> str:
    """`key` itself when it is safe to join onto a root (see `key_problem`), else a ValueError saying why."""
    problem = key_problem(key)
    if problem:
        raise ValueError(f"unsafe object key {printable_key(key)!r}: {problem}")
    return key


def key_problem(key: str) -> str | None:
    """Why `key` cannot name a file under a root, or None when it can.

    A safe key is already canonical: no `..`, `.` or empty segment, not absolute. Keys are never
    normalised, since on S3 `a/./b`, `a//b` and `a/b` are different objects; such keys are refused."""
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
    """`key` with backslashes, control characters and undecodable bytes written as escapes (`\\`,
    `\\x0a`, `\\xff`): one line of valid UTF-8 that a table can store, and distinct for distinct keys.
    Safe keys come back unchanged; an escaped one holds a backslash, so it is never a safe key."""
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
