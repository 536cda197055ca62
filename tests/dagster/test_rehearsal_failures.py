"""A rehearsal that does not prove its boundaries fails naming the one that did not hold: a trainer that does not
resume from its checkpoint, one that does not stop when asked, a W&B key the server rejects and a checkpoint
prefix that cannot be written (both found by the preflight, before any job). Local backend, real torchrun jobs
of small test trainers kept to the README's contract; the warm state is a stand-in folder."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from dagster import AssetMaterialization, materialize
from helpers.sagemaker_fake_preflight import wandb_server

from zero_assets.backends.local.runner import LocalJobRunner
from zero_assets.core.fingerprints import DATA_VERSION_TAG
from zero_assets.core.settings import ZeroSettings
from zero_assets.defs.assets import fsx_warm_state, training_rehearsal

PACKAGE = "zero_rehearsal_jobs"
TRAINER = '''
"""python -m zero_rehearsal_jobs.{name}: {what}"""
import argparse, json, os
from training_code.lib import job_env
from training_code.lib.output_manifest import write_output_manifest

parser = argparse.ArgumentParser()
parser.add_argument("--max-steps", type=int, required=True)
parser.add_argument("--stop-after-steps", type=int, default=None)
args, _ = parser.parse_known_args()
main = os.environ.get("RANK", "0") == "0"
with job_env.pipes_session() as pipes:
    checkpoints = job_env.checkpoint_dir()
    for step in range(1, args.max_steps + 1):  # from step 0 every time: no checkpoint is ever read
        if {stops} and args.stop_after_steps and step == args.stop_after_steps:
            if main:
                checkpoints.mkdir(parents=True, exist_ok=True)
                (checkpoints / f"step-{{step}}.json").write_text(json.dumps({{"step": step}}))
            raise RuntimeError(f"forced stop at step {{step}} of {{args.max_steps}} (--stop-after-steps {{step}})")
    if main:
        model = job_env.model_dir()
        (model / "weights.json").write_text(json.dumps({{"steps": args.max_steps}}))
        write_output_manifest(model, ["weights.json"], format="rehearsal-test/1")
        report = {{"steps": args.max_steps, "resumed_from_step": 0, "world_size": int(os.environ["WORLD_SIZE"])}}
        pipes.report_asset_materialization(metadata=report, data_version=f"steps-{{args.max_steps}}")
'''
MODULES = {
    "forgetful": TRAINER.format(name="forgetful", what="stops when asked, never resumes", stops=True),
    "unstoppable": TRAINER.format(name="unstoppable", what="never stops when asked", stops=False),
}


def _forget_package() -> None:
    for name in [name for name in sys.modules if name.split(".")[0] == PACKAGE]:
        del sys.modules[name]


@pytest.fixture
def local(tmp_path, monkeypatch, instance):
    """The test trainers importable here and in the jobs, a local runner, and a warm state on record."""
    (tmp_path / "code" / PACKAGE).mkdir(parents=True)
    (tmp_path / "code" / PACKAGE / "__init__.py").write_text("")
    for module, source in MODULES.items():
        (tmp_path / "code" / PACKAGE / f"{module}.py").write_text(source)
    _forget_package()
    monkeypatch.syspath_prepend(str(tmp_path / "code"))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "code"))  # the local runner hands it on to the jobs
    (tmp_path / "warm").mkdir()
    instance.report_runless_asset_event(
        AssetMaterialization(
            "fsx_warm_state", metadata={"dagster/uri": str(tmp_path / "warm")}, tags={DATA_VERSION_TAG: "warm-1"}
        )
    )
    settings = ZeroSettings(lake_uri=str(tmp_path / "lake"), fsx_mount=str(tmp_path))
    yield settings, LocalJobRunner(settings=settings)
    _forget_package()


def rehearse(instance, local, training: dict):
    settings, jobs = local
    return materialize(
        [fsx_warm_state, training_rehearsal],
        selection=[training_rehearsal],
        instance=instance,
        resources={"settings": settings, "jobs": jobs},
        run_config={
            "ops": {"training_rehearsal": {"config": {"training": training, "steps": 4, "stop_after_steps": 2}}}
        },
        raise_on_error=False,
    )


def failure(result) -> str:
    assert not result.success
    return "\n".join(e.event_specific_data.error.message for e in result.all_events if e.is_step_failure)


def test_a_trainer_that_does_not_resume_fails_the_rehearsal_naming_the_step(instance, local):
    message = failure(rehearse(instance, local, {"module": f"{PACKAGE}.forgetful"}))
    assert "the forced stop checkpointed at step 2, but the next attempt resumed from step 0" in message, message
    assert "does not resume from ZERO_CHECKPOINT_DIR" in message


def test_a_trainer_that_does_not_stop_fails_the_rehearsal(instance, local):
    message = failure(rehearse(instance, local, {"module": f"{PACKAGE}.unstoppable"}))
    assert "ran to its end instead of stopping after 2 steps" in message, message
    assert "must take --stop-after-steps" in message


def test_a_rejected_wandb_key_fails_the_preflight_before_any_job(instance, local, monkeypatch):
    settings, _ = local
    monkeypatch.setenv("WANDB_API_KEY", "revoked-key-0123456789")
    with wandb_server("the-good-key") as server:
        training = {"module": f"{PACKAGE}.forgetful", "wandb_mode": "online", "wandb_base_url": server.url}
        message = failure(rehearse(instance, local, training))
    assert "rehearsal not started, preflight failed: W&B key:" in message, message
    assert f"{server.url} rejected the W&B API key from WANDB_API_KEY (HTTP 401)" in message
    assert "revoked-key" not in message
    assert not list(Path(settings.jobs_root()).glob("training_rehearsal/*/runs")), "no job was launched"


def test_an_unwritable_checkpoint_prefix_fails_the_preflight_before_any_job(instance, local):
    settings, _ = local
    Path(settings.jobs_root()).mkdir(parents=True)
    (Path(settings.jobs_root()) / "trained_checkpoint").write_text("a file where the checkpoint folders go")
    message = failure(rehearse(instance, local, {"module": f"{PACKAGE}.forgetful"}))
    assert "preflight failed: trained_checkpoint checkpoints:" in message, message
    assert f"{Path(settings.jobs_root()) / 'trained_checkpoint'} is not writable by this process" in message
    assert not list(Path(settings.jobs_root()).glob("training_rehearsal/*/runs")), "no job was launched"
