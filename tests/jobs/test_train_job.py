"""The training job script: its data stream, model builder, and real `torchrun` runs (train, resume, fail, stop)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.wandb_offline import offline_runs
from PIL import Image, ImageDraw

from training_code.lib import wandb_artifacts
from training_code.lib.detection_data import (
    Augmentation,
    ShardDetectionStream,
    TooManyBadSamplesError,
    build_train_loader,
    collate_detection,
    targets_on,
)
from training_code.lib.detection_samples import verified_split
from training_code.lib.model import build_model, model_config, model_version, payload_version
from training_code.lib.shard_format import FORMAT, MANIFEST, ShardIntegrityError
from training_code.lib.shard_writer import ShardWriter

REPO = Path(__file__).resolve().parents[2]
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
CATEGORIES = [{"id": 1, "name": "red_square"}, {"id": 2, "name": "blue_disc"}]
FAST_ARGS = [
    "--batch-size",
    "2",
    "--width",
    "16",
    "--min-size",
    "64",
    "--max-size",
    "96",
    "--warmup-steps",
    "2",
    "--log-every",
    "1",
]


def shape_row(rng: np.random.Generator, key: str, shapes: int, image_format: str = "JPEG") -> dict:
    """A small image with `shapes` coloured shapes (category 1 squares, 2 discs) and their boxes."""
    width, height = int(rng.integers(96, 129)), int(rng.integers(72, 97))
    image = Image.new("RGB", (width, height), tuple(int(v) for v in rng.integers(90, 160, size=3)))
    draw = ImageDraw.Draw(image)
    boxes, ids = [], []
    for _ in range(shapes):
        size = float(rng.uniform(18, 34))
        x1, y1 = float(rng.uniform(0, width - size)), float(rng.uniform(0, height - size))
        category = int(rng.integers(1, 3))
        (draw.rectangle if category == 1 else draw.ellipse)(
            (x1, y1, x1 + size, y1 + size), fill=(220, 30, 30) if category == 1 else (30, 30, 220)
        )
        boxes.append([x1, y1, x1 + size, y1 + size])
        ids.append(category)
    buffer = io.BytesIO()
    image.save(buffer, image_format)
    return encoded_row(buffer.getvalue(), image_format, width, height, boxes, ids, key)


def encoded_row(data: bytes, image_format: str, width: int, height: int, boxes, ids, key: str) -> dict:
    names = [c["name"] for i in ids for c in CATEGORIES if c["id"] == i]
    return {
        "image": data,
        "image_format": image_format,
        "width": width,
        "height": height,
        "boxes": boxes,
        "category_ids": ids,
        "category_names": names,
        "source": "test",
        "key": key,
        "sha256": hashlib.sha256(data).hexdigest(),
    }


def write_shard_set(folder: Path, rows_by_split: dict[str, list[dict]], shard_bytes: int = 40_000) -> Path:
    entries = []
    for split, rows in rows_by_split.items():
        with ShardWriter(folder, split, shard_bytes, categories=CATEGORIES) as writer:
            for row in rows:
                writer.write(row)
        entries += writer.entries
    (folder / MANIFEST).write_text(json.dumps({"format": FORMAT, "categories": CATEGORIES, "shards": entries}))
    return folder


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    rng = np.random.default_rng(3)
    # Every fourth image has no boxes at all: background-only images must train too.
    train = [
        shape_row(
            rng, f"train/{i:03d}", shapes=0 if i % 4 == 0 else 1 + i % 3, image_format="PNG" if i % 5 == 0 else "JPEG"
        )
        for i in range(40)
    ]
    val = [shape_row(rng, f"val/{i:03d}", shapes=1 + i % 2) for i in range(6)]
    return write_shard_set(tmp_path_factory.mktemp("shards"), {"train": train, "val": val})


def stream(shard_refs, rank=0, world_size=1, augmentation=None, **kwargs) -> ShardDetectionStream:
    return ShardDetectionStream(
        shard_refs, rank=rank, world_size=world_size, seed=5, batch_size=2, augmentation=augmentation, **kwargs
    )


def take(dataset, count: int):
    return [sample for sample, _ in zip(iter(dataset), range(count))]


def same_sample(a, b) -> bool:
    return (
        torch.equal(a[0], b[0])
        and torch.equal(a[1]["boxes"], b[1]["boxes"])
        and torch.equal(a[1]["labels"], b[1]["labels"])
    )


@pytest.mark.parametrize("augmentation", [None, Augmentation(hflip_prob=0.5, color_jitter=0.3)])
def test_ranks_split_each_epoch_and_augment_a_sample_as_one_process_would(shards, augmentation):
    _, refs = verified_split(shards, "train")
    signature = lambda sample: hashlib.sha256(sample[0].numpy().tobytes()).hexdigest()  # noqa: E731
    alone = {signature(sample) for sample in take(stream(refs, augmentation=augmentation), 40)}  # one epoch of 40
    assert len(alone) == 40, "one epoch visits every image once"
    halves = []
    for rank in (0, 1):  # each rank reads its own shards: its epoch is its share, not half of one global order
        ranked = stream(refs, rank, 2, augmentation)
        epoch_rows = next(index for index, (epoch, *_) in enumerate(ranked.rank_order()) if epoch == 1)
        halves.append({signature(sample) for sample in take(ranked, epoch_rows)})
    assert halves[0].isdisjoint(halves[1]) and halves[0] | halves[1] == alone


def test_resume_skips_exactly_the_batches_already_delivered(shards):
    _, refs = verified_split(shards, "train")
    full = take(stream(refs), 10)
    resumed = take(stream(refs, resume_batches=3), 4)
    assert len(full) == 10 and len(resumed) == 4, "both streams delivered what was asked"
    assert all(same_sample(a, b) for a, b in zip(full[6:], resumed, strict=True))


def test_resume_with_loader_workers_continues_the_same_batch_sequence(shards):
    _, refs = verified_split(shards, "train")

    def batches(resume_batches: int, count: int):
        loader = build_train_loader(
            stream(refs, resume_batches=resume_batches), 2, workers=2, device=torch.device("cpu")
        )
        return [batch for batch, _ in zip(loader, range(count))]

    full, resumed = batches(0, 8), batches(3, 5)
    assert len(full) == 8 and len(resumed) == 5, "both loaders delivered what was asked"
    for (images_a, targets_a), (images_b, targets_b) in zip(full[3:], resumed, strict=True):
        assert len(images_a) == len(images_b) == 2
        assert all(torch.equal(a, b) for a, b in zip(images_a, images_b))
        assert [t["boxes"] for t in targets_a] == [t["boxes"] for t in targets_b]


def test_a_batch_from_loader_workers_holds_the_same_samples_as_the_stream(shards):
    """Collation packs images into one shared buffer and targets into lists; nothing may change on the way."""
    _, refs = verified_split(shards, "train")
    augmentation = Augmentation(hflip_prob=0.5, color_jitter=0.3)
    alone = take(stream(refs, augmentation=augmentation), 8)
    # Two workers deal the stream by stride and the loader takes their batches of 2 in turn.
    expected = [alone[i] for i in (0, 2, 1, 3, 4, 6, 5, 7)]
    loader = build_train_loader(stream(refs, augmentation=augmentation), 2, workers=2, device=torch.device("cpu"))
    received = [pair for batch, _ in zip(loader, range(4)) for pair in zip(*batch)]
    assert len(received) == 8
    for (image, target), (got_image, got_target) in zip(expected, received):
        assert torch.equal(image, got_image) and got_image.shape == image.shape
        assert got_target["photometric"] == target["photometric"]
        assert torch.equal(targets_on([got_target], torch.device("cpu"))[0]["boxes"], target["boxes"])


def test_a_flip_moves_the_boxes_with_the_pixels(tmp_path):
    """One red square left of centre: flipped, its box must still cover red pixels."""
    image = Image.new("RGB", (120, 80), (128, 128, 128))
    ImageDraw.Draw(image).rectangle((10, 20, 39, 49), fill=(220, 30, 30))
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    folder = write_shard_set(
        tmp_path, {"train": [encoded_row(buffer.getvalue(), "PNG", 120, 80, [[10.0, 20.0, 40.0, 50.0]], [1], "one")]}
    )
    _, refs = verified_split(folder, "train")
    flipped, target = take(stream(refs, augmentation=Augmentation(hflip_prob=1.0, color_jitter=0.0)), 1)[0]
    assert target["boxes"].tolist() == [[80.0, 20.0, 110.0, 50.0]]
    x1, y1, x2, y2 = (int(v) for v in target["boxes"][0])
    inside, outside = flipped[:, y1:y2, x1:x2], flipped[:, y1:y2, 10:40]
    assert (inside[0] > 200).all() and (inside[1] < 60).all(), "the flipped box covers the red square"
    assert (outside[0] < 140).all(), "nothing red is left where the square was"


def test_undecodable_samples_are_skipped_up_to_the_bound(tmp_path):
    rng = np.random.default_rng(0)
    good = [shape_row(rng, f"good/{i}", shapes=1) for i in range(4)]
    truncated = dict(good[0], image=good[0]["image"][:200], key="bad/truncated")
    folder = write_shard_set(tmp_path, {"train": [good[0], truncated, *good[1:]]})
    _, refs = verified_split(folder, "train")
    assert len(take(stream(refs, max_bad_samples=1, shuffle_buffer=1), 4)) == 4
    with pytest.raises(TooManyBadSamplesError, match="--max-bad-samples 0"):
        take(stream(refs, max_bad_samples=0, shuffle_buffer=1), 4)


def test_an_edited_shard_fails_verification(tmp_path, shards):
    copy = tmp_path / "copy"
    shutil.copytree(shards, copy)
    victim = copy / next(
        e["path"] for e in json.loads((copy / MANIFEST).read_text())["shards"] if e["split"] == "train"
    )
    data = bytearray(victim.read_bytes())
    data[-100] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(ShardIntegrityError, match=f"{victim.name}: sha256"):
        verified_split(copy, "train")


def test_fcos_tiny_trains_on_images_without_boxes(shards):
    _, refs = verified_split(shards, "train")
    images, targets = collate_detection(take(stream(refs, shuffle_buffer=1), 4))
    assert any(len(t["boxes"]) == 0 for t in targets)
    model = build_model(model_config("fcos_tiny", CATEGORIES, width=16, min_size=64, max_size=96))
    losses = model([image.float() / 255 for image in images], targets_on(targets, torch.device("cpu")))
    total = sum(losses.values())
    total.backward()
    assert torch.isfinite(total)


def test_torchvision_builders_get_one_slot_per_category_plus_background():
    model = build_model(model_config("fasterrcnn_mobilenet_v3_large_fpn", CATEGORIES, min_size=64, max_size=96))
    assert model.roi_heads.box_predictor.cls_score.out_features == len(CATEGORIES) + 1
    with pytest.raises(ValueError, match="unknown --arch 'yolo'"):
        model_config("yolo", CATEGORIES)


def test_online_tracking_needs_an_explicit_endpoint(capsys):
    from training_code.train import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--wandb-mode", "online"])
    assert "--wandb-mode online needs --wandb-base-url" in capsys.readouterr().err
    assert (
        parse_args(["--wandb-mode", "online", "--wandb-base-url", "https://wandb.example"]).wandb_base_url
        == "https://wandb.example"
    )
    assert parse_args([]).wandb_mode == "offline"


def test_shard_set_references_point_where_the_set_lives_after_the_job(shards):
    from training_code.lib.wandb_artifacts import shard_set_artifact

    files = {"manifest.json", *(e["path"] for e in json.loads((shards / "manifest.json").read_text())["shards"])}
    for source in ("s3://zero-lake/zero/lake/arrow_shards/cam/0123", "fsx://fs-0123/abcdefgh/arrow_shards/cam/0123"):
        artifact = shard_set_artifact(shards, source=source)  # the set's own folder is the input here
        refs = {entry.ref for entry in artifact.manifest.entries.values()}
        assert refs == {f"{source}/{name}" for name in files}, "each file below the input's source, at its path"
        assert not any(entry.digest != entry.ref for entry in artifact.manifest.entries.values()), "no read of S3"
    local = shard_set_artifact(shards, source=str(shards))
    assert all(entry.ref.startswith("file://") for entry in local.manifest.entries.values())


def test_a_field_the_trainer_does_not_read_is_logged_not_fatal(caplog):
    from training_code.train import parse_args

    args = parse_args(["--max-steps", "3", "--tuning-objective", "map50"])  # a config field added after it
    assert args.max_steps == 3
    assert "ignoring arguments this trainer does not read: --tuning-objective map50" in caplog.text


def test_photometric_factors_are_drawn_at_read_time_and_applied_on_the_device(shards):
    from training_code.lib.detection_data import apply_photometric

    _, refs = verified_split(shards, "train")
    images, targets = collate_detection(
        take(stream(refs, augmentation=Augmentation(hflip_prob=0.0, color_jitter=0.3)), 4)
    )
    factors = [target["photometric"] for target in targets]
    assert all(0.7 <= f <= 1.3 for pair in factors for f in pair) and len({tuple(f) for f in factors}) == 4
    adjusted = apply_photometric([image.float() / 255 for image in images], targets)
    assert all("photometric" not in target for target in targets), "the model never sees the factors"
    brightness = factors[0][0]
    expected = torch.nn.functional.hardtanh(images[0].float() / 255 * brightness, 0, 1)
    gray = (0.2989 * expected[0] + 0.587 * expected[1] + 0.114 * expected[2]).mean()
    expected = (factors[0][1] * expected + (1 - factors[0][1]) * gray).clamp(0, 1)
    assert torch.allclose(adjusted[0], expected, atol=1e-5)


def job_environment(tmp_path: Path, shards: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DAGSTER_PIPES", "SM_", "ZERO_"))}
    return {
        **env,
        "SM_CHANNEL_TRAIN": str(shards),
        "SM_MODEL_DIR": str(tmp_path / "model"),
        "ZERO_CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
        "ZERO_OPT_ML": str(tmp_path / "opt_ml"),
        "ZERO_JOB_NAME": "test-train",
        "PYTHONPATH": str(REPO),
    }


def torchrun(env: dict[str, str], *arguments: str, timeout: float = 120) -> subprocess.CompletedProcess:
    command = [TORCHRUN, "--standalone", "--nproc_per_node", "2", "-m", "training_code.train", *FAST_ARGS, *arguments]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def events(output: str, kind: str) -> list[dict]:
    """The job's log lines of event `kind` (checkpoints.log_event: the event's fields are the line's keys)."""
    records = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    return [record for record in records if record.get("event") == kind]


def checkpoint_steps(tmp_path: Path) -> list[int]:
    return sorted(int(p.stem.split("-")[1]) for p in (tmp_path / "checkpoints").glob("checkpoint-*.pt"))


def test_torchrun_trains_writes_the_model_and_resumes_from_the_latest_checkpoint(tmp_path, shards):
    env = job_environment(tmp_path, shards)
    first = torchrun(env, "--max-steps", "4", "--checkpoint-every", "2", "--keep-checkpoints", "2")
    assert first.returncode == 0, first.stderr[-3000:]
    assert checkpoint_steps(tmp_path) == [2, 4]
    model_file = tmp_path / "model" / "model.pt"
    payload = torch.load(model_file, weights_only=True)
    assert payload["step"] == 4 and payload["categories"] == CATEGORIES
    assert payload["model_config"]["arch"] == "fcos_tiny" and payload["args"]["batch_size"] == 2
    build_model(payload["model_config"]).load_state_dict(payload["model"])
    report = next(json.loads(line) for line in first.stdout.splitlines() if '"materialization"' in line)
    assert report["data_version"] == payload_version(payload), "the data version is what was trained"
    assert report["metadata"]["model_sha256"] == hashlib.sha256(model_file.read_bytes()).hexdigest()
    assert report["metadata"]["steps"] == 4 and report["metadata"]["world_size"] == 2
    assert report["metadata"]["images_seen"] == 4 * 2 * 2
    for key in ("images_per_s", "final_loss", "wall_s", "data_wait_fraction", "arch", "bad_samples_skipped"):
        assert key in report["metadata"]
    offline_runs = list((tmp_path / "opt_ml" / "output" / "data" / "wandb").glob("offline-run-*"))
    assert len(offline_runs) == 1, "wandb is offline by default, under the job's output data folder"
    assert not (REPO / "wandb").exists(), "nothing is written into the repository"
    assert (
        json.loads((tmp_path / "model" / "training_summary.json").read_text())["data_version"] == report["data_version"]
    )
    assert len(events(first.stderr, "train")) == 4, "one structured line per step from rank 0 only"

    second = torchrun(env, "--max-steps", "6", "--checkpoint-every", "2", "--keep-checkpoints", "2")
    assert second.returncode == 0, second.stderr[-3000:]
    assert [e["step"] for e in events(second.stderr, "resumed")] == [4]
    assert [e["step"] for e in events(second.stderr, "train")] == [5, 6]
    assert checkpoint_steps(tmp_path) == [4, 6]
    assert torch.load(model_file, weights_only=True)["step"] == 6
    resumed_report = next(json.loads(line) for line in second.stdout.splitlines() if '"materialization"' in line)
    assert (
        resumed_report["metadata"]["resumed_from_step"] == 4 and resumed_report["metadata"]["images_seen"] == 6 * 2 * 2
    )


def materialization(stdout: str) -> dict:
    return next(json.loads(line) for line in stdout.splitlines() if '"materialization"' in line)


def test_two_trainings_that_end_with_equal_weights_have_one_data_version(tmp_path, shards):
    reports, files = [], []
    for name in ("first", "second"):  # the same configuration and seed, from scratch, on CPU
        done = torchrun(job_environment(tmp_path / name, shards), "--max-steps", "3", "--checkpoint-every", "3")
        assert done.returncode == 0, done.stderr[-3000:]
        reports.append(materialization(done.stdout))
        files.append((tmp_path / name / "model" / "model.pt").read_bytes())
    assert reports[0]["data_version"] == reports[1]["data_version"]
    assert files[0] == files[1], "model.pt's bytes too: its archive records no temporary file name"


def test_the_data_version_is_the_weights_config_and_step_only():
    config = model_config("fcos_tiny", CATEGORIES, width=16, fpn_channels=32)
    torch.manual_seed(0)
    model = build_model(config)
    state = model.state_dict()
    base = model_version(state, config, 5)
    assert model_version({name: tensor.clone() for name, tensor in state.items()}, config, 5) == base
    assert model_version(model.to(memory_format=torch.channels_last).state_dict(), config, 5) == base, "any layout"
    assert model_version(state, config, 6) != base
    renamed = model_config("fcos_tiny", [CATEGORIES[0], {"id": 2, "name": "disc"}], width=16, fpn_channels=32)
    assert model_version(state, renamed, 5) != base
    first = next(name for name, tensor in state.items() if tensor.is_floating_point())
    assert model_version({**state, first: state[first] + 1e-6}, config, 5) != base


def test_attempts_of_one_graph_job_log_into_one_wandb_run(tmp_path, shards):
    job = "zero-trained-checkpoint-0123456789abcdef"  # job names as both backends give them, less the attempt
    env = job_environment(tmp_path, shards)
    steps = ["--max-steps", "4", "--checkpoint-every", "4"]
    stopped = torchrun({**env, "ZERO_JOB_NAME": f"{job}-a1"}, *steps, "--stop-after-steps", "2")
    assert stopped.returncode != 0 and "forced stop at step 2" in stopped.stderr, stopped.stderr[-3000:]
    resumed = torchrun({**env, "ZERO_JOB_NAME": f"{job}-a2"}, *steps)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [e["step"] for e in events(resumed.stderr, "resumed")] == [2]

    runs = offline_runs(tmp_path / "opt_ml" / "output" / "data" / "wandb")
    assert [run["run_id"] for run in runs] == [job, job], "the second attempt continues the first one's run"
    assert runs[1]["history"]["_step"] == 4
    reported = materialization(resumed.stdout)
    report = reported["metadata"]
    assert report["wandb_run_id"] == job and report["wandb_model_artifact"] == "model-0123456789abcdef"
    used = [run["used"] for run in runs]
    assert used[0] == used[1] and list(used[0]) == [report["wandb_shard_set_artifact"]], used
    shard_set = runs[1]["artifacts"][report["wandb_shard_set_artifact"]]
    assert shard_set.type == "dataset" and {entry.path for entry in shard_set.manifest.contents} == {
        "manifest.json",
        *(
            f"shards/{entry['path'].rpartition('/')[2]}"
            for entry in json.loads((shards / "manifest.json").read_text())["shards"]
        ),
    }
    assert all(entry.ref.startswith("file://") and not entry.local_path for entry in shard_set.manifest.contents), (
        "pointers, no copy"
    )
    assert list(runs[1]["logged"]) == ["model-0123456789abcdef"]
    model = runs[1]["artifacts"]["model-0123456789abcdef"]
    assert model.type == "model" and json.loads(model.metadata)["data_version"] == reported["data_version"]
    assert [entry.path for entry in model.manifest.contents] == ["model.pt"] and not model.manifest.contents[
        0
    ].local_path
    assert wandb_artifacts.run_id("test-train") is None, "a job named by hand gets an id of W&B's"


def test_a_non_finite_loss_fails_the_job_naming_the_step(tmp_path, shards):
    result = torchrun(job_environment(tmp_path, shards), "--max-steps", "6", "--lr", "1e30", "--warmup-steps", "1")
    assert result.returncode != 0
    assert "NonFiniteLossError: step " in result.stderr
    assert (tmp_path / "opt_ml" / "output" / "failure").read_text().startswith("NonFiniteLossError: step ")
    assert not (tmp_path / "model" / "model.pt").exists()


def test_sigterm_saves_a_checkpoint_and_exits_non_zero(tmp_path, shards):
    log = tmp_path / "stderr.log"
    command = [
        TORCHRUN,
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "training_code.train",
        *FAST_ARGS,
        "--max-steps",
        "10000",
    ]
    with open(log, "w") as stderr:
        launcher = subprocess.Popen(
            command, cwd=REPO, env=job_environment(tmp_path, shards), stdout=subprocess.DEVNULL, stderr=stderr
        )
        deadline = time.monotonic() + 90
        while not events(log.read_text(), "train") and time.monotonic() < deadline and launcher.poll() is None:
            time.sleep(0.2)
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=60) != 0
    saved = events(log.read_text(), "checkpoint")
    assert len(saved) == 1 and saved[0]["step"] >= 1
    assert checkpoint_steps(tmp_path) == [saved[0]["step"]]
    assert "TrainingInterrupted: SIGTERM received" in log.read_text()


def test_progress_reaches_the_event_log_at_most_once_a_minute_and_always_at_the_end(caplog):
    import logging
    from types import SimpleNamespace

    from training_code.train import ProgressReport

    now, sent = [0.0], []
    report = ProgressReport(sent.append, SimpleNamespace(is_main=True, rank=0), every_s=60.0, clock=lambda: now[0])
    with caplog.at_level(logging.INFO):
        for step in range(1, 601):  # ten minutes of training, a line every second
            now[0] = float(step)
            report({"step": step, "loss": 1.0}, last=step == 600)
    events = [json.loads(message)["step"] for message in sent]
    assert events == [1, 61, 121, 181, 241, 301, 361, 421, 481, 541, 600], events
    logged = [r for r in caplog.records if getattr(r, "fields", {}).get("event") == "train"]
    assert len(logged) == 600, "every line in the job log"
