r"""Decide which raw images and labels are fit to train on, and report every one that is not.

Processing job (the pass itself: lib/validation_pass.py). Reads `index.parquet` and the raw root it lists;
writes the accepted, quarantine, duplicates, rejected_labels and unmatched tables, `categories.json`, the
contact sheet, then `manifest.json` last. Fails without a manifest past --max-quarantine-rate, or when a
file changed since the index. Its read list (`planned_reads`) is worked out from tables alone, before launch.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from training_code.lib import job_env
from training_code.lib.coco import DEFAULT_MAX_ANNOTATION_BYTES
from training_code.lib.contact_sheet import Thumbnail
from training_code.lib.hashing import sha256_bytes
from training_code.lib.image_checks import DEFAULT_ALLOWED_FORMATS, DEFAULT_MAX_IMAGE_BYTES, DEFAULT_MAX_PIXELS
from training_code.lib.indexed_raw import INDEX_MANIFEST
from training_code.lib.inline_pictures import inline_picture, markdown_metadata
from training_code.lib.label_policy import STATE_MEANINGS, source_list
from training_code.lib.parquet_bytes import read_parquet_bytes
from training_code.lib.read_list import SCHEMA as ROWS
from training_code.lib.read_list import ReadList, read_list_of
from training_code.lib.reason_meanings import IMAGE_REASONS, LABEL_REASONS, meaning
from training_code.lib.storage import join, key_problem, read_bytes
from training_code.lib.validation_pass import PHASES, decode_part, decode_settings, validate
from training_code.lib.verdict_cache import NEVER_REUSED, VERDICTS_FILE

log = logging.getLogger("zero.validate")


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add(
        "--index",
        type=Path,
        help="folder holding index.parquet and manifest.json (the raw_image_index output; not read by --phase map)",
    )
    add("--reads", type=Path, help="the job's read list (reads.json, reads.parquet): the only raw images it may read")
    add(
        "--raw",
        type=Path,
        help="a local raw root to read instead of the one the index lists (at another path); never an S3 one",
    )
    add("--out", type=Path, required=True, help="folder for the tables, categories.json and manifest.json")
    add("--val-fraction", type=float, default=0.2, help="share of groups (not images) that go to val")
    add("--split-seed", type=int, default=0)
    add("--max-quarantine-rate", type=float, default=0.5, help="fail when quarantined/images_in is above this")
    add("--min-side", type=int, default=8, help="smallest upright width or height accepted, in pixels")
    add(
        "--allowed-formats",
        type=_formats,
        default=",".join(DEFAULT_ALLOWED_FORMATS),
        help="Pillow format names, comma-separated",
    )
    add("--workers", type=int, default=os.cpu_count() or 1, help="decode worker processes")
    add(
        "--timeout-s",
        type=float,
        default=20.0,
        help="decode time limit per file; past it the file is quarantined as timeout",
    )
    add(
        "--previous",
        help="an earlier run's output (a folder or an s3:// URI, read where it is: its manifest and verdicts only): "
        "verdicts of images whose key, etag and size are unchanged are reused",
    )
    add(
        "--max-image-bytes",
        type=int,
        default=DEFAULT_MAX_IMAGE_BYTES,
        help="larger image files are quarantined as too_large without being read",
    )
    add(
        "--max-pixels",
        type=int,
        default=DEFAULT_MAX_PIXELS,
        help="images whose header declares more pixels are quarantined as too_large without being decoded",
    )
    add(
        "--max-annotation-bytes",
        type=int,
        default=DEFAULT_MAX_ANNOTATION_BYTES,
        help="a larger annotations.json is not parsed: its source fails, as for any unusable annotations.json",
    )
    add(
        "--unlabelled-are-negatives",
        type=source_list,
        default="",
        help="sources (comma-separated) whose images with no entry in annotations.json are negatives (no boxes); "
        "elsewhere such an image is reported and not a training image",
    )
    add(
        "--unlabelled-sources",
        type=source_list,
        default="",
        help="sources (comma-separated) with no labels: annotations.json is not read, their images are validated "
        "and reported, never training images; any other source without a usable annotations.json fails",
    )
    add(
        "--phase",
        choices=PHASES,
        default="all",
        help="all: the whole pass on one host; map/reduce: the two stages of a multi-instance pass",
    )
    add("--decoded", type=Path, help="reduce: the map stage's output from every host")
    return parser


def _formats(text: str) -> tuple[str, ...]:
    formats = tuple(sorted({name.strip().upper() for name in text.split(",") if name.strip()}))
    if not formats:
        raise argparse.ArgumentTypeError("--allowed-formats needs at least one format name, e.g. JPEG,PNG")
    return formats


REASON_COLUMNS = {"reason": "reason code", "count": "how many", "meaning": "what the code means"}


def reason_table(by_reason: dict[str, int], meanings: dict[str, str]) -> dict[str, Any]:
    return job_env.table(
        [{"reason": r, "count": n, "meaning": meaning(r, meanings)} for r, n in by_reason.items()],
        columns=REASON_COLUMNS,
        types={"count": "int"},
    )  # typed even when nothing was rejected


def report_metadata(
    manifest: dict[str, Any], wall_s: float, work: dict[str, int], thumbnails: list[Thumbnail]
) -> dict[str, Any]:
    counts = manifest["counts"]
    plain = {name: value for name, value in counts.items() if isinstance(value, int)}
    return {
        **plain,
        "dagster/row_count": counts["accepted"],  # the rows of accepted.parquet: what the shards are built from
        "quarantine_rate": round(counts["quarantined"] / counts["images_in"], 4),
        "quarantined_by_reason": reason_table(counts["quarantined_by_reason"], IMAGE_REASONS),
        "labels_rejected_by_reason": reason_table(counts["labels_rejected_by_reason"], LABEL_REASONS),
        "accepted_by_annotation": reason_table(counts["accepted_by_annotation"], STATE_MEANINGS),
        "validator_version": manifest["validator_version"],
        **work,  # decoded + reused == images_in: how much of the pass was incremental
        "validate_wall_s": round(wall_s, 3),
        "quarantined_images_shown": len(thumbnails),
        **contact_sheet_entries(thumbnails),
    }


def contact_sheet_entries(thumbnails: list[Thumbnail]) -> dict[str, Any]:
    """One inline picture per quarantined image on the sheet, its reason and key under it."""
    captions = [f"{thumbnail.reason}: {thumbnail.key}" for thumbnail in thumbnails]
    return {
        f"quarantined_image_{number}": markdown_metadata(inline_picture(thumbnail.image(), caption, caption))
        for number, (thumbnail, caption) in enumerate(zip(thumbnails, captions), start=1)
    }


def planned_reads(inputs: Mapping[str, str], arguments: Mapping[str, Any]) -> ReadList:
    """The read list (images to decode) for a request's `inputs` (index) and `arguments`; runs before launch."""
    flags = [token for key, value in arguments.items() for token in (f"--{key.replace('_', '-')}", str(value))]
    args = get_args_parser().parse_args([*flags, "--out", "-"])
    return images_to_decode(inputs["index"], args.previous, decode_settings(args))


def images_to_decode(index_uri: str, previous_uri: str | None, decode_settings: dict[str, Any]) -> ReadList:
    """The read list of a run over the index at `index_uri`, by the verdict cache's rule: an image is decoded
    unless the output at `previous_uri` has a reusable verdict for its (key, etag, listed size) under the same
    decode settings; unsafe keys are left out."""
    manifest = json.loads(read_bytes(join(index_uri, INDEX_MANIFEST)))
    index = read_parquet_bytes(read_bytes(join(index_uri, "index.parquet")), ROWS.names).cast(ROWS)
    reusable = _reusable_verdicts(previous_uri, decode_settings)
    if reusable is not None:
        index = index.join(reusable, keys=["key", "etag", "size"], join_type="left anti")
    safe = pa.array([key_problem(key) is None for key in index.column("key").to_pylist()], pa.bool_())
    raw_uri, limit = str(manifest["raw_uri"]), int(decode_settings["max_image_bytes"])
    return read_list_of(raw_uri, index.filter(safe), limit, decode_settings)


def _reusable_verdicts(previous_uri: str | None, decode_settings: dict[str, Any]) -> pa.Table | None:
    """(key, etag, size) of the previous verdicts a run may reuse; None when none may be."""
    if previous_uri is None:
        return None
    try:
        previous = json.loads(read_bytes(join(previous_uri, "manifest.json")))
    except FileNotFoundError:
        return None  # an unfinished run: every image is decoded, as the job decides too
    if previous.get("decode_settings") != decode_settings:
        return None
    verdicts = read_parquet_bytes(
        read_bytes(join(previous_uri, VERDICTS_FILE)), ["key", "etag", "listed_size", "reason"]
    )
    kept = verdicts.filter(pc.invert(pc.is_in(pc.fill_null(verdicts.column("reason"), ""), pa.array(NEVER_REUSED))))
    return (
        kept.select(["key", "etag", "listed_size"])
        .rename_columns(["key", "etag", "size"])
        .cast(pa.schema([("key", pa.string()), ("etag", pa.string()), ("size", pa.int64())]))
    )


def main(args: argparse.Namespace) -> None:
    with job_env.pipes_session() as pipes:
        started = time.perf_counter()
        if args.phase == "map":  # a stage, not the asset: only the reduce stage reports a materialization
            part = decode_part(args)
            pipes.log.info(json.dumps({"event": "map", **part, "wall_s": round(time.perf_counter() - started, 3)}))
            return
        manifest, manifest_bytes, work, thumbnails = validate(args)
        wall_s = time.perf_counter() - started
        logged = "images_in accepted train val quarantined images_to_retry duplicates labels_accepted labels_rejected"
        log.info(
            "images in %d: accepted %d (train %d, val %d), quarantined %d (to retry %d), duplicates %d; "
            "labels accepted %d, rejected %d",
            *(manifest["counts"][name] for name in logged.split()),
        )
        pipes.report_asset_materialization(
            metadata=report_metadata(manifest, wall_s, work, thumbnails), data_version=sha256_bytes(manifest_bytes)
        )


if __name__ == "__main__":
    main(get_args_parser().parse_args())
