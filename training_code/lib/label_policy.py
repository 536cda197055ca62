"""What an image's labels are when its source's annotations.json says nothing of it, per source.

Listed with no annotations: a negative. No entry: not a training image, unless the source is in
`unlabelled_are_negatives`. A source without a usable annotations.json fails unless in `unlabelled_sources`."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from .coco import ANNOTATIONS_FILE, SourceAnnotations
from .storage import join, key_problem

log = logging.getLogger("zero.validate")

ANNOTATED = "annotated"
UNLISTED_NEGATIVE = "unlisted_negative"
UNLISTED = "unlisted"
UNLABELLED_SOURCE = "unlabelled_source"
# The states a training image may be in; the others are reported and never selected.
TRAINING_STATES = (ANNOTATED, UNLISTED_NEGATIVE)
STATE_MEANINGS = {
    ANNOTATED: "listed in its source's annotations.json: its boxes are its labels (none: a negative)",
    UNLISTED_NEGATIVE: "no entry in annotations.json, and its source treats such images as negatives (no boxes)",
    UNLISTED: "no entry in annotations.json: not annotated, so not a training image",
    UNLABELLED_SOURCE: "its source is configured unlabelled: not a training image",
}
# Why the selection leaves an image out, by its annotation state (the policy reads it as `annotation_reasons`).
EXCLUDED_BECAUSE = {
    UNLISTED: (
        "not annotated: no entry in its source's annotations.json (the source does not treat such images as "
        "negatives: validated_images' unlabelled_are_negatives)"
    ),
    UNLABELLED_SOURCE: "not annotated: its source is configured unlabelled (validated_images' unlabelled_sources)",
}


def source_list(text: str) -> frozenset[str]:
    """A comma-separated list of source names (the job flags), blanks ignored."""
    return frozenset(name.strip() for name in text.split(",") if name.strip())


@dataclass(frozen=True)
class LabelPolicy:
    """Per source: are images with no entry in annotations.json negatives, and is the source unlabelled."""

    unlabelled_are_negatives: frozenset[str] = frozenset()
    unlabelled_sources: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if both := sorted(self.unlabelled_are_negatives & self.unlabelled_sources):
            raise ValueError(
                f"sources {both} are both in unlabelled_are_negatives and unlabelled_sources: a source either has "
                "an annotations.json whose unlisted images are negatives, or none at all; name each in one of them"
            )

    def as_config(self) -> dict[str, list[str]]:
        """The settings as the manifest records them (part of the data version)."""
        return {
            "unlabelled_are_negatives": sorted(self.unlabelled_are_negatives),
            "unlabelled_sources": sorted(self.unlabelled_sources),
        }

    def sources_to_read(self, sources: Iterable[str]) -> set[str]:
        """The sources whose annotations.json is read: all but the unlabelled ones."""
        return set(sources) - self.unlabelled_sources

    def state(self, source: str, parsed: SourceAnnotations | None, file_name: str) -> str:
        """One of `tables.ANNOTATION_STATES`; without a parsed annotations.json an image is never a negative."""
        if source in self.unlabelled_sources:
            return UNLABELLED_SOURCE
        if parsed is None:
            return UNLISTED
        if file_name in parsed.image_entries:
            return ANNOTATED
        return UNLISTED_NEGATIVE if source in self.unlabelled_are_negatives else UNLISTED

    def unmatched_detail(self, source: str, parsed: SourceAnnotations | None) -> str:
        """What the unmatched table says of an image of `source` with no entry in its annotations.json."""
        where = f"{source}/{ANNOTATIONS_FILE}"
        state = self.state(source, parsed, "")
        if state == UNLABELLED_SOURCE:
            return f"source {source!r} is configured unlabelled ({where} is not read): not a training image"
        if parsed is None:
            return f"{where} is missing or unusable: not a training image"
        if state == UNLISTED_NEGATIVE:
            return f"no image entry in {where}: a negative (its source treats unlisted images as negatives)"
        return f"no image entry in {where}: not annotated, not a training image (see unlabelled_are_negatives)"

    def require_annotation_files(
        self,
        sources: Iterable[str],
        annotations: dict[str, SourceAnnotations | None],
        errors: dict[str, str],
        raw_uri: str,
    ) -> None:
        """SystemExit naming each file and the fix when a labelled source has no usable annotations.json."""
        problems = {}
        for source in sorted(set(sources) - self.unlabelled_sources):
            key = f"{source}/{ANNOTATIONS_FILE}"
            if key_problem(key):
                continue
            if source in errors:
                problems[source] = f"{join(raw_uri, key)} is unusable: {errors[source].removeprefix(f'{key}: ')}"
            elif annotations.get(source) is None:
                problems[source] = f"{join(raw_uri, key)} is missing"
        if not problems:
            return
        message = (
            f"validation failed: {'; '.join(problems.values())}. No image of the source can be told from a "
            "negative without it: fix or restore the file and materialize raw_image_index and validated_images "
            "again, or configure the source as unlabelled (validated_images' unlabelled_sources, "
            f"ZERO_UNLABELLED_SOURCES, --unlabelled-sources {','.join(problems)}). No manifest was written."
        )
        log.error(message)
        raise SystemExit(message)


def annotation_counts(states: Iterable[str]) -> dict[str, int]:
    """How many accepted images are in each state (every state named, zeros too)."""
    counts = dict.fromkeys(STATE_MEANINGS, 0)
    for state in states:
        counts[state] += 1
    return counts
