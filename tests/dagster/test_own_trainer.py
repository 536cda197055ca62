"""A team's own trainer and evaluator in the graph: `trained_checkpoint` and `map_report` run the modules
their `module` config names (tests/helpers/own_trainer: torchvision's SSDlite, not the default FCOS), the cache
fingerprints that code, SageMaker gets it in its code package, and a module that is not there fails
before anything launches."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from helpers.graph_runs import materialize_graph, materialize_tail

from zero_assets.backends.sagemaker.code_package import build_code_package
from zero_assets.backends.sagemaker.job_params import module_path
from zero_assets.core.fingerprints import code_version, current_code_version
from zero_assets.defs.assets import map_report, trained_checkpoint

OWN_TRAINER = Path(__file__).parents[1] / "helpers" / "own_trainer"
TRAIN, EVALUATE = "own_trainer.train_ssd", "own_trainer.evaluate_ssd"
SOURCES = ["line_a_camera", "line_b_camera"]  # together they hold train and val groups
OWN_TRAINING = {
    "trained_checkpoint": {
        "config": {"module": TRAIN, "max_steps": 2, "batch_size": 2, "checkpoint_every": 1, "processes": 1}
    }
}
OWN_CONFIG = {"ops": {**OWN_TRAINING, "map_report": {"config": {"module": EVALUATE}}}}


def _forget_own_trainer() -> None:
    for name in [name for name in sys.modules if name == "own_trainer" or name.startswith("own_trainer.")]:
        del sys.modules[name]


@pytest.fixture
def team_package(tmp_path, monkeypatch) -> Path:
    """A copy of own_trainer on sys.path and PYTHONPATH (as a team's checkout would be), free to edit."""
    root = tmp_path / "team"
    shutil.copytree(OWN_TRAINER, root / "own_trainer", ignore=shutil.ignore_patterns("__pycache__"))
    _forget_own_trainer()  # finding a module imports its package: never reuse another folder's
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("PYTHONPATH", str(root))  # the local runner hands it on to the job processes
    yield root / "own_trainer"
    _forget_own_trainer()


def _latest(result, asset: str) -> dict:
    return {k: v.value for k, v in result.asset_materializations_for_node(asset)[0].metadata.items()}


@pytest.mark.slow
def test_own_trainer_and_evaluator_run_through_the_graph_and_their_code_is_fingerprinted(
    tiny_raw_root, instance, resources, team_package
):
    per_source, tail = materialize_graph(
        tiny_raw_root, instance=instance, resources=resources, run_config=OWN_CONFIG, sources=SOURCES
    )
    assert all(r.success for r in per_source.values()) and tail.success
    checkpoint, report = _latest(tail, "trained_checkpoint"), _latest(tail, "map_report")

    # The own trainer's model folder: its own file, not the default trainer's model.pt.
    model_folder = Path(checkpoint["dagster/uri"])
    assert sorted(p.name for p in model_folder.iterdir() if not p.name.startswith("_")) == [
        "manifest.json",
        "ssdlite.pt",
    ]
    payload = torch.load(model_folder / "ssdlite.pt", weights_only=True)
    assert payload["step"] == 2 and checkpoint["steps"] == 2
    # Its resumable checkpoint, where the contract's checkpoint folder is for this output.
    fingerprint = checkpoint["fingerprint"]
    saved = (
        Path(resources["settings"].jobs_root())
        / "trained_checkpoint"
        / fingerprint[:16]
        / "checkpoints"
        / "ssd-last.pt"
    )
    assert torch.load(saved, weights_only=True)["step"] == 2
    # The fingerprint holds the own trainer's code, not the default's (which the UI's code version keeps).
    assert (
        checkpoint["fingerprint_inputs"]["code"] == current_code_version(TRAIN) != code_version("training_code.train")
    )
    assert (
        "module" not in checkpoint["fingerprint_inputs"]["config"]
    )  # what runs is named by the code, not passed as --module

    # The own evaluator's report: its metrics file, the mAP the regression check reads, no pictures it never drew.
    metrics = json.loads((Path(report["dagster/uri"]) / "metrics.json").read_text())
    assert metrics["model_step"] == 2 and metrics["val_images"] == report["val_images"] > 0
    # The UI shows 4 significant digits; metrics.json keeps the full value.
    assert report["mAP"] == float(f"{metrics['mAP']:.4g}")
    assert not {"pr_curve_png", "sample_predictions_png"} & set(report)
    assert report["fingerprint_inputs"]["code"] == current_code_version(EVALUATE)

    again = materialize_tail(
        instance=instance, resources=resources, run_config={"ops": OWN_TRAINING}, assets=[trained_checkpoint]
    )
    assert _latest(again, "trained_checkpoint")["cache"] == "hit"

    # An edit to a module the trainer imports from its own package is new code: trained again, under a new fingerprint.
    detector = team_package / "detector.py"
    detector.write_text(detector.read_text() + "\n# a team's edit\n")
    edited = _latest(
        materialize_tail(
            instance=instance, resources=resources, run_config={"ops": OWN_TRAINING}, assets=[trained_checkpoint]
        ),
        "trained_checkpoint",
    )
    before, now = checkpoint["fingerprint_inputs"]["code"], current_code_version(TRAIN)
    assert edited["cache"] == "miss" and edited["fingerprint"] != fingerprint and edited["steps"] == 2
    assert edited["cache_reason"] == f"changed since the latest materialization: code version {before} -> {now}"


@pytest.mark.parametrize(
    "asset, module, why",
    [
        (trained_checkpoint, "own_trainer.no_such_script", "cannot be found"),
        (trained_checkpoint, "no_such_team.train", "cannot be found"),
        (trained_checkpoint, "own_trainer", "not a Python module file"),
        (map_report, "own_trainer.no_such_evaluator", "cannot be found"),
    ],
    ids=["train-missing-module", "train-missing-package", "train-package-not-module", "evaluate-missing-module"],
)
def test_a_module_that_cannot_run_fails_before_launch_naming_the_field_and_the_module(
    instance, resources, team_package, asset, module, why
):
    name = asset.key.to_user_string()
    config = {"ops": {name: {"config": {"module": module}}}}
    result = materialize_tail(
        instance=instance, resources=resources, run_config=config, assets=[asset], raise_on_error=False
    )
    (failure,) = result.get_step_failure_events()
    message = failure.step_failure_data.error.message
    assert f"{name} config field `module`" in message and repr(module) in message and why in message
    assert not (Path(resources["settings"].jobs_root()) / name).exists()  # nothing was laid out or launched


def test_a_module_name_that_is_not_a_module_is_refused_by_the_config(instance, resources):
    config = {"ops": {"trained_checkpoint": {"config": {"module": "-c import os"}}}}
    result = materialize_tail(
        instance=instance, resources=resources, run_config=config, assets=[trained_checkpoint], raise_on_error=False
    )
    (failure,) = result.get_step_failure_events()
    error = failure.step_failure_data.error  # the config's own validation error, or Dagster's around it
    while error.cls_name != "ValidationError" and error.cause is not None:
        error = error.cause
    assert error.cls_name == "ValidationError" and "module\n  String should match pattern" in error.message, (
        error.message
    )
    assert not (Path(resources["settings"].jobs_root()) / "trained_checkpoint").exists()


def test_sagemaker_code_package_carries_the_own_trainers_package(team_package):
    default = build_code_package()
    assert build_code_package(modules=("training_code.train",)).digest == default.digest
    package = build_code_package(modules=(TRAIN,))
    added = set(package.files) - set(default.files)
    assert {
        "own_trainer/__init__.py",
        "own_trainer/train_ssd.py",
        "own_trainer/detector.py",
        "own_trainer/evaluate_ssd.py",
    } == added
    assert (
        package.files[module_path(TRAIN)] == (team_package / "train_ssd.py").read_bytes()
    )  # SageMaker's entry point is in the archive
    (team_package / "detector.py").write_text("# edited\n")
    assert build_code_package(modules=(TRAIN,)).digest != package.digest
