"""Find and read each source's `annotations.json` under a raw root without leaving it.

The validation pass reads them here (on one host, or in the reduce stage from what the map hosts
passed on). A file that cannot be used costs its source its labels, with an error naming the file;
the other sources go on.
"""

from __future__ import annotations

import logging
from pathlib import Path

from .coco import ANNOTATIONS_FILE, AnnotationError, SourceAnnotations, parse_annotations
from .raw_files import Refused, locate, read_limited
from .storage import key_problem, write_bytes_atomic

log = logging.getLogger("zero.validate")

REFUSED_ANNOTATIONS = "refused.txt"  # beside a passed-on file: why a map host did not read that source's annotations.json


def load_annotations(
    raw: Path, sources: set[str], max_bytes: int, via_links: bool = False
) -> tuple[dict[str, SourceAnnotations | None], dict[str, str]]:
    """Each source's parsed COCO file, None for a source without a usable one (its images are all
    unmatched); and for each source whose file exists but cannot be used, the error naming it.

    Sources are those in the index plus any folder with an annotations.json, so annotations whose
    images are all missing are still reported. A source folder whose name is not a safe key is
    skipped: its images are unsafe_key verdicts anyway.
    """
    with_file = {path.parent.name for path in raw.glob(f"*/{ANNOTATIONS_FILE}")}
    refused = {path.parent.name: path.read_text() for path in raw.glob(f"*/{REFUSED_ANNOTATIONS}")}  # from map hosts
    parsed: dict[str, SourceAnnotations | None] = {}
    errors = dict(refused)
    for source in sorted(sources | with_file | set(refused)):
        key = f"{source}/{ANNOTATIONS_FILE}"
        parsed[source] = None
        if source in refused or key_problem(key):
            continue
        if source not in with_file:
            log.warning("source %r has no %s: all its images are reported as image_without_annotation", source, key)
            continue
        try:
            parsed[source] = parse_annotations(source, read_limited(locate(raw, key, via_links), max_bytes), key, max_bytes)
        except (AnnotationError, Refused, OSError) as error:
            errors[source] = annotation_error(key, error)
    for source, error in sorted(errors.items()):
        log.error("%s; its images are reported as image_without_annotation, the other sources go on", error)
    return parsed, errors


def annotation_error(key: str, error: Exception) -> str:
    if isinstance(error, AnnotationError):
        return str(error)
    if isinstance(error, Refused):
        return f"{key}: {error.reason}: {error.detail}"
    return f"{key}: unreadable: {type(error).__name__}: {error.strerror or error}"


def copy_annotation_files(raw: Path, dest: Path, max_bytes: int) -> int:
    """The map stage: pass on each annotations.json this host received (read inside the root, up to
    `max_bytes`), or why it was not read, for the reduce stage. Returns how many sources were seen."""
    sources = sorted({path.parent.name for path in raw.glob(f"*/{ANNOTATIONS_FILE}")})
    for source in sources:
        key = f"{source}/{ANNOTATIONS_FILE}"
        if key_problem(key):
            continue  # its images are unsafe_key verdicts; nothing may be written under that name
        try:
            write_bytes_atomic(dest / source / ANNOTATIONS_FILE, read_limited(locate(raw, key, via_links=True), max_bytes))
        except (Refused, OSError) as error:
            write_bytes_atomic(dest / source / REFUSED_ANNOTATIONS, annotation_error(key, error).encode())
    return len(sources)
