"""Read the raw root's object list from an S3 Inventory report instead of listing the bucket.

At hundreds of millions of keys a daily Inventory report is cheaper and faster than LIST calls.
The report's `manifest.json` names its data files (CSV, gzip-compressed, or Parquet) and their
columns; the rows for the raw root's bucket and prefix become the same `ObjectInfo`s a listing gives.
The report is as old as its date: objects written since then are not in it.
"""

from __future__ import annotations

import gzip
import io
import json
from typing import Iterator
from urllib.parse import unquote_plus

import pandas as pd

from training_code.lib.storage import ObjectInfo, read_bytes, split_s3

REQUIRED_FIELDS = ("Bucket", "Key", "Size", "ETag")


def list_from_inventory(manifest_uri: str, raw_uri: str) -> Iterator[ObjectInfo]:
    """Every object of the report under `raw_uri` (an s3:// URI), sorted by key, keys relative to it."""
    manifest = json.loads(read_bytes(manifest_uri))
    bucket, prefix = split_s3(raw_uri)
    if manifest.get("sourceBucket") != bucket:
        raise ValueError(f"{manifest_uri}: inventory of bucket {manifest.get('sourceBucket')!r}, but the raw root is in {bucket!r}")
    file_format = manifest.get("fileFormat")
    if file_format not in ("CSV", "Parquet"):
        raise ValueError(f"{manifest_uri}: fileFormat {file_format!r} is not supported; configure the report as CSV or Parquet")
    fields = [name.strip() for name in manifest.get("fileSchema", "").split(",")] if file_format == "CSV" else None
    if fields is not None and (missing := [f for f in REQUIRED_FIELDS if f not in fields]):
        raise ValueError(f"{manifest_uri}: the report lacks the fields {missing}; add Size and ETag to the inventory configuration")
    destination = manifest["destinationBucket"].removeprefix("arn:aws:s3:::")
    base = f"{prefix}/" if prefix else ""
    objects = []
    for data_file in manifest["files"]:
        frame = _read_data_file(read_bytes(f"s3://{destination}/{data_file['key']}"), file_format, fields)
        frame = frame[frame["bucket"] == bucket]
        for key, size, etag in zip(frame["key"], frame["size"], frame["e_tag"]):
            if key.startswith(base) and not key.endswith("/"):
                objects.append(ObjectInfo(key[len(base) :], int(size), str(etag).strip('"')))
    yield from sorted(objects, key=lambda o: o.key)


def _read_data_file(raw: bytes, file_format: str, fields: list[str] | None) -> pd.DataFrame:
    if file_format == "Parquet":
        frame = pd.read_parquet(io.BytesIO(raw))
        # Parquet reports use snake_case columns and plain (not URL-encoded) keys.
        return frame.rename(columns={"ETag": "e_tag", "etag": "e_tag"})
    frame = pd.read_csv(io.BytesIO(gzip.decompress(raw)), header=None, names=fields, dtype=str, keep_default_na=False)
    frame = frame.rename(columns={"Bucket": "bucket", "Key": "key", "Size": "size", "ETag": "e_tag"})
    frame["key"] = frame["key"].map(unquote_plus)  # CSV reports URL-encode keys
    return frame
