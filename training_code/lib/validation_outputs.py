"""Assemble the validation pass's tables and counts from per-image verdicts and COCO annotations, by
Arrow columns: every index row ends in exactly one of accepted, quarantine or duplicates (asserted)."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from .coco import ANNOTATIONS_FILE, SourceAnnotations
from .hashing import sha256_file
from .label_policy import (
    TRAINING_STATES,
    UNLABELLED_SOURCE,
    UNLISTED,
    UNLISTED_NEGATIVE,
    LabelPolicy,
    annotation_counts,
)
from .labels import check_labels, vocabulary
from .storage import write_bytes_atomic
from .tables import ACCEPTED, DUPLICATES, QUARANTINE, REJECTED_LABELS, UNMATCHED, as_table, write_table
from .validated_files import ACCEPTED_FILE, CATEGORIES_FILE
from .verdict_cache import RETRIED_REASONS


@dataclass
class ValidationOutputs:
    accepted: pa.Table
    quarantine: pa.Table
    duplicates: pa.Table
    rejected_labels: pa.Table
    unmatched: pa.Table
    categories: list[dict[str, Any]]
    counts: dict[str, Any]
    label_policy: LabelPolicy = field(default_factory=LabelPolicy)


def build_outputs(
    index: pa.Table,
    verdicts: pa.Table,
    annotations: dict[str, SourceAnnotations | None],
    seed: int,
    val_fraction: float,
    label_policy: LabelPolicy | None = None,
) -> ValidationOutputs:
    """The tables of `index` from its `verdicts` and each source's parsed `annotations`."""
    label_policy = label_policy or LabelPolicy()
    keys = index.column("key")
    if not keys.equals(verdicts.column("key")):
        missing = pc.invert(pc.is_in(keys, verdicts.column("key")))
        raise RuntimeError(
            f"the verdicts are not one a row of the index: {pc.sum(missing).as_py()} indexed images have none, "
            f"e.g. {keys.filter(missing)[:3].to_pylist()}; {verdicts.num_rows} verdicts for {index.num_rows} rows"
        )
    rows = verdicts.append_column("source", index.column("source")).append_column("group", index.column("group"))
    failed = pc.not_equal(rows.column("reason"), "")
    quarantine = rows.filter(failed).select(["key", "sha256", "stage", "reason", "error"])
    sha256 = quarantine.column("sha256")
    quarantine = quarantine.set_column(1, "sha256", pc.if_else(pc.equal(sha256, ""), None, sha256))
    decodable = rows.filter(pc.invert(failed))
    duplicates = find_exact_duplicates(decodable.select(["key", "sha256"]))
    # Its labels go with the kept copy's; the duplicates table says which.
    kept = decodable.filter(pc.invert(pc.is_in(decodable.column("key"), duplicates.column("key"))))
    labels = _labels(kept, annotations, label_policy)
    accepted = (
        kept.append_column("split", assign_splits(kept.column("group"), seed, val_fraction))
        .append_column("boxes", pa.array(labels.boxes, ACCEPTED.arrow.field("boxes").type))
        .append_column("category_names", pa.array(labels.names, ACCEPTED.arrow.field("category_names").type))
        .append_column("annotation", pa.array(labels.states, pa.string()))
        .select(ACCEPTED.arrow.names)
    )
    outputs = ValidationOutputs(
        accepted=accepted,
        quarantine=quarantine,
        duplicates=duplicates,
        rejected_labels=as_table(sorted(labels.rejected, key=lambda row: row["key"]), REJECTED_LABELS),
        unmatched=_unmatched(index, annotations, label_policy),
        categories=vocabulary([parsed.categories for parsed in annotations.values() if parsed]),
        counts={},
        label_policy=label_policy,
    )
    outputs.counts = count_outputs(index, outputs)
    return outputs


@dataclass
class _Labels:
    boxes: list[list[list[float]]] = field(default_factory=list)
    names: list[list[str]] = field(default_factory=list)
    states: list[str] = field(default_factory=list)
    rejected: list[dict[str, Any]] = field(default_factory=list)  # REJECTED_LABELS rows


def _labels(kept: pa.Table, annotations: dict[str, SourceAnnotations | None], label_policy: LabelPolicy) -> _Labels:
    """Each kept image's checked boxes and state, and the entries rejected (unmatched files' first)."""
    labels = _Labels(rejected=[row for parsed in annotations.values() if parsed for row in parsed.rejected])
    columns = (kept.column(c).to_pylist() for c in ("key", "source", "orientation", "width", "height"))
    for key, source, orientation, width, height in zip(*columns):
        parsed = annotations.get(source)
        file_name = key[len(source) + 1 :]
        state = label_policy.state(source, parsed, file_name)
        file_annotations = parsed.annotations_for(file_name) if parsed and state in TRAINING_STATES else []
        checked = check_labels(key, file_annotations, parsed.categories if parsed else {}, orientation, width, height)
        labels.rejected += checked.rejected
        labels.boxes.append(checked.boxes)
        labels.names.append(checked.category_names)
        labels.states.append(state)
    return labels


def _unmatched(
    index: pa.Table, annotations: dict[str, SourceAnnotations | None], label_policy: LabelPolicy
) -> pa.Table:
    """Images with no COCO image entry, and COCO entries whose image is not in the index, by key."""
    parts = []
    for source in pc.unique(index.column("source")).to_pylist():
        keys = index.column("key").filter(pc.equal(index.column("source"), source))
        parsed = annotations.get(source)
        file_names = pc.utf8_slice_codeunits(keys, len(source) + 1)
        entries = pa.array(list(parsed.image_entries) if parsed else [], pa.string())
        without = keys.filter(pc.invert(pc.is_in(file_names, value_set=entries)))
        detail = label_policy.unmatched_detail(source, parsed)
        parts.append(_unmatched_rows("image_without_annotation", without, [detail] * len(without)))
        if parsed is not None:
            annotated = pa.array([name for name, found in parsed.by_file.items() if found], pa.string())
            missing = annotated.filter(pc.invert(pc.is_in(annotated, value_set=file_names))).to_pylist()
            details = [
                f"{len(parsed.annotations_for(name))} annotation(s) in {source}/{ANNOTATIONS_FILE} for a file the "
                "index does not list"
                for name in missing
            ]
            parts.append(_unmatched_rows("annotation_without_image", [f"{source}/{name}" for name in missing], details))
    return pa.concat_tables([UNMATCHED.empty(), *parts]).sort_by("key")


def _unmatched_rows(kind: str, keys: Any, details: list[str]) -> pa.Table:
    return pa.table(
        {"kind": pa.array([kind] * len(details), pa.string()), "key": keys, "detail": pa.array(details, pa.string())},
        schema=UNMATCHED.arrow,
    )


def count_outputs(index: pa.Table, outputs: ValidationOutputs) -> dict[str, Any]:
    accepted, quarantine, rejected = outputs.accepted, outputs.quarantine, outputs.rejected_labels
    labels_accepted = pc.sum(pc.list_value_length(accepted.column("boxes"))).as_py() or 0
    by_annotation = annotation_counts(accepted.column("annotation").to_pylist())
    unmatched_kinds = Counter(outputs.unmatched.column("kind").to_pylist())
    counts = {
        "images_in": index.num_rows,
        "accepted": accepted.num_rows,
        "quarantined": quarantine.num_rows,
        "duplicates": outputs.duplicates.num_rows,
        "quarantined_by_reason": _counted(quarantine.column("reason")),
        # The annotations of accepted images, and the entries of annotation files that fit no image.
        "labels_in": labels_accepted + rejected.num_rows,
        "labels_accepted": labels_accepted,
        "labels_rejected": rejected.num_rows,
        "labels_rejected_by_reason": _counted(rejected.column("reason")),
        "images_without_annotation": unmatched_kinds["image_without_annotation"],
        "annotations_without_image": unmatched_kinds["annotation_without_image"],
        "train": pc.sum(pc.equal(accepted.column("split"), "train")).as_py() or 0,
        "val": pc.sum(pc.equal(accepted.column("split"), "val")).as_py() or 0,
        "categories": len(outputs.categories),
        # Accepted images by what their labels are (label_policy): only annotated and unlisted_negative ones train.
        "accepted_by_annotation": by_annotation,
        "images_not_annotated": by_annotation[UNLISTED] + by_annotation[UNLABELLED_SOURCE],
        "unlisted_negatives": by_annotation[UNLISTED_NEGATIVE],
        # Quarantined through no fault of their bytes (RETRIED_REASONS): the next run reads them again.
        "images_to_retry": pc.sum(pc.is_in(quarantine.column("reason"), pa.array(sorted(RETRIED_REASONS)))).as_py()
        or 0,
    }
    if counts["images_in"] != counts["accepted"] + counts["quarantined"] + counts["duplicates"]:
        raise AssertionError(f"counts do not add up: {counts}")
    return counts


def _counted(values: pa.ChunkedArray) -> dict[str, int]:
    return dict(sorted(Counter(values.to_pylist()).items()))


def write_outputs(outputs: ValidationOutputs, out: Path) -> dict[str, str]:
    """Write the five tables (schema-checked) and categories.json; returns file name -> sha256."""
    tables = {
        ACCEPTED_FILE: (outputs.accepted, ACCEPTED),
        "quarantine.parquet": (outputs.quarantine, QUARANTINE),
        "duplicates.parquet": (outputs.duplicates, DUPLICATES),
        "rejected_labels.parquet": (outputs.rejected_labels, REJECTED_LABELS),
        "unmatched.parquet": (outputs.unmatched, UNMATCHED),
    }
    for name, (table, spec) in tables.items():
        write_table(table, spec, out / name)
    write_bytes_atomic(out / CATEGORIES_FILE, json.dumps(outputs.categories, indent=1).encode())
    return {name: sha256_file(out / name) for name in [*tables, CATEGORIES_FILE]}


def split_of_group(group: str, seed: int, val_fraction: float) -> str:
    """A group's split from a hash of the seed and its name alone: adding data never moves a group."""
    point = int(hashlib.sha256(f"{seed}:{group}".encode()).hexdigest()[:8], 16) / 2**32
    return "val" if point < val_fraction else "train"


def assign_splits(groups: pa.Array | pa.ChunkedArray, seed: int, val_fraction: float) -> pa.Array:
    """Each row's split: one hash a distinct group, taken back to the rows by column."""
    if not 0.0 <= val_fraction <= 1.0:
        raise ValueError(f"--val-fraction must be within [0, 1], got {val_fraction}")
    distinct = pc.unique(groups)
    splits = pa.array([split_of_group(group, seed, val_fraction) for group in distinct.to_pylist()], pa.string())
    return splits.take(pc.index_in(groups, value_set=distinct)) if len(groups) else pa.array([], pa.string())


def find_exact_duplicates(rows: pa.Table) -> pa.Table:
    """(key, sha256, duplicate_of) for every image whose bytes equal a key sorted before it, by key."""
    first = rows.group_by("sha256").aggregate([("key", "min")]).rename_columns(["sha256", "duplicate_of"])
    joined = rows.select(["key", "sha256"]).join(first, keys="sha256")
    return joined.filter(pc.not_equal(joined["key"], joined["duplicate_of"])).sort_by("key")
