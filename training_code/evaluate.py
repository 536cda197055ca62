"""SageMaker Processing job script: score a trained checkpoint on a split of the shards with COCO box metrics.

Writes `predictions.json`, `ground_truth.json`, `metrics.json`, `pr_curve.png`, `sample_predictions.png`
and the output manifest last; reports through Dagster Pipes. Standalone, it scores existing files:
`python -m training_code.evaluate --predictions P.json --ground-truth G.json`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from training_code.lib import job_env, wandb_artifacts, wandb_run
from training_code.lib.coco_eval import score_detections
from training_code.lib.detection_samples import iter_eval_samples, verified_split
from training_code.lib.inline_pictures import inline_picture, markdown_metadata
from training_code.lib.model import MODEL_FILE, load_model_file, payload_version
from training_code.lib.output_manifest import write_output_manifest
from training_code.lib.pr_curve_plot import draw_pr_thumbnail
from training_code.lib.report_plots import SamplePicture, draw_pr_curve, draw_sample, draw_samples, save_png
from training_code.lib.shard_format import sha256_file
from training_code.lib.storage import write_bytes_atomic

SAMPLE_PICTURES = 4  # one inline entry each: a thumbnail per sample stays legible where a grid would not
PICTURE_MIN_SCORE = 0.3  # the sample picture shows confident detections; the metrics use every one


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Score a ZERO checkpoint with COCO box metrics")
    graph = parser.add_argument_group("graph mode (run the model on shards)")
    graph.add_argument("--model", type=Path, help="folder holding model.pt (the training job's model output)")
    graph.add_argument("--shards", type=Path, help="shard set folder with manifest.json (zero-shards/3)")
    graph.add_argument(
        "--training-set",
        help="the shard set's folder inside --shards, when --shards holds the set and its shards beside it (SageMaker)",
    )
    graph.add_argument("--out", type=Path, help="folder for predictions.json, ground_truth.json, metrics.json")
    graph.add_argument("--split", default="val")
    graph.add_argument("--score-threshold", type=float, default=0.0, help="drop detections scoring below this")
    graph.add_argument("--batch-size", type=int, default=8)
    graph.add_argument("--threads", type=int, help="torch threads (default: all CPUs)")
    # Unset W&B flags follow the checkpoint's training run (same project and group).
    wandb_run.add_arguments(parser, follows_training=True)
    standalone = parser.add_argument_group("standalone mode (score existing COCO files)")
    standalone.add_argument("--predictions", type=Path, help="COCO results JSON (list of detections)")
    standalone.add_argument("--ground-truth", type=Path, help="COCO ground-truth JSON")
    return parser


def write_json_atomic(path: Path, document: Any) -> None:
    write_bytes_atomic(path, json.dumps(document).encode())


def check_categories(model_categories: list[dict], manifest_categories: list[dict], model_path: Path) -> None:
    """Labels are category ids, so the model and the shards must agree on what each id means."""
    trained, listed = (
        sorted((int(c["id"]), str(c["name"])) for c in cs) for cs in (model_categories, manifest_categories)
    )
    if trained != listed:
        raise ValueError(
            f"{model_path} was trained on categories {trained} but the shard manifest has {listed}; "
            "evaluate on shards built with the training categories"
        )


def predict(model: torch.nn.Module, shards, batch_size: int, device, score_threshold: float, category_ids: set[int]):
    """COCO ground truth and detections for every sample in shard order (image ids 1..N), and the first
    few samples as (image, truth boxes, confident predicted boxes) for the report's picture."""
    images, annotations, predictions, pictures = [], [], [], []
    image_id, samples = 0, iter_eval_samples(shards)
    with torch.inference_mode():
        for batch in iter(lambda: list(itertools.islice(samples, batch_size)), []):
            outputs = model([s.image.to(device).float().div_(255) for s in batch])
            for sample, output in zip(batch, outputs):
                image_id += 1
                if len(pictures) < SAMPLE_PICTURES:
                    confident = output["boxes"][output["scores"] >= PICTURE_MIN_SCORE].tolist()
                    pictures.append(SamplePicture(sample.key, sample.image, sample.boxes.tolist(), confident))
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
                for box, label, score in zip(
                    output["boxes"].tolist(), output["labels"].tolist(), output["scores"].tolist()
                ):
                    # Label 0 is the unused background slot; boxes clipped to zero area carry no detection.
                    if label not in category_ids or score < score_threshold or box[2] <= box[0] or box[3] <= box[1]:
                        continue
                    predictions.append(
                        {
                            "image_id": image_id,
                            "category_id": int(label),
                            "score": score,
                            "bbox": [box[0], box[1], box[2] - box[0], box[3] - box[1]],
                        }
                    )
    return images, annotations, predictions, pictures


def evaluate_model(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The metrics, the report's other metadata and the model file's payload."""
    started = time.perf_counter()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.set_num_threads(args.threads or len(os.sched_getaffinity(0)))
    manifest, shards = verified_split(args.shards, args.split, training_set_dir=args.training_set)
    model, payload = load_model_file(args.model, device)
    model = model.to(memory_format=torch.channels_last)  # the layout it was trained in; faster convolutions
    check_categories(payload["categories"], manifest["categories"], args.model)
    category_ids = {int(c["id"]) for c in manifest["categories"]}
    images, annotations, predictions, pictures = predict(
        model, shards, args.batch_size, device, args.score_threshold, category_ids
    )
    ground_truth = {"images": images, "annotations": annotations, "categories": manifest["categories"]}
    args.out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out / "ground_truth.json", ground_truth)
    write_json_atomic(args.out / "predictions.json", predictions)
    scores = score_detections(predictions, ground_truth)
    # Only deterministic content, so re-scoring the same model writes the same bytes (same data version).
    metrics = {
        **scores,
        "split": args.split,
        "val_images": len(images),
        "annotations": len(annotations),
        "predictions": len(predictions),
        "score_threshold": args.score_threshold,
        "model_step": payload.get("step"),
    }
    write_json_atomic(args.out / "metrics.json", metrics)
    save_png(draw_pr_curve(metrics["pr_curve"]), args.out / "pr_curve.png")
    save_png(draw_samples(pictures), args.out / "sample_predictions.png")
    # Written last: what proves the report complete (see zero_assets/core/output_marker.py).
    write_output_manifest(
        args.out,
        ["ground_truth.json", "predictions.json", "metrics.json", "pr_curve.png", "sample_predictions.png"],
        format="zero-eval/1",
    )
    return (
        metrics,
        {
            "eval_wall_s": round(time.perf_counter() - started, 2),
            "device": str(device),
            **inline_pictures(metrics["pr_curve"], pictures),
        },
        payload,
    )


def inline_pictures(curve: dict[str, Any], pictures: list[SamplePicture]) -> dict[str, Any]:
    """Thumbnails for the UI (the full-size files are pr_curve.png and sample_predictions.png)."""
    entries = {
        "pr_curve": markdown_metadata(
            inline_picture(
                lambda width: draw_pr_thumbnail(curve, width),
                "PR curve",
                f"precision by recall at IoU {curve['iou']}: mean black, classes in colour",
            )
        )
    }  # a short caption leaves room for a wider plot
    for number, picture in enumerate(pictures, start=1):
        caption = (
            f"{picture.key}: {len(picture.truth)} true (green), "
            f"{len(picture.predicted)} predicted at score {PICTURE_MIN_SCORE}+ (red)"
        )
        entries[f"sample_prediction_{number}"] = markdown_metadata(
            inline_picture(
                lambda width, picture=picture: draw_sample(picture, width), f"sample {number}: {picture.key}", caption
            )
        )
    return entries


SUMMARY_METRICS = ("mAP", "mAP_50", "mAP_75", "mAP_small", "mAP_medium", "mAP_large", "AR_100")


def per_class_rows(metrics: dict[str, Any]) -> list[dict[str, Any]]:
    def rounded(ap: float | None) -> float | None:  # no ground truth of the class in the split: an empty cell
        return None if ap is None else round(float(ap), 4)

    return [
        {"category": r["category"], "AP": rounded(r["ap"]), "AP@0.5": rounded(r["ap_50"])} for r in metrics["per_class"]
    ]


def track(args: argparse.Namespace, metrics: dict[str, Any], payload: dict[str, Any]) -> dict[str, Any]:
    """Log the metrics to a W&B run in the checkpoint's group, declaring the shard set and model used."""
    run = wandb_run.start(args, job_type="evaluation", config={"model_step": metrics["model_step"]})
    used: dict[str, str] = {}
    if run is not None:
        try:
            shard_set = wandb_artifacts.shard_set_artifact(args.shards, args.training_set, job_env.input_uri("shards"))
            wandb_artifacts.use(run, shard_set)
            used["shard_set_artifact"] = shard_set.name
            if args.wandb_model_artifact:
                model_file = (args.model if args.model.is_dir() else args.model.parent) / MODEL_FILE
                model = wandb_artifacts.model_artifact(
                    args.wandb_model_artifact, model_file, payload, payload_version(payload)
                )
                wandb_artifacts.use(run, model)
                used["model_artifact"] = model.name
            per_class = per_class_rows(metrics)
            run.summary.update({name: float(metrics[name]) for name in SUMMARY_METRICS if metrics[name] is not None})
            run.summary.update({f"AP/{row['category']}": row["AP"] for row in per_class if row["AP"] is not None})
            import wandb

            run.log(
                {
                    "per_class_ap": wandb.Table(
                        columns=["category", "AP", "AP@0.5"],
                        data=[[row["category"], row["AP"], row["AP@0.5"]] for row in per_class],
                    )
                }
            )
        finally:
            run.finish()
    return {**wandb_run.recorded(args, run), **used}


def report(pipes, metrics: dict[str, Any], run_info: dict[str, Any], metrics_path: Path) -> None:
    per_class = per_class_rows(metrics)
    metadata = {name: float(metrics[name]) for name in SUMMARY_METRICS if metrics[name] is not None}
    columns = {
        "category": "category name",
        "AP": "COCO AP (IoU 0.50:0.95); empty: no ground truth of this class in the split",
        "AP@0.5": "AP at IoU 0.5",
    }
    metadata.update(
        {
            "per_class_ap": job_env.table(per_class, columns=columns),
            "val_images": metrics["val_images"],
            "dagster/row_count": metrics["val_images"],  # the images evaluated
            "predictions": metrics["predictions"],
            "metrics_path": str(metrics_path),
            **run_info,
        }
    )
    pipes.report_asset_materialization(metadata=metadata, data_version=sha256_file(metrics_path))


def main(args: argparse.Namespace) -> None:
    if args.predictions or args.ground_truth:
        if not (args.predictions and args.ground_truth):
            raise SystemExit("standalone mode needs both --predictions and --ground-truth")
        metrics = score_detections(json.loads(args.predictions.read_text()), json.loads(args.ground_truth.read_text()))
        print(json.dumps(metrics, indent=2))
        return
    if missing := [flag for flag in ("--model", "--shards", "--out") if getattr(args, flag[2:]) is None]:
        raise SystemExit(f"graph mode needs {', '.join(missing)} (or use --predictions and --ground-truth)")
    wandb_run.follow_training(args, args.model if args.model.is_dir() else args.model.parent)
    if problem := wandb_run.missing_server(args):
        raise SystemExit(problem)
    with job_env.pipes_session() as pipes:
        metrics, run_info, payload = evaluate_model(args)
        tracking = track(args, metrics, payload)
        report(pipes, metrics, {**run_info, **wandb_run.report_metadata(tracking)}, args.out / "metrics.json")


if __name__ == "__main__":
    main(get_args_parser().parse_args())
