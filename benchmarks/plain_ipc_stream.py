r"""The baseline of `pack_small`: the selected rows written as one plain `pyarrow.ipc` stream, in a fresh process.

    python -m benchmarks.plain_ipc_stream SELECTION RAW OUT

What anyone would write: read the selection, read each selected file's bytes, and write the same rows
as the shards hold (image struct, format, size, boxes, category ids and names, source, key, sha256) in
batches of 64 rows. Prints `{"rows": N, "seconds": S}`, S timing that work alone (not the interpreter
or its imports). A process of its own, as the project's packing workers are: in a process that has
already held and freed a few hundred MB (an earlier benchmark, an earlier round), the same stream
took 0.63-0.75 s against 0.92-2.5 s fresh (it then reuses freed heap pages instead of faulting in new
ones), so the ratio depended on what ran before it.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from training_code.lib.shard_format import IMAGE_TYPE


def plain_stream(selection: Path, raw: Path, out: Path) -> int:
    """The same rows as one pyarrow IPC stream: what anyone would write. Returns the rows written."""
    table = pq.read_table(selection / "selection.parquet")
    keys = table.column("key").to_pylist()
    images = pa.array([(raw / key).read_bytes() for key in keys], pa.binary())
    image = pa.StructArray.from_arrays([images, pa.nulls(len(keys), pa.string())], fields=list(IMAGE_TYPE))
    names = table.column("category_names").combine_chunks()
    ids = pa.ListArray.from_arrays(
        names.offsets, pc.add(pc.index_in(pc.list_flatten(names), value_set=pa.array(["part"])), 1)
    )
    rows = pa.table(
        {
            "image": image,
            "image_format": table.column("format"),
            "width": table.column("width"),
            "height": table.column("height"),
            "boxes": table.column("boxes"),
            "category_ids": ids,
            "category_names": names,
            "source": table.column("source"),
            "key": table.column("key"),
            "sha256": table.column("sha256"),
        }
    )
    with pa.OSFile(str(out), "wb") as sink, pa.ipc.new_stream(sink, rows.schema) as writer:
        writer.write_table(rows, max_chunksize=64)
    return rows.num_rows


def main(selection: str, raw: str, out: str) -> None:
    started = time.perf_counter()
    rows = plain_stream(Path(selection), Path(raw), Path(out))
    print(json.dumps({"rows": rows, "seconds": time.perf_counter() - started}))


if __name__ == "__main__":
    main(*sys.argv[1:4])
