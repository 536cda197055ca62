"""Read the raw root's object list from an S3 Inventory report instead of listing the bucket.

At hundreds of millions of keys a daily Inventory report is cheaper and faster than LIST calls.
The report's `manifest.json` names its data files (CSV, gzip-compressed, or Parquet) and their
columns; the rows for the raw root's bucket and prefix become the same `ObjectInfo`s a listing gives,
streamed in key order in bounded memory (training_code/lib/raw_index_inventory.py, which the index job
uses too). The report is as old as its date: objects written since then are not in it.
"""

from __future__ import annotations

from typing import Iterator

from training_code.lib.raw_index_inventory import REQUIRED_FIELDS, inventory_objects, read_inventory_manifest
from training_code.lib.storage import ObjectInfo

__all__ = ["REQUIRED_FIELDS", "list_from_inventory", "read_inventory_manifest"]


def list_from_inventory(manifest_uri: str, raw_uri: str, under: str = "") -> Iterator[ObjectInfo]:
    """Every object of the report under `raw_uri` (an s3:// URI), sorted by key, keys relative to it;
    with `under` ("<source>/"), only the keys that start with it."""
    return inventory_objects(manifest_uri, raw_uri, under)
