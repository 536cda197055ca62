"""The rehearsal on the SageMaker backend, under the fake (moto for S3 and CloudWatch Logs, the role simulated):
its own cheap two-instance compute, the forced stop as attempt 1 and the resume as attempt 2 of one job on
one checkpoint prefix (synced to S3 between them), the evaluation as a Processing job on its model; and the
gate, enforced on SageMaker's production profile by default, refusing trained_checkpoint before any
CreateTrainingJob until that rehearsal passed, then launching it.

The fake runs a training job's instances as that many torchrun processes on this machine (`MultiNodeFake`),
so a world of two is what two instances give; the trainer and evaluator are test modules kept to the
README's contract (checkpoint folder, model folder with its manifest, one Pipes report).
"""

from __future__ import annotations

import sys

import pytest
from dagster import AssetMaterialization, materialize
from helpers.sagemaker_fake_preflight import FakeIam
from helpers.sagemaker_fakes import FakeSageMaker, fake_aws, fake_settings

from zero_assets.backends.sagemaker import preflight as sagemaker_preflight
from zero_assets.backends.sagemaker import runner as sagemaker_runner
from zero_assets.backends.sagemaker.job_api import LEASE_TAG
from zero_assets.backends.sagemaker.preflight import PreflightClients
from zero_assets.backends.sagemaker.runner import AwsClients, SageMakerJobRunner
from zero_assets.core.fingerprints import DATA_VERSION_TAG
from zero_assets.core.job_request import LEASE_SUFFIX
from zero_assets.core.settings import ZeroSettings
from zero_assets.defs.assets import fsx_warm_state, trained_checkpoint, training_rehearsal
from zero_assets.defs.rehearsal_gate import GATE_VARIABLE

BUCKET, PACKAGE = "zero-rehearsal", "zero_rehearsal_sm_jobs"
TRAINER = '''
"""python -m zero_rehearsal_sm_jobs.trainer: counts steps from its newest checkpoint; stops when asked."""
import argparse, json, os, time
from training_code.lib import job_env
from training_code.lib.output_manifest import write_output_manifest

parser = argparse.ArgumentParser()
parser.add_argument("--max-steps", type=int, required=True)
parser.add_argument("--stop-after-steps", type=int, default=None)
args, _ = parser.parse_known_args()
main = os.environ.get("RANK", "0") == "0"
checkpoints = job_env.checkpoint_dir()
saved = sorted(checkpoints.glob("step-*.json")) if checkpoints.is_dir() else []
start = json.loads(saved[-1].read_text())["step"] if saved else 0
with job_env.pipes_session() as pipes:
    for step in range(start + 1, args.max_steps + 1):
        if args.stop_after_steps and step - start == args.stop_after_steps and step < args.max_steps:
            saved = checkpoints / f"step-{step:06d}.json"
            if main:
                checkpoints.mkdir(parents=True, exist_ok=True)
                saved.write_text(json.dumps({"step": step}))
            while not saved.exists():  # the other ranks fail only once it is written: torchrun then ends them all
                time.sleep(0.05)
            raise RuntimeError(f"forced stop at step {step} of {args.max_steps} (--stop-after-steps)")
    if main:
        model = job_env.model_dir()
        (model / "weights.json").write_text(json.dumps({"steps": args.max_steps}))
        write_output_manifest(model, ["weights.json"], format="rehearsal-test/1")
        report = {"steps": args.max_steps, "resumed_from_step": start, "world_size": int(os.environ["WORLD_SIZE"])}
        pipes.report_asset_materialization(metadata=report, data_version=f"steps-{args.max_steps}")
'''
EVALUATOR = '''
"""python -m zero_rehearsal_sm_jobs.evaluate --model DIR --shards DIR --out DIR: scores the test model."""
import argparse, json
from pathlib import Path
from training_code.lib import job_env
from training_code.lib.output_manifest import write_output_manifest

parser = argparse.ArgumentParser()
parser.add_argument("--model", type=Path, required=True)
parser.add_argument("--out", type=Path, required=True)
args, _ = parser.parse_known_args()
with job_env.pipes_session() as pipes:
    steps = json.loads((args.model / "weights.json").read_text())["steps"]
    (args.out / "metrics.json").write_text(json.dumps({"mAP": steps / 100}))
    write_output_manifest(args.out, ["metrics.json"], format="rehearsal-test-report/1")
    pipes.report_asset_materialization(metadata={"mAP": steps / 100}, data_version=f"map-{steps}")
'''


class MultiNodeFake(FakeSageMaker):
    """The fake, with a training job's instances as that many torchrun processes on this machine."""

    def _prepare_training(self, job: dict, opt):
        command, env = super()._prepare_training(job, opt)
        count = job["params"]["ResourceConfig"]["InstanceCount"]
        return [f"--nproc_per_node={count}" if token == "--nproc_per_node=1" else token for token in command], env


def _forget_package() -> None:
    for name in [name for name in sys.modules if name.split(".")[0] == PACKAGE]:
        del sys.modules[name]


@pytest.fixture
def sagemaker(moto_endpoint, tmp_path, monkeypatch, instance):
    monkeypatch.delenv(GATE_VARIABLE, raising=False)  # auto: enforced on SageMaker's production profile
    monkeypatch.delenv("ZERO_PROFILE", raising=False)
    setup = fake_aws(moto_endpoint, tmp_path, monkeypatch, BUCKET, PACKAGE, {"trainer": TRAINER, "evaluate": EVALUATOR})
    fake = MultiNodeFake(tmp_path / "sm", setup.s3, setup.logs, setup.fake.env)
    _forget_package()
    monkeypatch.syspath_prepend(str(tmp_path / "code"))
    iam = FakeIam()
    monkeypatch.setattr(
        sagemaker_runner, "make_aws_clients", lambda region: AwsClients(fake, setup.logs, setup.s3, None)
    )
    monkeypatch.setattr(sagemaker_preflight, "make_preflight_clients", lambda region: PreflightClients(iam, None))
    lake = f"s3://{BUCKET}/{tmp_path.name}/lake"
    setup.s3.put_object(Bucket=BUCKET, Key=f"{tmp_path.name}/lake/warm/manifest.json", Body=b"{}")
    instance.report_runless_asset_event(
        AssetMaterialization("fsx_warm_state", metadata={"dagster/uri": f"{lake}/warm"}, tags={DATA_VERSION_TAG: "w1"})
    )
    settings = ZeroSettings(raw_uri=f"s3://{BUCKET}/raw", lake_uri=lake)
    aws = fake_settings(bucket=BUCKET, prefix=tmp_path.name, poll_interval_s=0.2)
    yield settings, SageMakerJobRunner(settings=settings, aws=aws), fake, iam
    _forget_package()


def run(instance, sagemaker, asset, config: dict):
    settings, jobs, _, _ = sagemaker
    return materialize(
        [fsx_warm_state, trained_checkpoint, training_rehearsal],
        selection=[asset],
        instance=instance,
        resources={"settings": settings, "jobs": jobs},
        run_config={"ops": {asset.key.to_user_string(): {"config": config}}},
        raise_on_error=False,
    )


def test_the_rehearsal_runs_on_two_instances_stops_resumes_and_evaluates_then_the_gate_opens(instance, sagemaker):
    _, _, fake, iam = sagemaker
    training = {"module": f"{PACKAGE}.trainer", "processes": 1}

    refused = run(instance, sagemaker, trained_checkpoint, training)
    assert not refused.success and not any(c[0] == "CreateTrainingJob" for c in fake.calls), "refused before launch"

    rehearsal = run(
        instance,
        sagemaker,
        training_rehearsal,
        {"training": training, "evaluation": {"module": f"{PACKAGE}.evaluate"}, "steps": 4, "stop_after_steps": 2},
    )
    assert rehearsal.success, [e.event_specific_data.error.message for e in rehearsal.all_events if e.is_step_failure]
    created = [name for operation, name in fake.calls if operation.startswith("Create")]
    assert [name.rsplit("-", 2)[0] for name in created] == [
        "zero-training-rehearsal",
        "zero-training-rehearsal",
        "zero-rehearsal-evaluation",
    ]
    stop, resume, evaluate = (fake.jobs[name] for name in created)
    assert [created[0][-3:], created[1][-3:]] == ["-a1", "-a2"], "the resume is the next attempt of the same job"
    assert stop["status"] == "Failed" and "forced stop at step 2 of 4" in stop["failure"]
    assert stop["params"]["HyperParameters"]["stop-after-steps"] == "2"
    assert "stop-after-steps" not in resume["params"]["HyperParameters"]
    assert stop["params"]["CheckpointConfig"] == resume["params"]["CheckpointConfig"], "one checkpoint prefix"
    assert resume["params"]["ResourceConfig"]["InstanceType"] == "ml.g4dn.xlarge"
    assert resume["params"]["ResourceConfig"]["InstanceCount"] == 2
    assert resume["params"]["InfraCheckConfig"] == {"EnableInfraCheck": True}
    cluster = evaluate["params"]["ProcessingResources"]["ClusterConfig"]
    assert (cluster["InstanceType"], cluster["InstanceCount"]) == ("ml.g4dn.xlarge", 1)
    proved = {
        k: v.value for k, v in rehearsal.asset_materializations_for_node("training_rehearsal")[0].metadata.items()
    }
    assert (proved["resumed_from_step"], proved["world_size"], proved["instance_count"]) == (2, 2, 2)
    assert proved["mAP"] == 0.04
    assert proved["instance_seconds"] > 0, "the three jobs' instance-seconds, the forced stop's included"
    leases = {
        tag["Value"] for job in (stop, resume, evaluate) for tag in job["params"]["Tags"] if tag["Key"] == LEASE_TAG
    }
    assert leases == {proved["dagster/uri"] + LEASE_SUFFIX}, "each job names the lease its build holds (orphaned_jobs)"
    assert iam.calls and iam.calls[0]["PolicySourceArn"] == "arn:aws:iam::123456789012:role/zero-jobs"

    trained = run(instance, sagemaker, trained_checkpoint, training)
    assert trained.success
    (check,) = trained.get_asset_check_evaluations()
    assert check.passed and check.metadata["rehearsal_run_id"].value == rehearsal.run_id
