"""Reuse image verdicts from an earlier validation run for files that did not change.

A verdict is reused only when the key, the listing's etag and size, and every setting that can
change a verdict (validator version, Pillow version, min side, allowed formats, time limit) are the
same as when it was reached. `unreadable` verdicts are never reused: a file that could not be read
may be readable now (nor is the output that holds them: RETRIED_REASONS); nor are verdicts reached
without reading (`unsafe_key`, `outside_root`), which cost nothing to reach again and depend on more
than the key's own etag. Labels, duplicates and splits are always recomputed (no decoding needed).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import pandas as pd

from .image_checks import ImageVerdict
from .storage import exists, join, read_bytes
from .tables import VERDICTS, read_table
from .validated_files import VERDICTS_FILE

log = logging.getLogger("zero.validate")

NEVER_REUSED = frozenset({"unreadable", "unsafe_key", "outside_root"})
# Of those, the verdicts that are not the file's own fault (permissions, I/O errors): an output that
# holds any is never a cache hit either (validation_pass.retry_next_time), so the next run of its
# source decodes exactly these again.
RETRIED_REASONS = frozenset({"unreadable"})


def verdict_frame(index: pd.DataFrame, verdicts: dict[str, ImageVerdict]) -> pd.DataFrame:
    """One VERDICTS row per index row, in index order."""
    keys = index["key"].tolist()
    rows = [verdicts[key] for key in keys]
    # Column by column (a dict a row was most of this function's time). The table has no nulls: it
    # stores a missing sha256 or reason as "" and missing hashes as [], which read_verdicts undoes.
    columns = {name: [getattr(verdict, name) for verdict in rows] for name in ImageVerdict._fields}
    columns.update(
        sha256=[value or "" for value in columns["sha256"]],
        reason=[value or "" for value in columns["reason"]],
        phash=[list(value or ()) for value in columns["phash"]],
        dhash=[list(value or ()) for value in columns["dhash"]],
    )
    frame = pd.DataFrame(
        {"key": keys, "etag": index["etag"].tolist(), "listed_size": index["size"].astype("int64").tolist(), **columns},
        columns=list(VERDICTS.columns),
    )
    if not rows:  # a host given no image of a small source: empty, with the schema's column types
        frame = frame.astype(
            {name: str(column.dtype) for name, column in VERDICTS.columns.items() if column.dtype is not None}
        )
    return frame


def load_reusable(
    previous: str | os.PathLike, decode_settings: dict[str, Any]
) -> dict[tuple[str, str, int], ImageVerdict]:
    """(key, etag, listed_size) -> verdict from the previous run's output (a folder or an s3:// URI, read
    where it is: its manifest.json and verdicts table, nothing else of it), or {} when nothing there may
    be reused."""
    manifest_uri = join(previous, "manifest.json")
    if not exists(manifest_uri):
        log.warning("--previous %s has no manifest.json (an unfinished run): every image is decoded", previous)
        return {}
    manifest = json.loads(read_bytes(manifest_uri))
    earlier = manifest.get("decode_settings")
    if earlier != decode_settings:
        log.info(
            "decode settings changed since %s (%s -> %s): every image is decoded", previous, earlier, decode_settings
        )
        return {}
    reusable = read_verdicts(join(previous, VERDICTS_FILE))
    return {identity: verdict for identity, verdict in reusable.items() if verdict.reason not in NEVER_REUSED}


def read_verdicts(path: str | os.PathLike) -> dict[tuple[str, str, int], ImageVerdict]:
    """(key, etag, listed_size) -> verdict from a VERDICTS table (a run's, or one host's part of a map stage)."""
    table = read_table(path, VERDICTS)
    columns = {name: table[name].tolist() for name in ImageVerdict._fields}
    # The nulls verdict_frame stored as "" and []: an accepted verdict has its hashes, a quarantined one none.
    for name in ("phash", "dhash"):
        columns[name] = [None if reason else tuple(map(int, h)) for reason, h in zip(columns["reason"], columns[name])]
    columns.update(
        sha256=[value or None for value in columns["sha256"]], reason=[value or None for value in columns["reason"]]
    )
    identities = zip(table["key"].tolist(), table["etag"].tolist(), table["listed_size"].tolist())
    return dict(zip(identities, map(ImageVerdict._make, zip(*columns.values()))))


def split_reused(
    index: pd.DataFrame, reusable: dict[tuple[str, str, int], ImageVerdict]
) -> tuple[dict[str, ImageVerdict], list[str]]:
    """The verdicts reused for this index, and the keys that must be decoded (new or changed)."""
    reused, to_decode = {}, []
    for key, etag, listed_size in zip(index["key"].tolist(), index["etag"].tolist(), index["size"].tolist()):
        verdict = reusable.get((key, etag, listed_size))
        if verdict is None:
            to_decode.append(key)
        else:
            reused[key] = verdict
    return reused, to_decode
