"""PipesSageMakerClient against a moto server (S3, CloudWatch Logs) and a fake SageMaker that really
runs the job script: success, failure, MaxRuntimeExceeded, termination and reattach."""

from __future__ import annotations

import json
import re

import pytest
from dagster import AssetKey, asset, materialize
from dagster._core.errors import DagsterExecutionInterruptedError
from helpers.sagemaker_fakes import FakeSageMaker, fake_aws, fake_settings
from test_job_logs_captured import captured_stdout

from zero_assets.backends.sagemaker.code_package import upload_code_package
from zero_assets.backends.sagemaker.job_params import build_job_params
from zero_assets.backends.sagemaker.pipes_client import PipesSageMakerClient
from zero_assets.backends.sagemaker.settings import JobCompute
from zero_assets.core.job_request import JobRequest, job_name

BUCKET = "zero-test"
FINGERPRINT = "0123456789abcdef" * 4
TEST_JOB = '''
"""python -m zero_test_jobs.pipes_job --mode ok|fail|sleep [--seconds S] [--out DIR] [--release FILE]"""
import argparse, logging, time
from pathlib import Path
from training_code.lib import job_env

parser = argparse.ArgumentParser()
parser.add_argument("--mode", default="ok")
parser.add_argument("--seconds", type=float, default=0)
parser.add_argument("--out", type=Path)
parser.add_argument("--release", type=Path, help="run on until this file exists (at most 300 s)")
args = parser.parse_args()
with job_env.pipes_session() as pipes:
    logging.getLogger("zero.test").info("job %s running in mode %s", job_env.job_name(), args.mode)
    time.sleep(args.seconds)
    deadline = time.monotonic() + 300
    while args.release and not args.release.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    if args.mode == "fail":
        raise RuntimeError("planted failure: shard train-00007 is truncated")
    if args.out:
        (args.out / "result.txt").write_text("ok")
    pipes.report_asset_materialization(metadata={"rows": 7, "mode": args.mode}, data_version="v-" + args.mode)
'''


@pytest.fixture
def aws(moto_endpoint, tmp_path, monkeypatch):
    # Messages are keyed by job name and the names repeat across tests: each test reads its own prefix
    # (pipes_uri), so no test can pass on messages an earlier one left behind.
    setup = fake_aws(moto_endpoint, tmp_path, monkeypatch, BUCKET, "zero_test_jobs", {"pipes_job": TEST_JOB})
    s3, logs, package, fake = setup.s3, setup.logs, setup.package, setup.fake
    settings = fake_settings(
        bucket=BUCKET,
        prefix="zero",
        map_report=JobCompute(instance_type="ml.m5.large"),
        trained_checkpoint=JobCompute(instance_type="ml.m5.large"),
    )
    upload_code_package(package, settings.s3_root(), s3)
    s3.put_object(Bucket=BUCKET, Key=f"zero/lake/arrow_shards/{FINGERPRINT[:16]}/manifest.json", Body=b"{}")
    return {
        "s3": s3,
        "logs": logs,
        "fake": fake,
        "settings": settings,
        "package": package,
        "pipes_uri": setup.pipes_uri,
    }


def make_client(aws, client=None, **kwargs) -> PipesSageMakerClient:
    return PipesSageMakerClient(
        client=client or aws["fake"],
        logs_client=aws["logs"],
        s3_client=aws["s3"],
        pipes_uri=aws["pipes_uri"],
        poll_interval=0.2,
        message_poll_interval=0.2,
        **kwargs,
    )


def job_params(
    aws, kind: str, *, mode: str, seconds: float = 0, max_runtime_s: int | None = None, attempt: int = 1, release=None
):
    asset_name = "trained_checkpoint" if kind == "training" else "map_report"
    request = JobRequest(
        asset=asset_name,
        kind=kind,
        module="zero_test_jobs.pipes_job",
        fingerprint=FINGERPRINT,
        inputs={"train": f"s3://{BUCKET}/zero/lake/arrow_shards/{FINGERPRINT[:16]}"} if kind == "training" else {},
        outputs={} if kind == "training" else {"out": f"s3://{BUCKET}/zero/lake/{asset_name}/{FINGERPRINT[:16]}"},
        arguments={"mode": mode, "seconds": seconds, **({"release": str(release)} if release else {})},
    )
    _, params = build_job_params(
        request,
        aws["settings"],
        job_name=job_name(asset_name, FINGERPRINT, attempt),
        code=aws["package"],
        environment={},
    )
    if max_runtime_s is not None:
        params["StoppingCondition"]["MaxRuntimeInSeconds"] = max_runtime_s
    return params


def materialize_job(client, kind, params, instance, **kwargs):
    @asset(name="probe")
    def probe(context):
        return client.run(context=context, kind=kind, params=params).get_materialize_result()

    return materialize([probe], instance=instance, raise_on_error=False, **kwargs)


@pytest.mark.parametrize("kind", ["processing", "training"])
def test_success_reports_script_and_job_metadata(aws, instance, kind):
    params = job_params(aws, kind, mode="ok")
    result = materialize_job(make_client(aws), kind, params, instance)
    assert result.success
    metadata = instance.get_latest_materialization_event(AssetKey("probe")).asset_materialization.metadata
    assert metadata["rows"].value == 7  # from the script, through S3 Pipes messages
    name = params["TrainingJobName" if kind == "training" else "ProcessingJobName"]
    assert metadata["job_name"].value == name and metadata["job_status"].value == "Completed"
    assert name in metadata["console_url"].value and metadata["instance_type"].value == "ml.m5.large"
    assert (
        metadata["instance_seconds"].value >= 0
        and metadata["instance_count"].value == 1
        and metadata["status_history"].value
    )
    # The job's own log line, forwarded from CloudWatch to the step's stdout, not to the event log.
    [line] = re.findall(
        r"^\[algo-1-\d+\] (\{.*running in mode ok.*\})$", captured_stdout(instance, result.run_id), re.M
    )
    assert json.loads(line)["message"].endswith("running in mode ok"), "the job's JSON log line, host-prefixed"
    assert not [e for e in instance.all_logs(result.run_id) if "running in mode ok" in (e.user_message or "")]
    if kind == "processing":
        assert (
            aws["s3"]
            .get_object(Bucket=BUCKET, Key=f"zero/lake/map_report/{FINGERPRINT[:16]}/result.txt")["Body"]
            .read()
            == b"ok"
        )


@pytest.mark.parametrize("kind", ["processing", "training"])
def test_failure_names_job_reason_and_log_lines(aws, instance, kind):
    params = job_params(aws, kind, mode="fail")
    result = materialize_job(make_client(aws), kind, params, instance)
    assert not result.success
    message = result.get_step_failure_events()[0].step_failure_data.error.message
    name = params["TrainingJobName" if kind == "training" else "ProcessingJobName"]
    assert name in message and "Failed" in message
    assert "planted failure: shard train-00007 is truncated" in message  # FailureReason / ExitMessage
    assert "last log lines:\n[algo-1-" in message  # the tail of the job's CloudWatch stream


def test_max_runtime_stop_is_a_failure(aws, instance):
    params = job_params(aws, "processing", mode="sleep", seconds=30, max_runtime_s=2)
    result = materialize_job(make_client(aws), "processing", params, instance)
    assert not result.success
    message = result.get_step_failure_events()[0].step_failure_data.error.message
    assert f"{params['ProcessingJobName']} Stopped" in message  # boto3's waiter would have called this done


def test_training_max_runtime_is_reported(aws, instance):
    params = job_params(aws, "training", mode="sleep", seconds=30, max_runtime_s=3)
    result = materialize_job(make_client(aws), "training", params, instance)
    assert not result.success
    assert "MaxRuntimeExceeded" in result.get_step_failure_events()[0].step_failure_data.error.message


class InterruptAfterStart:
    """Raises the interrupt Dagster raises on run termination once the job is running."""

    def __init__(self, fake: FakeSageMaker) -> None:
        self._fake = fake
        self.meta = fake.meta

    def __getattr__(self, name):
        return getattr(self._fake, name)

    def describe_processing_job(self, ProcessingJobName: str):
        job = self._fake.describe_processing_job(ProcessingJobName=ProcessingJobName)
        if job["ProcessingJobStatus"] == "InProgress" and self._fake.jobs[ProcessingJobName]["process"] is not None:
            raise DagsterExecutionInterruptedError()
        return job


def test_termination_stops_the_job(aws, instance):
    fake = aws["fake"]
    params = job_params(aws, "processing", mode="sleep", seconds=60)
    client = make_client(aws, InterruptAfterStart(fake))
    result = materialize_job(client, "processing", params, instance)
    assert not result.success
    name = params["ProcessingJobName"]
    assert ("Stopprocessing", name) in fake.calls
    assert fake.wait_until_done(name, timeout=30)["status"] == "Stopped"


def test_restarted_run_reattaches_instead_of_launching(aws, instance, tmp_path):
    fake = aws["fake"]
    name_for = lambda attempt: job_name("map_report", FINGERPRINT, attempt)  # noqa: E731
    # The job runs until the probe below has found it (not for a fixed time, which a loaded machine
    # can outlast before the second run looks).
    release = tmp_path / "release"
    params = job_params(aws, "processing", mode="ok", release=release)
    # The first run dies while the job runs (no stop forwarded: the Dagster process itself went away).
    dying = make_client(aws, InterruptAfterStart(fake), forward_termination=False)
    assert not materialize_job(dying, "processing", params, instance).success
    assert fake.jobs[params["ProcessingJobName"]]["status"] == "InProgress"

    client = make_client(aws)

    @asset(name="probe")
    def probe(context):
        name = client.resolve_job_name(context, "processing", name_for)
        assert name == params["ProcessingJobName"]
        release.touch()
        return client.run(context=context, kind="processing", params=params).get_materialize_result()

    assert materialize([probe], instance=instance).success
    assert [c for c in fake.calls if c[0] == "CreateProcessingJob"] == [
        ("CreateProcessingJob", params["ProcessingJobName"])
    ]
    metadata = instance.get_latest_materialization_event(AssetKey("probe")).asset_materialization.metadata
    assert metadata["rows"].value == 7 and metadata["job_status"].value == "Completed"


def test_ended_attempt_moves_to_the_next_name(aws, instance):
    failed = job_params(aws, "processing", mode="fail")
    assert not materialize_job(make_client(aws), "processing", failed, instance).success
    client = make_client(aws)
    names = []

    @asset(name="probe")
    def probe(context):
        names.append(client.resolve_job_name(context, "processing", lambda a: job_name("map_report", FINGERPRINT, a)))

    materialize([probe], instance=instance)
    assert names == [job_name("map_report", FINGERPRINT, 2)]
