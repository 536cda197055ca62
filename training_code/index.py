r"""Index one source of the raw root into `index.parquet` and `manifest.json`, in bounded memory.

Processing job for sources too large for the Dagster process (lib/raw_index); lists `<raw>/<source>/` (or
reads an S3 Inventory report), never an image. `--out`: a folder or s3:// prefix. Reports the manifest's
counts, data version the sha256 of its bytes.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from typing import Any

from training_code.lib import job_env
from training_code.lib.coco import DEFAULT_MAX_ANNOTATION_BYTES
from training_code.lib.hashing import sha256_bytes
from training_code.lib.raw_index import MANIFEST, write_source_index
from training_code.lib.storage import join, read_bytes

log = logging.getLogger("zero.index")


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--raw", required=True, help="the raw root (local folder or s3://bucket/prefix); only listed")
    add("--source", required=True, help="the source: one top-level folder of the raw root")
    add("--out", required=True, help="folder or s3:// prefix for index.parquet and manifest.json")
    add("--group-pattern", default="", help="regex naming an image's split group (empty: its folder)")
    add(
        "--max-annotation-bytes",
        type=int,
        default=DEFAULT_MAX_ANNOTATION_BYTES,
        help="a larger annotations.json is not parsed; the source's images are indexed without annotations",
    )
    add("--inventory-manifest", help="an S3 Inventory report's manifest.json: read it instead of listing")
    add("--sample-images", type=int, help="the rehearsal sample: about this many images, whole groups")
    return parser


def check_args(args: argparse.Namespace) -> None:
    problems = []
    if args.max_annotation_bytes < 1:
        problems.append(f"--max-annotation-bytes {args.max_annotation_bytes} must be at least 1")
    if args.sample_images is not None and args.sample_images < 1:
        problems.append(f"--sample-images {args.sample_images} must be at least 1 (leave it out for no sample)")
    if problems:
        raise ValueError("; ".join(problems))


def report_metadata(manifest: dict[str, Any], wall_s: float) -> dict[str, Any]:
    """The manifest's counts; `images` (the index's rows) as `dagster/row_count`, `bytes` as `image_bytes`."""
    plain = {
        name: value
        for name, value in manifest.items()
        if isinstance(value, (int, str)) and not isinstance(value, bool) and name not in ("images", "bytes")
    }
    return {
        **plain,
        "dagster/row_count": manifest["images"],
        "image_bytes": manifest["bytes"],
        "annotation_error": manifest["annotation_error"] or "",
        "index_wall_s": round(wall_s, 3),
        "examples": {"raw_value": json.dumps(manifest["examples"]), "type": "json"},
    }


def main(args: argparse.Namespace) -> None:
    with job_env.pipes_session() as pipes:
        check_args(args)
        started = time.perf_counter()
        manifest = write_source_index(
            args.raw,
            args.source,
            args.out,
            group_pattern=args.group_pattern,
            max_annotation_bytes=args.max_annotation_bytes,
            inventory_manifest_uri=args.inventory_manifest,
            sample_images=args.sample_images,
        )
        wall_s = time.perf_counter() - started
        if manifest["annotation_error"]:  # the source's images are indexed without annotations; validation reports them
            log.error("source %r: %s", args.source, manifest["annotation_error"])
        counts = (manifest[name] for name in ("images", "bytes", "groups", "ignored_files", "unsafe_keys"))
        log.info(
            "source %r: %d images (%d bytes) in %d groups, %d ignored files, %d unsafe keys, in %.1f s",
            args.source,
            *counts,
            wall_s,
        )
        pipes.report_asset_materialization(
            metadata=report_metadata(manifest, wall_s), data_version=sha256_bytes(read_bytes(join(args.out, MANIFEST)))
        )


if __name__ == "__main__":
    main(get_args_parser().parse_args())
