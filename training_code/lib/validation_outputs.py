"""Assemble the validation pass's tables and counts from per-image verdicts and COCO annotations.

Pure bookkeeping, no decoding: every index row ends in exactly one of accepted, quarantine or
duplicates, so `images_in == accepted + quarantined + duplicates` holds by construction and is
asserted before anything is written.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pandera.pandas as pa

from .coco import SourceAnnotations, annotated_files_without_image
from .hashing import sha256_file
from .image_checks import ImageVerdict
from .label_policy import (
    TRAINING_STATES,
    UNLABELLED_SOURCE,
    UNLISTED,
    UNLISTED_NEGATIVE,
    LabelPolicy,
    annotation_counts,
)
from .labels import check_labels, vocabulary
from .split import assign_splits, find_exact_duplicates
from .storage import write_bytes_atomic
from .tables import ACCEPTED, DUPLICATES, QUARANTINE, REJECTED_LABELS, UNMATCHED, empty_frame, write_table
from .validated_files import ACCEPTED_FILE, CATEGORIES_FILE
from .verdict_cache import RETRIED_REASONS


@dataclass
class ValidationOutputs:
    accepted: pd.DataFrame
    quarantine: pd.DataFrame
    duplicates: pd.DataFrame
    rejected_labels: pd.DataFrame
    unmatched: pd.DataFrame
    categories: list[dict[str, Any]]
    counts: dict[str, Any]
    label_policy: LabelPolicy = field(default_factory=LabelPolicy)


def build_outputs(
    index: pd.DataFrame,
    verdicts: dict[str, ImageVerdict],
    annotations: dict[str, SourceAnnotations | None],
    seed: int,
    val_fraction: float,
    label_policy: LabelPolicy | None = None,
) -> ValidationOutputs:
    """`annotations`: each source's parsed annotations.json; None only for a source `label_policy` names
    unlabelled (what `LabelPolicy.require_annotation_files` let through). Each accepted image records
    its `annotation` state: whether it has labels to train on."""
    label_policy = label_policy or LabelPolicy()
    missing = set(index["key"]) - set(verdicts)
    if missing:
        raise RuntimeError(f"no verdict for {len(missing)} indexed images, e.g. {sorted(missing)[:3]}")
    quarantine_rows, decodable = [], []
    for row in index.itertuples(index=False):
        verdict = verdicts[row.key]
        if verdict.accepted:
            decodable.append(row)
        else:
            quarantine_rows.append(
                {
                    "key": row.key,
                    "sha256": verdict.sha256,
                    "stage": verdict.stage,
                    "reason": verdict.reason,
                    "error": verdict.error,
                }
            )
    decodable_keys = pd.Series([row.key for row in decodable], dtype=object)
    duplicates = find_exact_duplicates(decodable_keys, decodable_keys.map(lambda key: verdicts[key].sha256))
    duplicate_keys = set(duplicates["key"])

    # Entries of an annotations file that belong to no image (not objects, bad ids) are keyed by the file.
    accepted_rows, rejected_rows = [], [row for parsed in annotations.values() if parsed for row in parsed.rejected]
    for row in decodable:
        if row.key in duplicate_keys:
            continue  # its labels go with the kept copy's; the duplicates table says which
        verdict = verdicts[row.key]
        parsed = annotations.get(row.source)
        file_name = _file_name(row.source, row.key)
        state = label_policy.state(row.source, parsed, file_name)
        file_annotations = parsed.annotations_for(file_name) if parsed and state in TRAINING_STATES else []
        checked = check_labels(
            row.key,
            file_annotations,
            parsed.categories if parsed else {},
            verdict.orientation,
            verdict.width,
            verdict.height,
        )
        rejected_rows += checked.rejected
        accepted_rows.append(
            {
                "source": row.source,
                "key": row.key,
                "sha256": verdict.sha256,
                "size": verdict.size,
                "format": verdict.format,
                "mode": verdict.mode,
                "width": verdict.width,
                "height": verdict.height,
                "orientation": verdict.orientation,
                "group": row.group,
                "split": "",
                "boxes": checked.boxes,
                "category_names": checked.category_names,
                "annotation": state,
                "phash": list(verdict.phash),
                "dhash": list(verdict.dhash),
            }
        )
    accepted = _frame(accepted_rows, ACCEPTED)
    accepted["split"] = assign_splits(accepted["group"], seed, val_fraction)
    outputs = ValidationOutputs(
        accepted=accepted,
        quarantine=_frame(quarantine_rows, QUARANTINE),
        duplicates=duplicates if len(duplicates) else empty_frame(DUPLICATES),
        rejected_labels=_frame(rejected_rows, REJECTED_LABELS),
        unmatched=_frame(unmatched_rows(index, annotations, label_policy), UNMATCHED),
        categories=vocabulary([parsed.categories for parsed in annotations.values() if parsed]),
        counts={},
        label_policy=label_policy,
    )
    outputs.counts = count_outputs(index, outputs)
    return outputs


def unmatched_rows(
    index: pd.DataFrame, annotations: dict[str, SourceAnnotations | None], label_policy: LabelPolicy
) -> list[dict[str, str]]:
    """Images with no COCO image entry (each saying what that makes it), and COCO entries with
    annotations whose image is not in the index."""
    rows = []
    for source, key in zip(index["source"], index["key"]):
        parsed = annotations.get(source)
        if parsed is None or _file_name(source, key) not in parsed.image_entries:
            rows.append(
                {
                    "kind": "image_without_annotation",
                    "key": key,
                    "detail": label_policy.unmatched_detail(source, parsed),
                }
            )
    for source, parsed in sorted(annotations.items()):
        if parsed is None:
            continue
        listed = {_file_name(source, key) for key in index.loc[index["source"] == source, "key"]}
        for file_name in annotated_files_without_image(parsed, listed):
            count = len(parsed.annotations_for(file_name))
            rows.append(
                {
                    "kind": "annotation_without_image",
                    "key": f"{source}/{file_name}",
                    "detail": f"{count} annotation(s) in {source}/annotations.json for a file the index does not list",
                }
            )
    return rows


def count_outputs(index: pd.DataFrame, outputs: ValidationOutputs) -> dict[str, Any]:
    accepted, quarantine, rejected = outputs.accepted, outputs.quarantine, outputs.rejected_labels
    labels_accepted = int(accepted["boxes"].map(len).sum()) if len(accepted) else 0
    by_annotation = annotation_counts(accepted["annotation"])
    counts = {
        "images_in": len(index),
        "accepted": len(accepted),
        "quarantined": len(quarantine),
        "duplicates": len(outputs.duplicates),
        "quarantined_by_reason": dict(sorted(Counter(quarantine["reason"]).items())),
        # The annotations of accepted images, and the entries of annotation files that fit no image.
        "labels_in": labels_accepted + len(rejected),
        "labels_accepted": labels_accepted,
        "labels_rejected": len(rejected),
        "labels_rejected_by_reason": dict(sorted(Counter(rejected["reason"]).items())),
        "images_without_annotation": int((outputs.unmatched["kind"] == "image_without_annotation").sum()),
        "annotations_without_image": int((outputs.unmatched["kind"] == "annotation_without_image").sum()),
        "train": int((accepted["split"] == "train").sum()),
        "val": int((accepted["split"] == "val").sum()),
        "categories": len(outputs.categories),
        # Accepted images by what their labels are (label_policy): only annotated and unlisted_negative ones train.
        "accepted_by_annotation": by_annotation,
        "images_not_annotated": by_annotation[UNLISTED] + by_annotation[UNLABELLED_SOURCE],
        "unlisted_negatives": by_annotation[UNLISTED_NEGATIVE],
        # Quarantined through no fault of their bytes (RETRIED_REASONS): the next run reads them again.
        "images_to_retry": int(quarantine["reason"].isin(RETRIED_REASONS).sum()),
    }
    if counts["images_in"] != counts["accepted"] + counts["quarantined"] + counts["duplicates"]:
        raise AssertionError(f"counts do not add up: {counts}")
    return counts


def write_outputs(outputs: ValidationOutputs, out: Path) -> dict[str, str]:
    """Write the five tables (schema-checked) and categories.json; returns file name -> sha256."""
    tables = {
        ACCEPTED_FILE: (outputs.accepted, ACCEPTED),
        "quarantine.parquet": (outputs.quarantine, QUARANTINE),
        "duplicates.parquet": (outputs.duplicates, DUPLICATES),
        "rejected_labels.parquet": (outputs.rejected_labels, REJECTED_LABELS),
        "unmatched.parquet": (outputs.unmatched, UNMATCHED),
    }
    for name, (frame, schema) in tables.items():
        write_table(frame, schema, out / name)
    write_bytes_atomic(out / CATEGORIES_FILE, json.dumps(outputs.categories, indent=1).encode())
    return {name: sha256_file(out / name) for name in [*tables, CATEGORIES_FILE]}


def _frame(rows: list[dict[str, Any]], schema: pa.DataFrameSchema) -> pd.DataFrame:
    """Rows in key order, or the schema's empty frame (a zero-row DataFrame would lose the dtypes)."""
    if not rows:
        return empty_frame(schema)
    return pd.DataFrame(rows, columns=list(schema.columns)).sort_values("key", kind="stable").reset_index(drop=True)


def _file_name(source: str, key: str) -> str:
    return key[len(source) + 1 :]
