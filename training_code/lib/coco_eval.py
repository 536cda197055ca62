"""COCO box metrics with faster-coco-eval, after rejecting predictions that would be scored silently wrong.

`score_detections(predictions, ground_truth)` takes COCO-format lists/dicts (boxes as `[x, y, w, h]`)
and returns plain floats; metrics COCO leaves undefined (-1: no ground truth in that area range or
class) come back as `None`.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
from faster_coco_eval import COCO, COCOeval_faster

# faster-coco-eval's stats_as_dict label -> our metric name (the 12 standard COCO numbers).
SUMMARY_NAMES = {
    "AP_all": "mAP",
    "AP_50": "mAP_50",
    "AP_75": "mAP_75",
    "AP_small": "mAP_small",
    "AP_medium": "mAP_medium",
    "AP_large": "mAP_large",
    "AR_all": "AR_1",
    "AR_second": "AR_10",
    "AR_third": "AR_100",
    "AR_small": "AR_small",
    "AR_medium": "AR_medium",
    "AR_large": "AR_large",
}


_NUMBER_TYPES = (int, float, np.integer, np.floating)  # concrete types: an ABC check is much slower


def _is_number(value: Any) -> bool:
    return isinstance(value, _NUMBER_TYPES) and not isinstance(value, bool)


def validate_predictions(predictions: Any, ground_truth: dict[str, Any]) -> None:
    """Raise ValueError naming the first bad entry's index and field; return quietly when all are usable."""
    if not isinstance(predictions, list):
        raise ValueError(f"predictions must be a JSON list of detections, got {type(predictions).__name__}")
    image_ids = {image["id"] for image in ground_truth["images"]}
    category_ids = {category["id"] for category in ground_truth["categories"]}
    for index, entry in enumerate(predictions):
        where = f"prediction {index}"
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: expected an object with image_id, category_id, bbox, score; got {entry!r}")
        for field in ("image_id", "category_id", "bbox", "score"):
            if field not in entry:
                raise ValueError(f"{where}: field {field!r} is missing")
        for field in ("image_id", "category_id"):
            if not isinstance(entry[field], int) or isinstance(entry[field], bool):
                raise ValueError(f"{where}: {field} {entry[field]!r} is not an integer id")
        if entry["image_id"] not in image_ids:
            raise ValueError(f"{where}: image_id {entry['image_id']!r} is not an image of the ground truth")
        if entry["category_id"] not in category_ids:
            raise ValueError(
                f"{where}: category_id {entry['category_id']!r} is not a ground-truth category {sorted(category_ids)}"
            )
        score = entry["score"]
        if not _is_number(score) or not math.isfinite(score):
            raise ValueError(f"{where}: score {score!r} is not a finite number")
        bbox = entry["bbox"]
        if not isinstance(bbox, (list, tuple)) or len(bbox) != 4 or not all(_is_number(v) for v in bbox):
            raise ValueError(f"{where}: bbox {bbox!r} is not four numbers [x, y, w, h]")
        if not all(math.isfinite(v) for v in bbox):
            raise ValueError(f"{where}: bbox {list(bbox)} has a non-finite value")
        if bbox[2] <= 0 or bbox[3] <= 0:
            raise ValueError(
                f"{where}: bbox {list(bbox)} has width or height <= 0 "
                "(inverted or degenerate box; COCO boxes are [x, y, w, h])"
            )


def validate_ground_truth(ground_truth: Any) -> None:
    if not isinstance(ground_truth, dict):
        raise ValueError(f"ground truth must be a COCO object, got {type(ground_truth).__name__}")
    for section in ("images", "annotations", "categories"):
        if not isinstance(ground_truth.get(section), list):
            raise ValueError(f"ground truth: COCO section {section!r} is missing or not a list")
    if not ground_truth["images"]:
        raise ValueError("ground truth: no images; there is nothing to score against")


def _defined(value: float) -> float | None:
    return None if value < 0 else float(value)


def score_detections(predictions: list[dict[str, Any]], ground_truth: dict[str, Any]) -> dict[str, Any]:
    """COCO bbox metrics plus per-class AP; no predictions score 0.0 wherever there is ground truth."""
    validate_ground_truth(ground_truth)
    validate_predictions(predictions, ground_truth)
    categories = sorted(ground_truth["categories"], key=lambda c: c["id"])
    if not predictions:
        # A model that detects nothing has zero precision and recall; COCO tools reject an empty result set.
        with_truth = {a["category_id"] for a in ground_truth["annotations"]}
        recall = np.linspace(0.0, 1.0, 101).round(2).tolist()
        ap = {c["id"]: 0.0 if c["id"] in with_truth else None for c in categories}  # no ground truth: undefined
        return {
            **{name: 0.0 for name in SUMMARY_NAMES.values()},
            "per_class": [
                {"category": c["name"], "category_id": c["id"], "ap": ap[c["id"]], "ap_50": ap[c["id"]]}
                for c in categories
            ],
            "pr_curve": {
                "iou": 0.5,
                "recall": recall,
                "mean": [0.0] * len(recall),
                "per_class": {c["name"]: [0.0] * len(recall) if c["id"] in with_truth else None for c in categories},
            },
        }
    quiet = logging.getLogger("zero.coco_eval").debug
    # One-level copies suffice: the library adds keys to the entries it is given, never edits their boxes.
    sections = {name: [dict(entry) for entry in ground_truth[name]] for name in ("images", "annotations", "categories")}
    truth = COCO({**ground_truth, **sections}, use_deepcopy=False, print_function=quiet)
    detections = truth.loadRes([dict(p) for p in predictions])
    evaluator = COCOeval_faster(truth, detections, iouType="bbox", print_function=quiet)
    evaluator.evaluate()
    evaluator.accumulate()
    evaluator.summarize()
    stats = evaluator.stats_as_dict
    metrics: dict[str, Any] = {name: _defined(stats[label]) for label, name in SUMMARY_NAMES.items()}
    metrics["per_class"], metrics["pr_curve"] = _per_class(evaluator, categories)
    return metrics


def _per_class(evaluator: COCOeval_faster, categories: list[dict[str, Any]]) -> tuple[list[dict], dict[str, Any]]:
    """AP per category, averaging only defined entries (-1 marks a class without ground truth), and the PR
    curve: interpolated precision on COCO's 101 recall points at IoU 0.5, per class (None for a class
    without ground truth) and the mean over the classes that have some. Both at area all, 100 detections."""
    params = evaluator.params
    # precision is [iou, recall, class, area, maxDets]
    precision = np.asarray(evaluator.eval["precision"])[..., params.areaRngLbl.index("all"), params.maxDets.index(100)]
    at_50 = precision[int(np.argmin(np.abs(np.asarray(params.iouThrs) - 0.5)))]  # [recall, class]
    rows = [
        {
            "category": next(c["name"] for c in categories if c["id"] == category_id),
            "category_id": int(category_id),
            "ap": _mean_defined(precision[:, :, column]),
            "ap_50": _mean_defined(at_50[:, column]),
        }
        for column, category_id in enumerate(params.catIds)
    ]
    names = {c["id"]: c["name"] for c in categories}
    defined = at_50[:, (at_50 > -1).all(axis=0)]
    curve = {
        "iou": 0.5,
        "recall": np.asarray(params.recThrs).round(2).tolist(),
        "mean": defined.mean(axis=1).round(4).tolist() if defined.size else None,
        "per_class": {
            names[category_id]: (at_50[:, column].round(4).tolist() if (at_50[:, column] > -1).all() else None)
            for column, category_id in enumerate(params.catIds)
        },
    }
    return rows, curve


def _mean_defined(values: np.ndarray) -> float | None:
    defined = values[values > -1]
    return float(defined.mean()) if defined.size else None
