"""`eval`: our COCO scoring time over pycocotools' on the same predictions, every one of the 12 metrics
equal within 1e-4.

A fixed, realistic set: 500 images, up to 8 objects each over 10 classes and three size ranges, 100
detections per image mixing localised hits, duplicates, wrong classes and background boxes. Our time
includes validating every prediction. Goal: <= 0.5.
"""

from __future__ import annotations

import contextlib
import copy
import io
import time

import numpy as np

from benchmarks.report import BenchResult
from training_code.lib.coco_eval import SUMMARY_NAMES, score_detections

IMAGES = 500
DETECTIONS_PER_IMAGE = 100
CATEGORIES = [{"id": i, "name": f"class_{i}"} for i in range(1, 11)]


def detection_set(seed: int = 0) -> tuple[dict, list[dict]]:
    rng = np.random.default_rng(seed)
    images, annotations, predictions = [], [], []
    for image_id in range(1, IMAGES + 1):
        images.append({"id": image_id, "width": 640, "height": 480, "file_name": f"{image_id:05d}.jpg"})
        objects = []
        for _ in range(int(rng.integers(1, 9))):
            w, h = (float(v) for v in rng.choice([16, 28, 48, 80, 130, 220], size=2))
            x, y = float(rng.uniform(0, 640 - w)), float(rng.uniform(0, 480 - h))
            category = int(rng.integers(1, 11))
            objects.append((x, y, w, h, category))
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image_id,
                    "category_id": category,
                    "bbox": [x, y, w, h],
                    "area": w * h,
                    "iscrowd": 0,
                }
            )
        for index in range(DETECTIONS_PER_IMAGE):
            if index < 3 * len(objects):  # hits (and duplicates) with localisation error, sometimes the wrong class
                x, y, w, h, category = objects[index % len(objects)]
                jitter = rng.normal(0, 0.1, size=4) * [w, h, w, h]
                label = category if rng.random() < 0.85 else int(rng.integers(1, 11))
                box = [x + jitter[0], y + jitter[1], max(1.0, w + jitter[2]), max(1.0, h + jitter[3])]
                score = float(rng.uniform(0.2, 1.0)) / (1 + index // len(objects))
            else:  # background
                w, h = float(rng.uniform(8, 200)), float(rng.uniform(8, 200))
                box, label, score = (
                    [float(rng.uniform(0, 640 - w)), float(rng.uniform(0, 480 - h)), w, h],
                    int(rng.integers(1, 11)),
                    float(rng.uniform(0, 0.5)),
                )
            predictions.append(
                {"image_id": image_id, "category_id": label, "bbox": [float(v) for v in box], "score": score}
            )
    return {"images": images, "annotations": annotations, "categories": CATEGORIES}, predictions


def pycocotools_stats(ground_truth: dict, predictions: list[dict]) -> np.ndarray:
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    with contextlib.redirect_stdout(io.StringIO()):
        truth = COCO()
        truth.dataset = ground_truth
        truth.createIndex()
        evaluator = COCOeval(truth, truth.loadRes(predictions), "bbox")
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    return evaluator.stats


def run() -> list[BenchResult]:
    ground_truth, predictions = detection_set()
    # Each side gets its own copies, made before the clock starts: pycocotools edits what it is given.
    theirs_input = (copy.deepcopy(ground_truth), copy.deepcopy(predictions))
    started = time.perf_counter()
    ours = score_detections(predictions, ground_truth)
    ours_s = time.perf_counter() - started
    started = time.perf_counter()
    stats = pycocotools_stats(*theirs_input)
    theirs_s = time.perf_counter() - started
    differences = [
        abs((ours[name] if ours[name] is not None else -1.0) - float(stats[index]))
        for index, name in enumerate(SUMMARY_NAMES.values())
    ]
    worst = max(differences)
    ratio = ours_s / theirs_s if worst <= 1e-4 else float("inf")  # a fast wrong answer does not count
    return [
        BenchResult(
            "eval",
            ratio,
            "<=0.5",
            {
                "ours_s": ours_s,
                "pycocotools_s": theirs_s,
                "max_metric_diff": worst,
                "predictions": len(predictions),
                "mAP": ours["mAP"],
            },
        )
    ]
