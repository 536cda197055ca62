"""python -m own_trainer.evaluate_ssd --model DIR --shards DIR --out DIR [--split val] [--score-threshold 0.0]

An evaluation module kept to the README's contract: the model folder own_trainer.train_ssd wrote
(`--model`), the warm shards (`--shards`), `metrics.json` and `manifest.json` (last) in `--out`, and one
Pipes materialization carrying `mAP` (the regression check reads it), with metrics.json's sha256 as data version.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from own_trainer.detector import load_detector

from training_code.lib import job_env
from training_code.lib.coco_eval import score_detections
from training_code.lib.detection_samples import iter_eval_samples, verified_split
from training_code.lib.hashing import sha256_file
from training_code.lib.output_manifest import write_output_manifest


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Score own_trainer's SSDlite with COCO box metrics")
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--shards", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--split", default="val")
    parser.add_argument("--score-threshold", type=float, default=0.0)
    parser.add_argument("--training-set", default=None)
    return parser


def evaluate(args: argparse.Namespace) -> dict:
    torch.set_num_threads(1)
    manifest, shards = verified_split(args.shards, args.split, training_set_dir=args.training_set)
    model, payload = load_detector(args.model)
    images, annotations, predictions = [], [], []
    with torch.inference_mode():
        for image_id, sample in enumerate(iter_eval_samples(shards), start=1):
            images.append({"id": image_id, "file_name": sample.key, "width": sample.width, "height": sample.height})
            for box, label in zip(sample.boxes.tolist(), sample.labels.tolist()):
                w, h = box[2] - box[0], box[3] - box[1]
                annotations.append(
                    {
                        "id": len(annotations) + 1,
                        "image_id": image_id,
                        "category_id": int(label),
                        "bbox": [box[0], box[1], w, h],
                        "area": w * h,
                        "iscrowd": 0,
                    }
                )
            (output,) = model([sample.image.float().div(255)])
            for box, label, score in zip(
                output["boxes"].tolist(), output["labels"].tolist(), output["scores"].tolist()
            ):
                if label >= 1 and score >= args.score_threshold and box[2] > box[0] and box[3] > box[1]:
                    predictions.append(
                        {
                            "image_id": image_id,
                            "category_id": int(label),
                            "score": score,
                            "bbox": [box[0], box[1], box[2] - box[0], box[3] - box[1]],
                        }
                    )
    scores = score_detections(
        predictions, {"images": images, "annotations": annotations, "categories": manifest["categories"]}
    )
    metrics = {
        "mAP": scores["mAP"],
        "mAP_50": scores["mAP_50"],
        "val_images": len(images),
        "predictions": len(predictions),
        "model_step": payload["step"],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "metrics.json").write_text(json.dumps(metrics))
    write_output_manifest(args.out, ["metrics.json"], format="own-ssdlite-eval/1")  # last: the report is complete
    return metrics


def main(argv: list[str] | None = None) -> None:
    args, _ = get_args_parser().parse_known_args(argv)
    with job_env.pipes_session() as pipes:
        metrics = evaluate(args)
        reported = {**{k: v for k, v in metrics.items() if v is not None}, "dagster/row_count": metrics["val_images"]}
        pipes.report_asset_materialization(metadata=reported, data_version=sha256_file(args.out / "metrics.json"))


if __name__ == "__main__":
    main()
