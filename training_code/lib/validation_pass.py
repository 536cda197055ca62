"""The validation pass of `training_code/validate.py`: `validate` is the whole pass on one host or the
reduce stage, `decode_part` the map stage on one host; both write the same manifest for the same data."""

from __future__ import annotations

import argparse
import json
import logging
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import PIL
import pyarrow as pa
import pyarrow.compute as pc
import simplejpeg

from . import job_env
from .coco import ANNOTATIONS_FILE
from .contact_sheet import SHEET_FILE, Thumbnail, contact_sheet_png
from .hashing import sha256_bytes
from .heap_freeze import heap_frozen
from .image_checks import ImageVerdict, check_image_file
from .image_decoding import decode_workers, refuse_unsafe_keys, start_decoders
from .indexed_raw import ListedRoot, read_listed_root
from .label_policy import LabelPolicy
from .object_keys import key_problem
from .output_manifest import RETRY_NEXT_TIME
from .raw_files import RawRootChanged
from .raw_reader import RawReader
from .read_list import ReadList, read_list_of, read_read_list
from .storage import write_bytes_atomic
from .tables import RAW_INDEX, VERDICTS, read_table, write_table
from .validated_files import VERDICTS_FILE
from .validation_outputs import build_outputs, write_outputs
from .verdict_cache import RETRIED_REASONS, reusable_verdicts, split_reused, verdict_table

log = logging.getLogger("zero.validate")

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "zero-validated/1"
# Bump when a change here or in image_checks/labels could change a verdict, so cached verdicts are redone.
VALIDATOR_VERSION = "validate-9"
PHASES = ("all", "map", "reduce")
DECODE_ARGUMENTS = ("min_side", "allowed_formats", "timeout_s", "max_image_bytes", "max_pixels")


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
    if args.phase != "all" and args.reads is None:
        problems.append(f"--phase {args.phase} needs --reads (the read list the hosts share)")
    if args.phase != "map" and args.index is None:
        problems.append(f"--phase {args.phase} needs --index (the raw_image_index output)")
    if problems:
        raise ValueError("; ".join(problems))


def load_index(index_dir: Path) -> pa.Table:
    """The index's rows in key order; a key outside its source folder is a broken index."""
    path = index_dir / "index.parquet"
    index = read_table(path, RAW_INDEX).sort_by("key")
    if not index.num_rows:
        raise ValueError(f"{path} lists no images; check the raw root the index was built from")
    for source in pc.unique(index.column("source")).to_pylist():
        keys = index.column("key").filter(pc.equal(index.column("source"), source))
        outside = keys.filter(pc.invert(pc.starts_with(keys, f"{source}/")))
        if len(outside):
            raise ValueError(f"{path}: key {outside[0].as_py()!r} is not under its source folder {source!r}/")
    return index


def _arguments(args: argparse.Namespace, names: tuple[str, ...]) -> dict[str, Any]:
    return {name: list(args.allowed_formats) if name == "allowed_formats" else getattr(args, name) for name in names}


def run_config(args: argparse.Namespace) -> dict[str, Any]:
    """The knobs that decide the output: no paths nor --workers, so the same data gives the same manifest."""
    names = ("val_fraction", "split_seed", "max_quarantine_rate", *DECODE_ARGUMENTS, "max_annotation_bytes")
    return {**_arguments(args, names), **label_policy(args).as_config()}


def label_policy(args: argparse.Namespace) -> LabelPolicy:
    return LabelPolicy(args.unlabelled_are_negatives, args.unlabelled_sources)


def decode_settings(args: argparse.Namespace) -> dict[str, Any]:
    """Everything that can change an image's verdict; a cached verdict is reused only when all match."""
    versions = {"validator_version": VALIDATOR_VERSION, "pillow_version": PIL.__version__}
    versions["simplejpeg_version"] = simplejpeg.__version__  # the strict JPEG decoder (jpeg_strict)
    return {**versions, **_arguments(args, DECODE_ARGUMENTS)}


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


@heap_frozen()
def validate(
    args: argparse.Namespace, check: Callable[..., ImageVerdict] = check_image_file
) -> tuple[dict[str, Any], bytes, dict[str, int], list[Thumbnail]]:
    """The whole pass (or reduce): manifest, its bytes, the work counts and the contact sheet's thumbnails."""
    check_args(args)
    if args.phase == "all":
        start_decoders(check)  # its imports run while the tables below are read
    (args.out / MANIFEST).unlink(missing_ok=True)  # a manifest from an earlier run must not vouch for these tables
    index = load_index(args.index)
    listed = read_listed_root(args.index)  # what every read is checked against (see indexed_raw)
    reused, to_decode = reused_and_to_decode(args, index)
    work = {"decoded": len(to_decode), "reused": reused.num_rows}
    verdicts, to_decode = refuse_unsafe_keys(to_decode)  # the new verdicts: the reused ones stay columns
    pending = rows_of(index, to_decode)
    reads = checked_reads(args, pending, listed.raw_uri)
    # A source whose very name is unsafe holds only unsafe keys, refused above: nothing of it is read.
    sources = {
        source
        for source in pc.unique(index.column("source")).to_pylist()
        if not key_problem(f"{source}/{ANNOTATIONS_FILE}")
    }
    labels = label_policy(args)
    with RawReader(listed, args.raw) as raw:
        with decode_workers(args, 0 if args.phase == "reduce" else reads.objects, check) as pool:
            # A source without a usable annotations.json fails here, before any decode (see label_policy).
            annotations, errors = raw.annotations(labels.sources_to_read(sources), args.max_annotation_bytes)
            labels.require_annotation_files(sources, annotations, errors, listed.raw_uri)
            mapped = VERDICTS.empty()
            if args.phase == "reduce":
                mapped = collect_map_verdicts(args.decoded, pending)
            else:
                log.info(
                    "decoding %d images, reusing %d verdicts from %s", work["decoded"], work["reused"], args.previous
                )
                verdicts.update(raw.decode(reads, args, pool))
        reached = verdict_table(listing(rows_of(index, list(verdicts))), verdicts)
        table = pa.concat_tables([reused, mapped, reached]).sort_by("key")
        write_table(table, VERDICTS, args.out / VERDICTS_FILE)
        outputs = build_outputs(
            index, table, annotations, seed=args.split_seed, val_fraction=args.val_fraction, label_policy=labels
        )
        files = write_outputs(outputs, args.out)
        check_quarantine_rate(outputs.counts, args.max_quarantine_rate, args.out)
        thumbnails = raw.thumbnails(outputs.quarantine, index, args)
        work.update(raw.fetch_counts())
    if thumbnails:
        sheet = contact_sheet_png(thumbnails)
        write_bytes_atomic(args.out / SHEET_FILE, sheet)
        files[SHEET_FILE] = sha256_bytes(sheet)
    else:
        (args.out / SHEET_FILE).unlink(missing_ok=True)  # an earlier run's sheet would show other files
    # Only what was decided goes in (no paths, times, hosts), so a rebuild reaching the same verdicts
    # writes the same bytes and downstream assets stay fresh.
    manifest = {
        "format": MANIFEST_FORMAT,
        "validator_version": VALIDATOR_VERSION,
        "pillow_version": PIL.__version__,
        "counts": outputs.counts,
        "files": files,
        "config": run_config(args),
        "decode_settings": decode_settings(args),
        **retry_next_time(outputs.counts),
    }
    manifest_bytes = json.dumps(manifest, indent=1, sort_keys=True).encode()
    write_bytes_atomic(args.out / MANIFEST, manifest_bytes)
    return manifest, manifest_bytes, work, thumbnails


def checked_reads(args: argparse.Namespace, pending: pa.Table, raw_uri: str) -> ReadList:
    """What this run reads: `--reads`, checked to name every image to decode, else those images."""
    rows = pending.select(["key", "size", "etag"])
    if args.reads is None:
        return read_list_of(raw_uri, rows, args.max_image_bytes)
    reads = read_read_list(args.reads)
    missing = sorted(set(pending.column("key").to_pylist()) - set(reads.keys()))
    if missing:
        raise ValueError(
            f"{len(missing)} images to decode are not in the read list {args.reads} (e.g. {missing[0]}): it was "
            f"planned for decode settings {reads.basis}, this job has {decode_settings(args)}. The job reads only "
            "what its list names; install requirements.lock in the processing image, then materialize again"
        )
    return read_list_of(reads.raw_uri, rows, reads.max_object_bytes)  # the images to decode, all of them listed


def retry_next_time(counts: dict[str, Any]) -> dict[str, Any]:
    """The manifest's RETRY_NEXT_TIME entry when some verdicts were not the files' fault."""
    retry = counts["images_to_retry"]
    if not retry:
        return {}
    log.warning(
        "%d images could not be read (%s): this output will not be reused, the next run reads them again",
        retry,
        ", ".join(sorted(RETRIED_REASONS)),
    )
    why = f"{retry} images could not be read ({', '.join(sorted(RETRIED_REASONS))}), not for what their bytes are"
    return {RETRY_NEXT_TIME: {"count": retry, "why": why}}


def decode_part(args: argparse.Namespace, check: Callable[..., ImageVerdict] = check_image_file) -> dict[str, Any]:
    """The map stage on one host: decode its part of the read list and write its verdicts."""
    check_args(args)
    host = job_env.current_host()
    slot, hosts = job_env.host_slot()
    reads = read_read_list(args.reads)
    part = reads.part(slot, hosts)
    log.info(
        "%s: decoding %d of the %d images of the read list (host %d of %d)",
        host,
        part.objects,
        reads.objects,
        slot + 1,
        hosts,
    )
    with RawReader(ListedRoot(reads.raw_uri, {}), args.raw) as raw, decode_workers(args, part.objects, check) as pool:
        verdicts = raw.decode(part, args, pool)
        fetched = raw.fetch_counts()
    write_table(verdict_table(part.table, verdicts), VERDICTS, args.out / f"verdicts-{host}.parquet")
    return {"host": host, "decoded": len(verdicts), **fetched}


def rows_of(index: pa.Table, keys: list[str]) -> pa.Table:
    return index.filter(pc.is_in(index.column("key"), pa.array(keys, pa.string())))


def listing(index: pa.Table) -> pa.Table:
    """The index rows' listing identity (key, etag, size)."""
    return index.select(["key", "etag", "size"])


def reused_and_to_decode(args: argparse.Namespace, index: pa.Table) -> tuple[pa.Table, list[str]]:
    """Verdicts reusable from --previous, and the keys that must be decoded (all of them without it)."""
    reusable = reusable_verdicts(args.previous, decode_settings(args)) if args.previous else None
    return split_reused(listing(index), reusable)


def collect_map_verdicts(decoded: Path, pending: pa.Table) -> pa.Table:
    """The map hosts' verdicts for `pending`; a key none reached is `RawRootChanged`."""
    parts = sorted(decoded.glob("verdicts-*.parquet"))
    if not parts:
        raise FileNotFoundError(
            f"{decoded} holds no verdicts-<host>.parquet: the map stage wrote nothing; check its job logs"
        )
    reached, missing = split_reused(listing(pending), pa.concat_tables([read_table(part, VERDICTS) for part in parts]))
    if missing:
        raise RawRootChanged(
            missing[0],
            f"listed by the index, but no host of the map stage reached a verdict for it ({len(missing)} such keys)",
        )
    log.info("collected %d verdicts from %d map hosts", reached.num_rows, len(parts))
    return reached
