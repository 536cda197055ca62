"""`pack_small`: packing 20,000 small images against a plain `pyarrow.ipc` stream of the same rows (goal >= 0.6).

ratio = baseline seconds / project seconds, in this process, files in the page cache. The project is
the shard job's `build_shards` on a training set selecting all of them (one box each), 2 workers, as
`arrow_shards` runs it: the plan, each image's sha256 checked against what validation recorded, the
labels mapped to the manifest's category ids, shards hashed and named by their content, rows.parquet,
masked.parquet, the Hugging Face files and the manifest. The baseline reads the selection and the same
files and writes the same rows (image struct, format, size, boxes, category ids and names, source, key,
sha256) as one IPC stream in batches of 64 rows. Small files are where per-row work shows: each image
is about 17 KB. Runs interleave and the best of each counts.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from training_code.lib.shard_format import IMAGE_TYPE, MANIFEST
from training_code.shard import build_shards

from .images import best_of_interleaved
from .report import BenchResult
from .shard_inputs import validated_folder
from .small_images import small_source

IMAGES, WORKERS, RUNS, SOURCE = 20_000, 2, 3, "cam"


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


def run() -> list[BenchResult]:
    with tempfile.TemporaryDirectory(prefix="bench-pack-small-") as tmp:
        work = Path(tmp)
        raw, written = small_source(SOURCE, IMAGES)
        photos = [(path, 258, 193) for path, _ in written]
        selection = validated_folder(photos, raw, work / "selection")

        def baseline() -> None:
            if plain_stream(selection, raw, work / "plain.arrow") != IMAGES:
                raise RuntimeError("the plain stream lost rows")

        def project() -> None:
            shutil.rmtree(work / "shards", ignore_errors=True)
            manifest, _ = build_shards(selection, raw, work / "shards", 1_000_000_000, workers=WORKERS)
            if sum(manifest["rows"].values()) != IMAGES or not (work / "shards" / MANIFEST).is_file():
                raise RuntimeError(f"the shard set holds {manifest['rows']} rows, not {IMAGES}")

        baseline_s, project_s = best_of_interleaved(RUNS, baseline, project)
        megabytes = sum(size for _, size in written) / 1e6
    return [
        BenchResult(
            "pack_small",
            baseline_s / project_s,
            ">=0.6",
            {
                "baseline_s": baseline_s,
                "project_s": project_s,
                "images": IMAGES,
                "MB": megabytes,
                "workers": WORKERS,
                "project_us_per_image": 1e6 * project_s / IMAGES,
            },
        )
    ]
