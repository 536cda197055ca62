"""`shard_bytes_selected`: what arrow_shards writes against the bytes of the images it was asked for,
selecting 10% of a 10-source lake (goal <= 1.1).

ratio = bytes of the shard set (every file `build_shards` writes: the shards, rows.parquet,
masked.parquet, the Hugging Face files and the manifest) / bytes of the selected raw images. The lake
is 10 sources of 1,000 small JPEGs (`small_images`, about 17 KB each, one box each). Each source goes
through what its assets run: the index (`write_source_index`, as raw_image_index) and the validation
job (`python -m training_code.validate`, as the local backend launches it); then the selection job
(`python -m training_code.selection`, with `max_images` a tenth of the lake shared by the sources) and the
shard job (`build_shards`). Had every accepted image been packed and the selection made afterwards, the
ratio would have been `lake_over_selected`, at the least.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq

from training_code.lib.raw_index import write_source_index
from training_code.lib.selection_plan import DEFAULT_POLICY, SelectionPlan, SelectionPolicy, write_plan
from training_code.lib.training_set import SELECTION
from training_code.shard import build_shards

from .report import BenchResult
from .scripts import run_script
from .small_images import add_small_images, small_pictures

SOURCES, IMAGES_PER_SOURCE, SHARE, WORKERS = 10, 1_000, 0.1, 2


def validated_source(raw: Path, source: str, work: Path) -> dict[str, str]:
    """The source's index and validation, as its assets write them; the validated set, as a plan names it."""
    write_source_index(str(raw), source, work / f"index-{source}")
    out = work / f"validated-{source}"
    job = [sys.executable, "-m", "training_code.validate", "--index", str(work / f"index-{source}")]
    job += ["--raw", str(raw), "--out", str(out), "--workers", str(WORKERS)]
    run_script(job, f"validation of {source}")
    return {"source": source, "validated_uri": str(out), "data_version": f"bench-{source}"}


def run() -> list[BenchResult]:
    with tempfile.TemporaryDirectory(prefix="bench-shard-bytes-") as tmp:
        work = Path(tmp)
        raw = work / "raw"
        pictures = small_pictures()
        sources = [f"site_{n:02d}" for n in range(SOURCES)]
        lake_bytes = 0
        for source in sources:
            lake_bytes += sum(size for _, size in add_small_images(raw, source, 0, IMAGES_PER_SOURCE, pictures))
        chosen = [validated_source(raw, source, work) for source in sources]
        selection = work / "training_set"
        policy = SelectionPolicy(max_images=int(SHARE * SOURCES * IMAGES_PER_SOURCE))
        write_plan(str(work / "plan"), SelectionPlan(chosen, policy, {}, str(raw)), DEFAULT_POLICY.read_text())
        job = [sys.executable, "-m", "training_code.selection", "--plan", str(work / "plan"), "--out", str(selection)]
        run_script(job, "the selection")
        selected = pq.read_table(selection / SELECTION, columns=["size"])
        selected_bytes = pc.sum(selected.column("size")).as_py()

        out = work / "arrow_shards"
        manifest, _ = build_shards(selection, raw, out, 1_000_000_000, workers=WORKERS)
        if sum(manifest["rows"].values()) != selected.num_rows:
            raise RuntimeError(f"the shard set holds {manifest['rows']} rows, not the {selected.num_rows} selected")
        shard_bytes = sum(entry["bytes"] for entry in manifest["shards"])
        written = sum(path.stat().st_size for path in out.rglob("*") if path.is_file())
    return [
        BenchResult(
            "shard_bytes_selected",
            written / selected_bytes,
            "<=1.1",
            {
                "written_MB": written / 1e6,
                "shards_MB": shard_bytes / 1e6,
                "selected_MB": selected_bytes / 1e6,
                "selected": selected.num_rows,
                "lake_images": SOURCES * IMAGES_PER_SOURCE,
                "sources": SOURCES,
                "shards_over_selected": shard_bytes / selected_bytes,
                "lake_over_selected": lake_bytes / selected_bytes,
            },
        )
    ]
