"""The evaluation job script: COCO scoring against pycocotools, prediction validation, and graph mode on shards."""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw

from training_code import evaluate
from training_code.lib.coco_eval import SUMMARY_NAMES, score_detections
from training_code.lib.model import build_model, model_config, save_model_file
from training_code.lib.shard_format import FORMAT, MANIFEST
from training_code.lib.shard_writer import ShardWriter

REPO = Path(__file__).resolve().parents[2]
CATEGORIES = [
    {"id": 1, "name": "nut"},
    {"id": 2, "name": "bolt"},
    {"id": 3, "name": "gear"},
    {"id": 4, "name": "never_seen"},
]


def synthetic_set(seed: int = 11) -> tuple[dict, list[dict]]:
    """Ground truth with small, medium and large boxes (no box of category 4), and predictions that
    mix near-hits, duplicates, wrong classes, false positives and misses."""
    rng = np.random.default_rng(seed)
    images, annotations, predictions = [], [], []
    for image_id in range(1, 13):
        images.append({"id": image_id, "width": 400, "height": 300, "file_name": f"{image_id}.jpg"})
        for _ in range(int(rng.integers(1, 5))):
            w, h = (float(v) for v in rng.choice([12, 24, 60, 90, 150], size=2))
            x, y = float(rng.uniform(0, 400 - w)), float(rng.uniform(0, 300 - h))
            category = int(rng.integers(1, 4))
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
            if rng.random() < 0.85:  # detected, with localisation error
                jitter = rng.normal(0, 0.08, size=4) * [w, h, w, h]
                label = category if rng.random() < 0.9 else int(rng.integers(1, 4))
                predictions.append(
                    {
                        "image_id": image_id,
                        "category_id": label,
                        "score": float(rng.uniform(0.3, 1.0)),
                        "bbox": [x + jitter[0], y + jitter[1], max(1.0, w + jitter[2]), max(1.0, h + jitter[3])],
                    }
                )
            if rng.random() < 0.2:  # duplicate detection
                predictions.append(dict(predictions[-1], score=float(rng.uniform(0.05, 0.5))))
        for _ in range(int(rng.integers(0, 3))):  # false positives
            predictions.append(
                {
                    "image_id": image_id,
                    "category_id": int(rng.integers(1, 4)),
                    "score": float(rng.uniform(0.0, 0.6)),
                    "bbox": [float(rng.uniform(0, 300)), float(rng.uniform(0, 200)), 40.0, 30.0],
                }
            )
    return {"images": images, "annotations": annotations, "categories": CATEGORIES}, predictions


def pycocotools_scores(ground_truth: dict, predictions: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    truth = COCO()
    truth.dataset = copy.deepcopy(ground_truth)
    with contextlib.redirect_stdout(io.StringIO()):
        truth.createIndex()
        evaluator = COCOeval(truth, truth.loadRes(copy.deepcopy(predictions)), "bbox")
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    return evaluator.stats, evaluator.eval["precision"]


def test_scores_match_pycocotools():
    ground_truth, predictions = synthetic_set()
    ours = score_detections(predictions, ground_truth)
    stats, precision = pycocotools_scores(ground_truth, predictions)
    for index, name in enumerate(SUMMARY_NAMES.values()):
        expected = None if stats[index] < 0 else stats[index]
        assert (ours[name] is None) == (expected is None), name
        if expected is not None:
            assert ours[name] == pytest.approx(expected, abs=1e-4), name
    assert 0.2 < ours["mAP"] < 0.9, "the synthetic set is neither trivial nor hopeless"
    for column, row in enumerate(ours["per_class"]):
        per_iou = precision[:, :, column, 0, -1]
        defined = per_iou[per_iou > -1]
        if row["category"] == "never_seen":
            assert row["ap"] is None and defined.size == 0
        else:
            assert row["ap"] == pytest.approx(defined.mean(), abs=1e-4)
            assert row["ap_50"] == pytest.approx(per_iou[0][per_iou[0] > -1].mean(), abs=1e-4)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("bbox", [10.0, float("nan"), 5.0, 5.0], "prediction 1: bbox .* non-finite"),
        ("bbox", [10.0, 10.0, -5.0, 5.0], "prediction 1: bbox .* width or height <= 0"),
        ("bbox", [10.0, 10.0, 5.0], "prediction 1: bbox .* not four numbers"),
        ("score", float("inf"), "prediction 1: score inf is not a finite number"),
        ("image_id", 999, "prediction 1: image_id 999 is not an image"),
        ("category_id", 7, "prediction 1: category_id 7 is not a ground-truth category"),
    ],
)
def test_malformed_predictions_are_rejected_naming_the_entry(field, value, message):
    ground_truth, predictions = synthetic_set()
    predictions[1] = dict(predictions[1], **{field: value})
    with pytest.raises(ValueError, match=message):
        score_detections(predictions, ground_truth)


def test_empty_predictions_score_zero():
    ground_truth, _ = synthetic_set()
    metrics = score_detections([], ground_truth)
    assert all(metrics[name] == 0.0 for name in SUMMARY_NAMES.values())
    # A class without ground truth has no AP, as when there are predictions.
    expected = {c["name"]: None if c["name"] == "never_seen" else 0.0 for c in CATEGORIES}
    assert {row["category"]: row["ap"] for row in metrics["per_class"]} == expected
    assert metrics["pr_curve"]["mean"] == [0.0] * 101 and metrics["pr_curve"]["per_class"]["never_seen"] is None


def test_pr_curve_is_cocos_precision_at_iou_50():
    ground_truth, predictions = synthetic_set()
    curve = score_detections(predictions, ground_truth)["pr_curve"]
    _, precision = pycocotools_scores(ground_truth, predictions)
    expected = precision[0, :, :3, 0, -1].mean(axis=1)  # the three categories with ground truth
    assert curve["mean"] == pytest.approx(expected.tolist(), abs=1e-4)
    assert curve["per_class"]["never_seen"] is None


def test_standalone_mode_prints_the_metrics(tmp_path, capsys):
    ground_truth, predictions = synthetic_set()
    (tmp_path / "gt.json").write_text(json.dumps(ground_truth))
    (tmp_path / "pred.json").write_text(json.dumps(predictions))
    arguments = ["--predictions", str(tmp_path / "pred.json"), "--ground-truth", str(tmp_path / "gt.json")]
    evaluate.main(evaluate.get_args_parser().parse_args(arguments))
    printed = json.loads(capsys.readouterr().out)
    assert printed["mAP"] == pytest.approx(score_detections(predictions, ground_truth)["mAP"])


def write_val_shards(folder: Path, count: int = 5) -> Path:
    rng = np.random.default_rng(1)
    with ShardWriter(folder, "val", 1 << 20, categories=CATEGORIES) as writer:
        for index in range(count):
            image = Image.new("RGB", (120, 90), (128, 128, 128))
            x, y = float(rng.uniform(0, 80)), float(rng.uniform(0, 50))
            ImageDraw.Draw(image).rectangle((x, y, x + 30, y + 30), fill=(200, 40, 40))
            buffer = io.BytesIO()
            image.save(buffer, "PNG")
            data = buffer.getvalue()
            writer.write(
                {
                    "image": data,
                    "image_format": "PNG",
                    "width": 120,
                    "height": 90,
                    "boxes": [[x, y, x + 30, y + 30]],
                    "category_ids": [1],
                    "category_names": ["nut"],
                    "source": "test",
                    "key": f"val/{index}.png",
                    "sha256": hashlib.sha256(data).hexdigest(),
                }
            )
    (folder / MANIFEST).write_text(json.dumps({"format": FORMAT, "categories": CATEGORIES, "shards": writer.entries}))
    return folder


def test_graph_mode_scores_a_model_on_val_shards(tmp_path):
    shards = write_val_shards(tmp_path / "shards")
    # Untrained, with no score threshold, so it emits detections to score.
    config = model_config(
        "fcos_tiny", CATEGORIES, width=16, min_size=64, max_size=96, score_thresh=0.0, detections_per_img=20
    )
    save_model_file(tmp_path / "model", build_model(config), config, step=0, args={})
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DAGSTER_PIPES", "ZERO_"))}
    command = [
        sys.executable,
        "-m",
        "training_code.evaluate",
        "--model",
        str(tmp_path / "model"),
        "--shards",
        str(shards),
        "--out",
        str(tmp_path / "out"),
        "--batch-size",
        "2",
    ]
    result = subprocess.run(
        command, cwd=REPO, env={**env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    predictions = json.loads((tmp_path / "out" / "predictions.json").read_text())
    assert metrics["val_images"] == 5 and metrics["predictions"] == len(predictions) > 0
    assert {p["category_id"] for p in predictions} <= {1, 2, 3, 4}, "the background slot never becomes a category"
    assert 0.0 <= metrics["mAP"] <= 1.0 and len(metrics["per_class"]) == len(CATEGORIES)
    truth = json.loads((tmp_path / "out" / "ground_truth.json").read_text())
    assert [image["id"] for image in truth["images"]] == [1, 2, 3, 4, 5]
    assert truth["annotations"][0]["bbox"][2:] == pytest.approx([30.0, 30.0])
    report = next(json.loads(line) for line in result.stdout.splitlines() if '"materialization"' in line)
    assert report["data_version"] == hashlib.sha256((tmp_path / "out" / "metrics.json").read_bytes()).hexdigest()
    assert {"mAP", "mAP_50", "mAP_75", "per_class_ap", "val_images", "predictions", "eval_wall_s"} <= set(
        report["metadata"]
    )
    assert [c["name"] for c in report["metadata"]["per_class_ap"]["schema"]] == ["category", "AP", "AP@0.5"]
    assert report["metadata"]["dagster/row_count"] == 5
    for entry in ("pr_curve", *(f"sample_prediction_{n}" for n in range(1, 5))):  # one thumbnail per sample, 4 at most
        markdown = report["metadata"][entry]
        assert markdown.startswith("![") and "](data:image/" in markdown and len(markdown) < 1000, (
            "drawn inline by the UI"
        )
    assert "sample_prediction_5" not in report["metadata"]
    for picture in ("pr_curve", "sample_predictions"):  # full size beside the metrics
        with Image.open(tmp_path / "out" / f"{picture}.png") as image:
            assert image.width >= 240
    assert len(metrics["pr_curve"]["recall"]) == 101 and len(metrics["pr_curve"]["per_class"]) == len(CATEGORIES)


def test_graph_mode_refuses_shards_with_other_categories(tmp_path):
    shards = write_val_shards(tmp_path / "shards")
    other = [{"id": 1, "name": "washer"}]
    config = model_config("fcos_tiny", other, width=16, min_size=64, max_size=96)
    save_model_file(tmp_path / "model", build_model(config), config, step=0, args={})
    arguments = ["--model", str(tmp_path / "model"), "--shards", str(shards), "--out", str(tmp_path / "out")]
    with pytest.raises(ValueError, match=r"trained on categories \[\(1, 'washer'\)\]"):
        evaluate.evaluate_model(evaluate.get_args_parser().parse_args(arguments))
