"""W&B from the graph: training and evaluation runs of one checkpoint in one group, their locations in
the metadata, the shard set and the model as artifacts both runs name, run ids from the jobs'
fingerprints, the API key kept out of jobs, requests and files, and W&B settings outside the cache
fingerprint. The offline runs are read back from their `.wandb` logs (tests/helpers/wandb_offline.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import unquote, urlparse

import boto3
import pytest
from conftest import make_resources
from helpers.graph_runs import materialize_graph, materialize_tail
from helpers.wandb_offline import offline_run
from moto import mock_aws
from test_render_jobs import BASE_ENV, render

from training_code.lib import wandb_run
from zero_assets.backends.sagemaker.code_package import build_code_package
from zero_assets.backends.sagemaker.job_params import check_environment
from zero_assets.core.fingerprints import FingerprintInputs, UpstreamOutput
from zero_assets.core.job_request import build_job_request
from zero_assets.defs.assets import trained_checkpoint
from zero_assets.defs.assets.trained_checkpoint import TRAIN_MODULE, TrainConfig

KEY = "wandb-key-that-must-never-be-written-0123456789"
FAST = {"max_steps": 6, "checkpoint_every": 6, "batch_size": 4, "processes": 1}


@pytest.mark.slow  # the whole graph on the tiny demo: about 2 minutes on 2 shared cores
def test_training_and_its_evaluation_log_to_one_group_and_the_metadata_says_where(
    instance, resources, tiny_raw_root, tmp_path, monkeypatch
):
    wandb_dir = tmp_path / "wandb-runs"
    monkeypatch.setenv("WANDB_DIR", str(wandb_dir))
    monkeypatch.setenv("WANDB_API_KEY", KEY)  # in the Dagster process: an offline job must not get it
    train = {**FAST, "wandb_project": "zero-lineage"}
    per_source, tail = materialize_graph(
        tiny_raw_root,
        instance=instance,
        resources=resources,
        run_config={"ops": {"trained_checkpoint": {"config": train}}},
    )
    assert tail.success
    trained = {k: v.value for k, v in tail.asset_materializations_for_node("trained_checkpoint")[0].metadata.items()}
    report = {k: v.value for k, v in tail.asset_materializations_for_node("map_report")[0].metadata.items()}
    group = f"checkpoint-{trained['fingerprint'][:16]}"
    assert trained["wandb_group"] == report["wandb_group"] == group, (
        "the group is the checkpoint's fingerprint, for both runs"
    )

    runs = {run["job_type"]: run for run in map(offline_run, sorted(wandb_dir.glob("wandb/offline-run-*")))}
    assert set(runs) == {"training", "evaluation"}
    assert {run["group"] for run in runs.values()} == {group} and {run["project"] for run in runs.values()} == {
        "zero-lineage"
    }
    assert Path(trained["wandb_run"]) == runs["training"]["folder"], (
        "trained_checkpoint names the offline run to `wandb sync`"
    )
    assert Path(report["wandb_run"]) == runs["evaluation"]["folder"]
    assert runs["training"]["history"]["_step"] == FAST["max_steps"] and runs["training"]["history"]["loss"] > 0

    # Lineage: both runs use the shard set (one artifact, one digest); training logs the model, evaluation uses it.
    fingerprint16 = trained["fingerprint"][:16]
    assert runs["training"]["run_id"] == trained["wandb_run_id"] == f"zero-trained-checkpoint-{fingerprint16}"
    assert runs["evaluation"]["run_id"] == report["wandb_run_id"] == f"zero-map-report-{report['fingerprint'][:16]}"
    model = f"model-{fingerprint16}"
    assert trained["wandb_model_artifact"] == model and report["wandb_model_artifact"] == model
    shard_set = trained["wandb_shard_set_artifact"]
    assert report["wandb_shard_set_artifact"] == shard_set and shard_set.startswith("shards-")
    assert runs["training"]["logged"] == {model: runs["evaluation"]["used"][model]}, "the model the evaluation used"
    assert runs["training"]["used"] == {shard_set: runs["evaluation"]["used"][shard_set]}
    assert set(runs["evaluation"]["used"]) == {shard_set, model}
    assert not [name for name in runs["evaluation"]["logged"] if not name.startswith("run-")], "its tables only"
    recorded = json.loads(runs["training"]["artifacts"][model].metadata)
    assert (
        recorded["data_version"]
        == tail.asset_materializations_for_node("trained_checkpoint")[0].tags["dagster/data_version"]
    ), "the model artifact names the checkpoint's data version"
    pointers = runs["evaluation"]["artifacts"][shard_set].manifest.contents
    assert "manifest.json" in {entry.path for entry in pointers} and any(e.path.startswith("shards/") for e in pointers)
    assert all(entry.ref.startswith("file://") and not entry.local_path for entry in pointers), "pointers, no copy"
    assert all(Path(unquote(urlparse(entry.ref).path)).is_file() for entry in pointers), "to the files the jobs read"

    # Nothing the jobs wrote (runs, job logs) holds the key that only the Dagster process had.
    written = [*wandb_dir.rglob("*"), *Path(resources["settings"].jobs_root()).rglob("*")]
    assert not [p for p in written if p.is_file() and not p.is_symlink() and KEY.encode() in p.read_bytes()]
    assert KEY not in repr({**trained, **report})

    # Other W&B settings, same checkpoint: the cache answers, no training job runs, the earlier run is named.
    again = materialize_tail(
        instance=instance,
        resources=resources,
        assets=[trained_checkpoint],
        run_config={
            "ops": {
                "trained_checkpoint": {
                    "config": {**FAST, "wandb_project": "elsewhere", "wandb_group": "other", "wandb_mode": "disabled"}
                }
            }
        },
    )
    hit = {k: v.value for k, v in again.asset_materializations_for_node("trained_checkpoint")[0].metadata.items()}
    assert (
        hit["cache"] == "hit"
        and hit["fingerprint"] == trained["fingerprint"]
        and hit["wandb_run"] == trained["wandb_run"]
    )


def test_wandb_settings_leave_the_fingerprint_alone():
    warm = [UpstreamOutput("fsx_warm_state", "/lake/warm", "v1")]

    def fingerprint(config: TrainConfig) -> str:
        return FingerprintInputs.of(TRAIN_MODULE, config.hyperparameters(), warm).fingerprint

    base = fingerprint(TrainConfig())
    tracked = TrainConfig(
        wandb_mode="online",
        wandb_project="p",
        wandb_entity="team",
        wandb_group="g",
        wandb_base_url="https://wandb.example",
    )
    assert fingerprint(tracked) == base
    assert fingerprint(TrainConfig(lr=1e-3)) != base, "a hyperparameter does move it"
    assert tracked.tracking(base) == {
        "wandb_mode": "online",
        "wandb_project": "p",
        "wandb_entity": "team",
        "wandb_group": "g",
        "wandb_base_url": "https://wandb.example",
    }


def test_sagemaker_jobs_get_the_secret_reference_and_never_the_key(tmp_path, monkeypatch):
    arn = "arn:aws:secretsmanager:us-east-1:123456789012:secret:zero/wandb-AbCdEf"
    monkeypatch.setenv("WANDB_API_KEY", KEY)
    requests = render(tmp_path, monkeypatch, {**BASE_ENV, "ZERO_SM_WANDB_SECRET_ARN": arn})
    training, evaluation = (
        requests["trained_checkpoint.CreateTrainingJob.json"],
        requests["map_report.CreateProcessingJob.json"],
    )
    assert (
        training["Environment"]["ZERO_WANDB_SECRET_ARN"] == arn
        and evaluation["Environment"]["ZERO_WANDB_SECRET_ARN"] == arn
    )
    assert training["HyperParameters"]["wandb-mode"] == "offline" and training["HyperParameters"][
        "wandb-group"
    ].startswith("checkpoint-")
    assert all(
        KEY not in json.dumps(params) and "WANDB_API_KEY" not in json.dumps(params) for params in requests.values()
    )
    assert "ZERO_WANDB_SECRET_ARN" not in requests["arrow_shards.CreateProcessingJob.json"]["Environment"], (
        "only the jobs that track"
    )
    assert "wandb==" in build_code_package().files["requirements.txt"].decode(), (
        "the trainer imports wandb on SageMaker too"
    )
    with pytest.raises(ValueError, match="WANDB_API_KEY"):
        check_environment({"WANDB_API_KEY": KEY}, "training")


@pytest.mark.parametrize("stored", [KEY, json.dumps({"WANDB_API_KEY": KEY})], ids=["plain", "json"])
def test_the_job_reads_the_key_from_secrets_manager(stored, monkeypatch):
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "eu-west-1",
    }.items():
        monkeypatch.setenv(name, value)
    with mock_aws():
        arn = boto3.client("secretsmanager", region_name="eu-west-1").create_secret(
            Name="zero/wandb", SecretString=stored
        )["ARN"]
        assert wandb_run.api_key_from_secret(arn) == KEY
    with pytest.raises(ValueError, match="not a Secrets Manager secret ARN"):
        wandb_run.api_key_from_secret("arn:aws:s3:::bucket")


def test_a_local_job_gets_the_wandb_key_only_when_it_tracks_online(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", KEY)
    resources = make_resources(tmp_path / "raw", tmp_path / "state")
    settings, runner = resources["settings"], resources["jobs"]
    warm = [UpstreamOutput("fsx_warm_state", str(tmp_path / "warm"), "v1")]

    def environment(mode: str) -> dict:
        config = TrainConfig(wandb_mode=mode)
        request = build_job_request(
            "trained_checkpoint",
            settings=settings,
            kind="training",
            module=TRAIN_MODULE,
            config=config.hyperparameters(),
            upstream=warm,
            inputs={"train": str(tmp_path / "warm")},
            tracking=config.tracking("0" * 64),
        )
        opt_ml = tmp_path / mode / "opt" / "ml"
        (opt_ml / "input" / "config").mkdir(parents=True)
        return runner._environment(
            opt_ml, request, {"train": tmp_path / "warm", "out": opt_ml / "model"}, "algo-1", ["algo-1"]
        )

    assert environment("online")["WANDB_API_KEY"] == KEY
    assert "WANDB_API_KEY" not in environment("offline") and "WANDB_API_KEY" not in environment("disabled")
