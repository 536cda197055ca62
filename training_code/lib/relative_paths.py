"""Paths a manifest gives relative to its own folder: leading `..` segments then a safe key, resolved by
their text (never by following links), locally or on S3 alike."""

from __future__ import annotations

import os

from .object_keys import safe_relative_key
from .storage import is_s3, join, split_s3


def split_relative(path: str) -> tuple[int, str]:
    """(how many folders up, the key below there) of a manifest path; ValueError when it is not one."""
    parts = str(path).split("/")
    ups = 0
    while ups < len(parts) and parts[ups] == "..":
        ups += 1
    try:
        return ups, safe_relative_key("/".join(parts[ups:]))
    except ValueError as error:
        raise ValueError(f"manifest path {path!r} is not '../' segments then a safe key: {error}") from None


def resolve(folder: str | os.PathLike, path: str, root: str | os.PathLike | None = None) -> str:
    """Where the manifest path `path` points from `folder`; refused (ValueError) when it leaves `root`."""
    ups, key = split_relative(path)
    if is_s3(folder):
        bucket, prefix = split_s3(str(folder))
        parts = [p for p in prefix.split("/") if p]
        if ups > len(parts):
            raise ValueError(f"manifest path {path!r} leaves bucket {bucket} from {folder}")
        base = "/".join([f"s3://{bucket}", *parts[: len(parts) - ups]])
    else:
        base = os.path.normpath(os.path.join(os.path.abspath(folder), *[".."] * ups))
    where = join(base, key)
    if root is not None and not inside(where, root):
        raise ValueError(f"manifest path {path!r} in {folder} points at {where}, outside {root}")
    return where


def inside(uri: str, root: str | os.PathLike) -> bool:
    """Whether `uri` is `root` or lies under it (compared by text, after making local paths absolute)."""
    if is_s3(uri) or is_s3(root):
        return str(uri).rstrip("/") == str(root).rstrip("/") or str(uri).startswith(str(root).rstrip("/") + "/")
    return os.path.commonpath([os.path.abspath(uri), os.path.abspath(root)]) == os.path.abspath(root)
