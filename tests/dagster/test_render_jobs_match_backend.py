"""`render-jobs` prints the requests the SageMaker backend sends, for the same environment.

The environment names no raw root or lake (`ZERO_RAW_URI`, `ZERO_LAKE_URI` unset), so the backend's
own defaults decide. The code location's resources (`resources_from_env`, as `definitions.py` builds
them) materialize one source's job-backed assets under the SageMaker fake; just before each,
`zero-assets render-jobs --from-instance` renders from the same Dagster instance. Each
Create*Job request the fake received must be the rendered one, but for the tags a Dagster run adds
(`dagster/run-id`, ...): a second settings road for `render-jobs` shows up here as a difference.
"""

from __future__ import annotations

import json
import os

import pytest
from helpers.graph_runs import materialize_source, materialize_tail, sources_of
from helpers.sagemaker_fakes import FakeSageMaker, aws_env

from training_code.lib.aws_clients import client as aws_client
from training_code.lib.storage import publish_folder
from zero_assets.backends.from_env import resolved, resources_from_env
from zero_assets.backends.sagemaker import runner as sagemaker_runner
from zero_assets.backends.sagemaker.runner import AwsClients
from zero_assets.core.settings import REPO_ROOT
from zero_assets.defs.assets import (
    arrow_shards,
    fsx_warm_state,
    map_report,
    raw_image_index,
    trained_checkpoint,
    training_set,
    validated_images,
)
from zero_assets.ops.cli import main

SOURCE = "line_a_camera"
FAST_TRAINING = {"ops": {"trained_checkpoint": {"config": {"max_steps": 4, "checkpoint_every": 2, "batch_size": 4}}}}
SAGEMAKER_ENV = {
    "ZERO_BACKEND": "sagemaker",
    "ZERO_SM_REGION": "us-east-1",
    "ZERO_SM_ROLE_ARN": "arn:aws:iam::123456789012:role/zero-jobs",
    "ZERO_SM_TRAINING_IMAGE_URI": "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.5-gpu-py311",
    "ZERO_SM_PROCESSING_IMAGE_URI": "123456789012.dkr.ecr.us-east-1.amazonaws.com/zero-processing:1",
    "ZERO_SM_KMS_KEY_ID": "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab",
    "ZERO_SM_TAGS": "team=vision,cost-center=ml-42",
    "ZERO_SM_POLL_INTERVAL_S": "0.3",  # how often the runner describes a job: never part of a request
}


def _only_this_environment(monkeypatch, env: dict[str, str]) -> None:
    for key in [k for k in os.environ if k.startswith("ZERO_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)


def _rendered(tmp_path, name: str, *options: str) -> dict[str, dict]:
    """`zero-assets render-jobs --from-instance` as a user runs it: {job name: request}."""
    out = tmp_path / name
    assert main(["render-jobs", "--out", str(out), "--source", SOURCE, "--from-instance", *options]) == 0
    requests = [json.loads(path.read_text()) for path in sorted(out.glob("*Job.json"))]
    names = ("ProcessingJobName", "TrainingJobName", "HyperParameterTuningJobName")
    return {next(params[n] for n in names if n in params): params for params in requests}


def _assert_sent_as_rendered(fake: FakeSageMaker, rendered: dict[str, dict], asset: str) -> list[str]:
    """Every job the fake got for `asset` is the request rendered under its name; returns the names."""
    names = [name for name in fake.jobs if name.startswith(f"zero-{asset.replace('_', '-')}-")]
    assert names, f"no {asset} job reached the fake: {sorted(fake.jobs)}"
    for name in names:
        assert name in rendered, f"{name} was sent, render-jobs named {sorted(rendered)}"
        sent = json.loads(json.dumps(fake.jobs[name]["params"]))  # as JSON, like the rendered file
        run_tags = [tag for tag in sent["Tags"] if tag not in rendered[name]["Tags"]]
        assert run_tags and all(tag["Key"].startswith("dagster/") for tag in run_tags), run_tags
        sent["Tags"] = [tag for tag in sent["Tags"] if tag not in run_tags]
        assert sent == rendered[name]
    return names


def _backend_from(env: dict[str, str], moto_endpoint, tiny_raw_root, instance, tmp_path, monkeypatch):
    """This environment only, the code location's resources for it, the raw root where they read it,
    and the SageMaker fake behind the runner: (resources, fake)."""
    bucket = env["ZERO_SM_BUCKET"]
    aws = aws_env(moto_endpoint)
    _only_this_environment(monkeypatch, {**aws, **SAGEMAKER_ENV, **env, "DAGSTER_HOME": instance.root_directory})
    s3, logs = aws_client("s3", endpoint_url=moto_endpoint), aws_client("logs", endpoint_url=moto_endpoint)
    s3.create_bucket(Bucket=bucket)
    resources = resources_from_env()
    # The documented defaults on this backend (docs/sagemaker.md), where the raw data is put.
    settings = resolved(resources["settings"])
    assert (settings.raw_uri, settings.lake_uri) == (f"s3://{bucket}/zero/raw", f"s3://{bucket}/zero/lake")
    publish_folder(tiny_raw_root, settings.raw_uri)
    fake = FakeSageMaker(tmp_path / "sm", s3, logs, {**aws, "PYTHONPATH": str(REPO_ROOT), "ZERO_PIPES_FLUSH_S": "0.2"})
    monkeypatch.setattr(sagemaker_runner, "make_aws_clients", lambda region: AwsClients(fake, logs, s3, None))
    return resources, fake


# Production packs on two instances here (a few KB an instance, at most two): both stages are compared too.
PACKING_SPREAD_ENV = {
    "ZERO_SM_ARROW_SHARDS_BYTES_PER_INSTANCE": "20000",
    "ZERO_SM_ARROW_SHARDS_MAX_INSTANCE_COUNT": "2",
}


@pytest.mark.parametrize("profile", ["production", "rehearsal"])
def test_render_jobs_renders_the_validation_and_packing_jobs_the_sagemaker_backend_sends(
    moto_endpoint, tiny_raw_root, instance, tmp_path, monkeypatch, profile
):
    env = {"ZERO_SM_BUCKET": f"zero-render-{profile}", "ZERO_PROFILE": profile, **PACKING_SPREAD_ENV}
    resources, fake = _backend_from(env, moto_endpoint, tiny_raw_root, instance, tmp_path, monkeypatch)
    assert materialize_source(SOURCE, instance=instance, resources=resources, assets=[raw_image_index]).success
    rendered = _rendered(tmp_path, "before-validated_images")
    assert materialize_source(SOURCE, instance=instance, resources=resources, assets=[validated_images]).success
    sent = _assert_sent_as_rendered(fake, rendered, "validated_images")
    assert materialize_tail(instance=instance, resources=resources, assets=[training_set]).success
    rendered = _rendered(tmp_path, "before-arrow_shards")
    assert materialize_tail(instance=instance, resources=resources, assets=[arrow_shards]).success
    sent += _assert_sent_as_rendered(fake, rendered, "arrow_shards")
    # Rehearsal spreads validation over two instances, production the pack: both jobs of each were compared.
    assert len(sent) == 3, sent
    packed = [name for name in sent if name.startswith("zero-arrow-shards-")]
    assert (len(packed) == 2) == (profile == "production"), packed


@pytest.mark.slow  # the whole graph on the SageMaker fake (a short training): about a minute on an idle machine
def test_render_jobs_renders_the_training_and_evaluation_jobs_the_sagemaker_backend_sends(
    moto_endpoint, tiny_raw_root, instance, tmp_path, monkeypatch
):
    # ZERO_REHEARSAL_GATE=off: trains on SageMaker without a rehearsal (the gate is test_rehearsal_gate's).
    env = {"ZERO_SM_BUCKET": "zero-render-tail", "ZERO_SM_USE_SPOT": "true", "ZERO_REHEARSAL_GATE": "off"}
    resources, fake = _backend_from(env, moto_endpoint, tiny_raw_root, instance, tmp_path, monkeypatch)
    run_config = tmp_path / "run_config.json"  # the run config both get: render-jobs renders configs, not defaults only
    run_config.write_text(json.dumps(FAST_TRAINING))
    for source in sources_of(tiny_raw_root):  # a val split needs more than one source of the tiny root
        assert materialize_source(source, instance=instance, resources=resources).success
    assert materialize_tail(
        instance=instance, resources=resources, assets=[training_set, arrow_shards, fsx_warm_state]
    ).success
    sent = []
    for asset in (trained_checkpoint, map_report):
        name = asset.key.to_user_string()
        rendered = _rendered(tmp_path, f"before-{name}", "--config", str(run_config))
        its_config = {"ops": {op: config for op, config in FAST_TRAINING["ops"].items() if op == name}}
        assert materialize_tail(instance=instance, resources=resources, assets=[asset], run_config=its_config).success
        sent += _assert_sent_as_rendered(fake, rendered, name)
    training = fake.jobs[sent[0]]["params"]
    assert training["HyperParameters"]["max-steps"] == "4" and training["EnableManagedSpotTraining"]
    assert training["CheckpointConfig"]["S3Uri"].startswith(
        "s3://zero-render-tail/zero/checkpoints/trained_checkpoint/"
    )
