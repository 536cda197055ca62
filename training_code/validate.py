r"""Decide which raw images and labels are fit to train on, and report every one that is not.

    python -m training_code.validate --index DIR --raw DIR --out DIR [--val-fraction 0.2] [--split-seed 0] \
        [--max-quarantine-rate 0.5] [--min-side 8] \
        [--allowed-formats JPEG,PNG,GIF,WEBP,BMP,TIFF,MPO] [--workers N] [--timeout-s 20] [--previous DIR] \
        [--max-image-bytes 134217728] [--max-pixels 1000000000] [--max-annotation-bytes 1073741824] \
        [--phase all|map|reduce] [--decoded DIR]

A SageMaker Processing job script. Reads `index.parquet` (one row per raw image) and the raw root
(read-only), decodes every image in isolated worker processes, checks each COCO box in the upright
frame, drops exact duplicates and assigns train/val by group. Writes accepted, quarantine,
duplicates, rejected_labels and unmatched tables, `categories.json`, the quarantine's contact sheet
(`quarantine_contact_sheet.png`, when a quarantined image still decodes), then `manifest.json` last.
Fails without a manifest when more images are quarantined than --max-quarantine-rate allows.
With --previous (an earlier run's output) only new or changed images are decoded: see verdict_cache.

The raw root is untrusted: an unsafe key, a symlink out of the root or a file past the size limits
costs that file one verdict (`unsafe_key`, `outside_root`, `too_large`) and is never read or decoded;
an annotations file that cannot be used costs its source its labels, named in the unmatched table.

On several instances the pass is two jobs (zero_assets/core/job_request.py `fan_out`): `--phase map` on
every instance decodes the images of this host's part of the raw input (split by S3 key) and writes
`verdicts-<host>.parquet`, the thumbnails of its quarantined files (`thumbnails-<host>.parquet`) and
the annotation files it received; `--phase reduce` on one instance reads them all from --decoded and
decides as the single-host pass does, so both write the same manifest.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd
import PIL
import simplejpeg

from training_code.lib import job_env
from training_code.lib.annotation_files import copy_annotation_files, load_annotations
from training_code.lib.coco import DEFAULT_MAX_ANNOTATION_BYTES
from training_code.lib.contact_sheet import (
    DRAWABLE_REASONS,
    SHEET_FILE,
    Thumbnail,
    contact_sheet_png,
    quarantine_thumbnails,
    read_thumbnails,
    thumbnails_frame,
)
from training_code.lib.hashing import sha256_bytes
from training_code.lib.image_checks import (
    DEFAULT_ALLOWED_FORMATS,
    DEFAULT_MAX_IMAGE_BYTES,
    DEFAULT_MAX_PIXELS,
    ImageVerdict,
    check_image_file,
)
from training_code.lib.inline_pictures import inline_picture, markdown_metadata
from training_code.lib.isolated_pool import IsolatedPool, WorkerLost
from training_code.lib.raw_files import Refused, locate, read_limited
from training_code.lib.reason_meanings import IMAGE_REASONS, LABEL_REASONS, meaning
from training_code.lib.storage import key_problem, write_bytes_atomic
from training_code.lib.tables import RAW_INDEX, VERDICTS, read_table, write_table
from training_code.lib.validation_outputs import build_outputs, write_outputs
from training_code.lib.verdict_cache import VERDICTS_FILE, load_reusable, read_verdicts, split_reused, verdict_frame

log = logging.getLogger("zero.validate")

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "zero-validated/1"
# Bump when a change here or in image_checks/labels could change a verdict, so cached verdicts are redone.
VALIDATOR_VERSION = "validate-4"  # 4: JPEGs decoded strictly (corrupt_data)
PROGRESS_EVERY_S = 10.0
PHASES = ("all", "map", "reduce")
MAP_ANNOTATIONS = "annotations"  # map output: the annotation files this host received, by source


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--index", type=Path, required=True, help="folder holding index.parquet (the raw_image_index output)"
    )
    parser.add_argument(
        "--raw",
        type=Path,
        default=None,
        help="the raw root: <raw>/<source>/... and <raw>/<source>/annotations.json (map: this host's part)",
    )
    parser.add_argument(
        "--out", type=Path, required=True, help="folder for the tables, categories.json and manifest.json"
    )
    parser.add_argument("--val-fraction", type=float, default=0.2, help="share of groups (not images) that go to val")
    parser.add_argument("--split-seed", type=int, default=0)
    parser.add_argument(
        "--max-quarantine-rate", type=float, default=0.5, help="fail when quarantined/images_in is above this"
    )
    parser.add_argument("--min-side", type=int, default=8, help="smallest upright width or height accepted, in pixels")
    parser.add_argument(
        "--allowed-formats",
        type=_formats,
        default=",".join(DEFAULT_ALLOWED_FORMATS),
        help="Pillow format names, comma-separated",
    )
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="decode worker processes")
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=20.0,
        help="decode time limit per file; past it the file is quarantined as timeout",
    )
    parser.add_argument(
        "--previous",
        type=Path,
        default=None,
        help="an earlier run's output folder: verdicts of images whose key, etag and size are unchanged are reused",
    )
    parser.add_argument(
        "--max-image-bytes",
        type=int,
        default=DEFAULT_MAX_IMAGE_BYTES,
        help="larger image files are quarantined as too_large without being read",
    )
    parser.add_argument(
        "--max-pixels",
        type=int,
        default=DEFAULT_MAX_PIXELS,
        help="images whose header declares more pixels are quarantined as too_large without being decoded",
    )
    parser.add_argument(
        "--max-annotation-bytes",
        type=int,
        default=DEFAULT_MAX_ANNOTATION_BYTES,
        help="a larger annotations.json is not parsed; its source's images are reported without annotations",
    )
    parser.add_argument(
        "--phase",
        choices=PHASES,
        default="all",
        help="all: the whole pass on one host; map/reduce: the two stages of a multi-instance pass",
    )
    parser.add_argument("--decoded", type=Path, default=None, help="reduce: the map stage's output from every host")
    return parser


def _formats(text: str) -> tuple[str, ...]:
    formats = tuple(sorted({name.strip().upper() for name in text.split(",") if name.strip()}))
    if not formats:
        raise argparse.ArgumentTypeError("--allowed-formats needs at least one format name, e.g. JPEG,PNG")
    return formats


def check_args(args: argparse.Namespace) -> None:
    """Fail before any work on settings that cannot be right."""
    problems = [
        f"--{name} {value} must be {rule}"
        for name, value, ok, rule in [
            ("val-fraction", args.val_fraction, 0 <= args.val_fraction <= 1, "within [0, 1]"),
            ("max-quarantine-rate", args.max_quarantine_rate, 0 <= args.max_quarantine_rate <= 1, "within [0, 1]"),
            ("min-side", args.min_side, args.min_side >= 1, "at least 1"),
            ("workers", args.workers, args.workers >= 1, "at least 1"),
            ("timeout-s", args.timeout_s, args.timeout_s > 0, "positive"),
            ("max-image-bytes", args.max_image_bytes, args.max_image_bytes >= 1, "at least 1"),
            ("max-pixels", args.max_pixels, args.max_pixels >= 1, "at least 1"),
            ("max-annotation-bytes", args.max_annotation_bytes, args.max_annotation_bytes >= 1, "at least 1"),
        ]
        if not ok
    ]
    if args.phase == "reduce" and args.decoded is None:
        problems.append("--phase reduce needs --decoded (the map stage's output)")
    if args.phase != "reduce" and args.raw is None:
        problems.append(f"--phase {args.phase} needs --raw (the raw root)")
    if problems:
        raise ValueError("; ".join(problems))


def load_index(index_dir: Path) -> pd.DataFrame:
    index = read_table(index_dir / "index.parquet", RAW_INDEX).sort_values("key", kind="stable").reset_index(drop=True)
    if index.empty:
        raise ValueError(f"{index_dir / 'index.parquet'} lists no images; check the raw root the index was built from")
    for source, key in zip(index["source"], index["key"]):
        # Unsafe keys stay (each gets its unsafe_key verdict); a key outside its source is a broken index.
        if not key.startswith(f"{source}/"):
            raise ValueError(f"{index_dir / 'index.parquet'}: key {key!r} is not under its source folder {source!r}/")
    return index


def decode_all(
    raw: Path, keys: list[str], args: argparse.Namespace, check: Callable[..., ImageVerdict] = check_image_file
) -> dict[str, ImageVerdict]:
    """A verdict per key, decoded in isolated workers. `check` is injectable so tests can hang or crash one.

    Each key is located first (`raw_files.locate`): one that is unsafe or leads out of the raw root
    gets its verdict here and is never opened. Keys that are the same file (a symlink inside the
    root) are decoded once."""
    limits = {"max_bytes": args.max_image_bytes, "max_pixels": args.max_pixels}
    function = partial(check, allowed_formats=args.allowed_formats, min_side=args.min_side, **limits)
    verdicts: dict[str, ImageVerdict] = {}
    keys_at: dict[str, list[str]] = defaultdict(list)  # located path -> keys
    for key in keys:
        try:
            keys_at[str(locate(raw, key, via_links=args.phase == "map"))].append(key)
        except Refused as refused:
            verdicts[key] = ImageVerdict.unread(refused.reason, refused.detail)
    if not keys_at:
        return verdicts
    started = last_log = time.monotonic()
    workers = max(1, min(args.workers, len(keys_at)))
    with IsolatedPool(function, workers=workers, timeout_s=args.timeout_s, preload=[check.__module__]) as pool:
        log.info("started %d decode workers in %.1f s", workers, time.monotonic() - started)
        for path, outcome in pool.imap_unordered(keys_at):
            verdict = (
                _verdict_for_lost(Path(path), outcome, args.max_image_bytes)
                if isinstance(outcome, WorkerLost)
                else outcome
            )
            verdicts.update({key: verdict for key in keys_at[path]})
            if time.monotonic() - last_log > PROGRESS_EVERY_S:
                last_log = time.monotonic()
                log.info(
                    "decoded %d/%d files (%.0f files/s)", len(verdicts), len(keys), len(verdicts) / (last_log - started)
                )
    log.info(
        "decoded %d files in %.1f s with %d workers (%d replaced after a hang, crash or running out of memory)",
        len(keys_at),
        time.monotonic() - started,
        workers,
        pool.replaced,
    )
    return verdicts


def _verdict_for_lost(path: Path, lost: WorkerLost, max_bytes: int) -> ImageVerdict:
    """The decoder hung or crashed: hash the bytes here (reading is safe; decoding was not)."""
    try:
        data = read_limited(path, max_bytes)
    except (OSError, Refused) as error:
        why = (
            f"{error.reason}: {error.detail}"
            if isinstance(error, Refused)
            else f"{type(error).__name__}: {error.strerror or error}"
        )
        return ImageVerdict.unread(lost.reason, f"{lost.detail}; then not hashed: {why}", stage="decode")
    return ImageVerdict(
        sha256=sha256_bytes(data), size=len(data), reason=lost.reason, stage="decode", error=lost.detail
    )


def refuse_unsafe_keys(keys: list[str]) -> tuple[dict[str, ImageVerdict], list[str]]:
    """`unsafe_key` verdicts for keys no file may be read for, and the other keys. No I/O: the reduce
    stage decides these itself, since no map host can receive them."""
    refused, others = {}, []
    for key in keys:
        if problem := key_problem(key):
            refused[key] = ImageVerdict.unread("unsafe_key", f"the key has {problem}; not read")
        else:
            others.append(key)
    return refused, others


def run_config(args: argparse.Namespace) -> dict[str, Any]:
    """The knobs that decide the output. Paths and --workers are left out: the same data validated
    in another folder or with more workers must give the same manifest, hence the same data version."""
    return {
        "val_fraction": args.val_fraction,
        "split_seed": args.split_seed,
        "max_quarantine_rate": args.max_quarantine_rate,
        "min_side": args.min_side,
        "allowed_formats": list(args.allowed_formats),
        "timeout_s": args.timeout_s,
        "max_image_bytes": args.max_image_bytes,
        "max_pixels": args.max_pixels,
        "max_annotation_bytes": args.max_annotation_bytes,
    }


def decode_settings(args: argparse.Namespace) -> dict[str, Any]:
    """Everything that can change an image's verdict; a cached verdict is reused only when all match."""
    return {
        "validator_version": VALIDATOR_VERSION,
        "pillow_version": PIL.__version__,
        "simplejpeg_version": simplejpeg.__version__,  # the strict JPEG decoder (training_code/lib/jpeg_strict.py)
        "min_side": args.min_side,
        "allowed_formats": list(args.allowed_formats),
        "timeout_s": args.timeout_s,
        "max_image_bytes": args.max_image_bytes,
        "max_pixels": args.max_pixels,
    }


def check_quarantine_rate(counts: dict[str, Any], max_rate: float, out: Path) -> None:
    rate = counts["quarantined"] / counts["images_in"]
    if rate > max_rate:
        top = Counter(counts["quarantined_by_reason"]).most_common(3)
        message = (
            f"validation failed: {counts['quarantined']} of {counts['images_in']} images quarantined ({rate:.1%}), "
            f"above --max-quarantine-rate {max_rate:.1%}; top reasons: {', '.join(f'{r} {n}' for r, n in top)}. "
            f"The tables are in {out} (no manifest.json was written); fix the raw data or raise the threshold."
        )
        log.error(message)
        raise SystemExit(message)


def validate(
    args: argparse.Namespace, check: Callable[..., ImageVerdict] = check_image_file
) -> tuple[dict[str, Any], bytes, dict[str, int], list[Thumbnail]]:
    """Run the whole pass (or its reduce stage); returns the manifest, its exact bytes, how many
    images were decoded or reused, and the thumbnails on the quarantine's contact sheet."""
    check_args(args)
    (args.out / MANIFEST).unlink(missing_ok=True)  # a manifest from an earlier run must not vouch for these tables
    index = load_index(args.index)
    verdicts, to_decode = reused_and_to_decode(args, index)
    work = {"decoded": len(to_decode), "reused": len(verdicts)}
    refused, to_decode = refuse_unsafe_keys(to_decode)
    verdicts.update(refused)
    if args.phase == "reduce":
        annotations, errors = load_annotations(
            args.decoded / MAP_ANNOTATIONS, set(index["source"]), args.max_annotation_bytes
        )
        verdicts.update(collect_map_verdicts(args.decoded, index[index["key"].isin(to_decode)]))
    else:
        annotations, errors = load_annotations(args.raw, set(index["source"]), args.max_annotation_bytes)
        log.info("decoding %d images, reusing %d verdicts from %s", work["decoded"], work["reused"], args.previous)
        verdicts.update(decode_all(args.raw, to_decode, args, check))
    write_table(verdict_frame(index, verdicts), VERDICTS, args.out / VERDICTS_FILE)
    outputs = build_outputs(
        index, verdicts, annotations, seed=args.split_seed, val_fraction=args.val_fraction, annotation_errors=errors
    )
    files = write_outputs(outputs, args.out)
    check_quarantine_rate(outputs.counts, args.max_quarantine_rate, args.out)
    if args.phase == "reduce":  # the raw bytes were on the map hosts, which drew these
        thumbnails = read_thumbnails(sorted(args.decoded.glob("thumbnails-*.parquet")), outputs.quarantine)
    else:
        thumbnails = draw_thumbnails(args, outputs.quarantine)
    if thumbnails:
        sheet = contact_sheet_png(thumbnails)
        write_bytes_atomic(args.out / SHEET_FILE, sheet)
        files[SHEET_FILE] = sha256_bytes(sheet)
    else:
        (args.out / SHEET_FILE).unlink(missing_ok=True)  # an earlier run's sheet would show other files
    # Only what was decided goes in: no paths, times, hosts or input hashes, so a rebuild that reaches
    # the same verdicts writes the same bytes and downstream assets stay fresh.
    manifest = {
        "format": MANIFEST_FORMAT,
        "validator_version": VALIDATOR_VERSION,
        "pillow_version": PIL.__version__,
        "counts": outputs.counts,
        "files": files,
        "config": run_config(args),
        "decode_settings": decode_settings(args),
    }
    manifest_bytes = json.dumps(manifest, indent=1, sort_keys=True).encode()
    write_bytes_atomic(args.out / MANIFEST, manifest_bytes)
    return manifest, manifest_bytes, work, thumbnails


def draw_thumbnails(args: argparse.Namespace, quarantine: pd.DataFrame) -> list[Thumbnail]:
    """The contact sheet's thumbnails, drawn from the raw files under the decode pass's own limits."""
    return quarantine_thumbnails(
        args.raw,
        quarantine,
        max_bytes=args.max_image_bytes,
        max_pixels=args.max_pixels,
        timeout_s=args.timeout_s,
        workers=args.workers,
        via_links=args.phase == "map",
    )


def decode_part(args: argparse.Namespace, check: Callable[..., ImageVerdict] = check_image_file) -> dict[str, Any]:
    """The map stage on one host: decode the images of the index (new or changed ones, with
    --previous) that this host received, and pass on the annotation files it received."""
    check_args(args)
    host = job_env.current_host()
    index = load_index(args.index)
    reused, to_decode = reused_and_to_decode(args, index)
    _, to_decode = refuse_unsafe_keys(to_decode)  # the reduce stage decides those
    # lexists, not is_file: a symlink out of the root is this host's to refuse, without following it.
    here = [key for key in to_decode if os.path.lexists(args.raw / key)]
    log.info(
        "%s: decoding %d of the %d images to decode; the others went to other hosts", host, len(here), len(to_decode)
    )
    verdicts = decode_all(args.raw, here, args, check)
    write_table(
        verdict_frame(index[index["key"].isin(verdicts)], verdicts), VERDICTS, args.out / f"verdicts-{host}.parquet"
    )
    # Reused verdicts of files this host received count too: the sheet shows the whole quarantine's first.
    drawable = {key: v for key, v in reused.items() if v.reason in DRAWABLE_REASONS and os.path.lexists(args.raw / key)}
    thumbnails = draw_thumbnails(args, quarantine_rows({**drawable, **verdicts}))
    write_bytes_atomic(args.out / f"thumbnails-{host}.parquet", thumbnails_frame(thumbnails).to_parquet(index=False))
    copied = copy_annotation_files(args.raw, args.out / MAP_ANNOTATIONS, args.max_annotation_bytes)
    return {"host": host, "decoded": len(verdicts), "annotation_files": copied}


def quarantine_rows(verdicts: dict[str, ImageVerdict]) -> pd.DataFrame:
    """key, sha256 and reason of the quarantined verdicts, as the quarantine table has them."""
    rows = [(key, v.sha256, v.reason) for key, v in verdicts.items() if not v.accepted]
    return pd.DataFrame(rows, columns=["key", "sha256", "reason"])


def reused_and_to_decode(args: argparse.Namespace, index: pd.DataFrame) -> tuple[dict[str, ImageVerdict], list[str]]:
    """Verdicts reusable from --previous, and the keys that must be decoded (all of them without it)."""
    return split_reused(index, load_reusable(args.previous, decode_settings(args)) if args.previous else {})


def collect_map_verdicts(decoded: Path, pending: pd.DataFrame) -> dict[str, ImageVerdict]:
    """The verdicts the map hosts reached for the index rows in `pending`. A key no host received (its
    object went away between the listing and the job) is `unreadable`, as a missing file is on one host."""
    parts = sorted(decoded.glob("verdicts-*.parquet"))
    if not parts:
        raise FileNotFoundError(
            f"{decoded} holds no verdicts-<host>.parquet: the map stage wrote nothing; check its job logs"
        )
    reached = {identity: verdict for part in parts for identity, verdict in read_verdicts(part).items()}
    verdicts, missing = split_reused(pending, reached)
    for key in missing:
        verdicts[key] = ImageVerdict.unread("unreadable", "no host of the map stage received this object")
    log.info("collected %d verdicts from %d map hosts", len(verdicts), len(parts))
    return verdicts


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
        "validator_version": manifest["validator_version"],
        **work,  # decoded + reused == images_in: how much of the pass was incremental
        "validate_wall_s": round(wall_s, 3),
        "quarantined_images_shown": len(thumbnails),
        **contact_sheet_entries(thumbnails),
    }


def contact_sheet_entries(thumbnails: list[Thumbnail]) -> dict[str, Any]:
    """One inline picture per quarantined image on the sheet, its reason and key under it."""
    return {
        f"quarantined_image_{number}": markdown_metadata(
            inline_picture(
                thumbnail.image(), f"{thumbnail.reason}: {thumbnail.key}", f"{thumbnail.reason}: {thumbnail.key}"
            )
        )
        for number, thumbnail in enumerate(thumbnails, start=1)
    }


def main(args: argparse.Namespace) -> None:
    with job_env.pipes_session() as pipes:
        started = time.perf_counter()
        if args.phase == "map":  # a stage, not the asset: only the reduce stage reports a materialization
            part = decode_part(args)
            pipes.log.info(json.dumps({"event": "map", **part, "wall_s": round(time.perf_counter() - started, 3)}))
            return
        manifest, manifest_bytes, work, thumbnails = validate(args)
        wall_s = time.perf_counter() - started
        counts = manifest["counts"]
        log.info(
            "images in %d: accepted %d (train %d, val %d), quarantined %d, duplicates %d; labels accepted %d, rejected %d",
            counts["images_in"],
            counts["accepted"],
            counts["train"],
            counts["val"],
            counts["quarantined"],
            counts["duplicates"],
            counts["labels_accepted"],
            counts["labels_rejected"],
        )
        pipes.report_asset_materialization(
            metadata=report_metadata(manifest, wall_s, work, thumbnails), data_version=sha256_bytes(manifest_bytes)
        )


if __name__ == "__main__":
    main(get_args_parser().parse_args())
