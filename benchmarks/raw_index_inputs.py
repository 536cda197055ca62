"""A raw index over a whole raw root, in the layout the validation job reads: the benchmarks validate
every source in one pass, where the graph runs one partition per source."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from training_code.lib.raw_index import INDEX_FILE, MANIFEST, whole_root_manifest, write_source_index
from training_code.lib.tables import RAW_INDEX, write_table
from zero_assets.defs.change_detection.raw_sources import list_sources


def index_folder(raw: Path, work: Path, out: Path) -> Path:
    """Index each source of `raw` under `work/<source>` (write_source_index, as each partition's run
    does), then write their rows as one `out/index.parquet`; returns `out`."""
    frames = []
    for source in list_sources(str(raw)):
        write_source_index(str(raw), source, work / source)
        frames.append(pd.read_parquet(work / source / INDEX_FILE))
    write_table(pd.concat(frames, ignore_index=True), RAW_INDEX, out / INDEX_FILE)
    (out / MANIFEST).write_text(json.dumps(whole_root_manifest(str(raw), list_sources(str(raw)))))
    return out
