"""The decode step of the validation pass: a verdict per listed image, reached in isolated workers on exactly
the file the index listed (else `RawRootChanged`: its verdict would be cached under the index). Unsafe keys
and keys leading out of the raw root get their verdict here, never opened.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections import defaultdict
from collections.abc import Callable
from contextlib import nullcontext
from functools import partial
from pathlib import Path

from .hashing import sha256_bytes
from .image_checks import ImageVerdict, check_image_file
from .isolated_pool import IsolatedPool, WorkerLost, start_forkserver
from .raw_files import RAW_CHANGED, Locator, RawChanged, RawRootChanged, Refused, read_limited
from .storage import key_problem

log = logging.getLogger("zero.validate")

PROGRESS_EVERY_S = 10.0


def start_decoders(check: Callable[..., ImageVerdict] = check_image_file) -> None:
    """Start the decode workers' forkserver now, so it imports what they need while the pass reads its
    tables and `decode_workers` later only forks."""
    start_forkserver([check.__module__, __name__])


def decode_workers(
    args: argparse.Namespace, images: int, check: Callable[..., ImageVerdict] = check_image_file
) -> IsolatedPool | nullcontext[None]:
    """The isolated workers that will decode `images` files. Enter before the work that precedes the
    decode: they get ready meanwhile. None start for no image. `check` is injectable for tests."""
    if images < 1:
        return nullcontext()
    function = partial(
        _check_listed,
        check=check,
        allowed_formats=args.allowed_formats,
        min_side=args.min_side,
        max_bytes=args.max_image_bytes,
        max_pixels=args.max_pixels,
    )
    workers = max(1, min(args.workers, images))
    return IsolatedPool(function, workers=workers, timeout_s=args.timeout_s, preload=[check.__module__, __name__])


def decode_all(
    raw: Path,
    keys: list[str],
    pool: IsolatedPool | None,
    max_image_bytes: int,
    listed_etags: dict[str, str] | None = None,
) -> dict[str, ImageVerdict]:
    """A verdict per key of the raw root `raw`, decoded once per file by the entered `pool` (None only for no
    keys). `listed_etags`: key -> the index's etag, checked on read (a local root; else fetched with IfMatch)."""
    verdicts: dict[str, ImageVerdict] = {}
    if not keys:
        return verdicts
    if pool is None:
        raise ValueError(f"{len(keys)} images to decode, but no decode workers were started for them")
    started = last_log = time.monotonic()
    keys_at: dict[tuple[str, str | None], list[str]] = defaultdict(list)  # (located path, listed etag) -> keys
    locator = Locator(raw)
    for key in keys:
        try:
            path = locator.located(key)
        except Refused as refused:
            verdicts[key] = ImageVerdict.unread(refused.reason, refused.detail)
            continue
        keys_at[(path, listed_etags[key] if listed_etags else None)].append(key)
    if not keys_at:  # every key refused: nothing to decode
        return verdicts
    pool.wait_ready()
    log.info(
        "located %d files; %d decode workers ready %.1f s later", len(keys), pool.workers, time.monotonic() - started
    )
    for item, outcome in pool.imap_unordered(keys_at):
        first = keys_at[item][0]
        verdict = (
            _verdict_for_lost(first, Path(item[0]), item[1], outcome, max_image_bytes)
            if isinstance(outcome, WorkerLost)
            else outcome
        )
        if verdict.reason == RAW_CHANGED:
            raise RawRootChanged(first, verdict.error)
        verdicts.update({key: verdict for key in keys_at[item]})
        if time.monotonic() - last_log > PROGRESS_EVERY_S:
            last_log = time.monotonic()
            log.info(
                "decoded %d/%d files (%.0f files/s)", len(verdicts), len(keys), len(verdicts) / (last_log - started)
            )
    log.info(
        "decoded %d files in %.1f s with %d workers (%d replaced after a hang, crash or running out of memory)",
        len(keys_at),
        time.monotonic() - started,
        pool.workers,
        pool.replaced,
    )
    return verdicts


def _check_listed(item: tuple[str, str | None], check: Callable[..., ImageVerdict], **settings) -> ImageVerdict:
    """In a worker: the verdict on one (located path, listed etag)."""
    path, listed_etag = item
    return check(path, listed_etag=listed_etag, **settings)


def _verdict_for_lost(key: str, path: Path, listed_etag: str | None, lost: WorkerLost, max_bytes: int) -> ImageVerdict:
    """The decoder hung or crashed: hash the bytes here (reading is safe; decoding was not)."""
    try:
        data = read_limited(path, max_bytes, listed_etag)
    except RawChanged as changed:
        raise RawRootChanged(key, changed.detail) from None
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
    """`unsafe_key` verdicts for keys no file may be read for, and the other keys. No I/O, so the reduce
    stage can decide these itself."""
    refused, others = {}, []
    for key in keys:
        if problem := key_problem(key):
            refused[key] = ImageVerdict.unread("unsafe_key", f"the key has {problem}; not read")
        else:
            others.append(key)
    return refused, others
