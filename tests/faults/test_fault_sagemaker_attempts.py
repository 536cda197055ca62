"""SageMaker attempts under faults, through the real runner and Pipes client, with the fake SageMaker
(tests/helpers/sagemaker_fakes.py) really running a job script, S3 and CloudWatch Logs on a moto server:

- a `Completed` attempt whose output is missing is not reused: attempt 2 is launched;
- a `Completed` attempt whose output is complete but whose Pipes messages are gone counts as failed:
  attempt 2 is launched and its report read;
- a `Stopping` attempt is waited for until it is `Stopped` before attempt 2 is created;
- a throttled CloudWatch (job logs and Pipes messages) or SageMaker (DescribeProcessingJob) does not
  fail the run, and no report is lost;
- Processing inputs are prefixes ending in `/`: a sibling `raw-old/` is not pulled in;
- on the SageMaker backend the job-backed assets carry a RetryPolicy.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest
from dagster import AssetKey, asset, materialize
from helpers.sagemaker_fakes import FakeSageMaker, ThrottledLogs, fake_aws, fake_settings

from zero_assets.backends.sagemaker import runner as sagemaker_runner
from zero_assets.backends.sagemaker.job_params import build_job_params
from zero_assets.backends.sagemaker.runner import AwsClients, SageMakerJobRunner
from zero_assets.backends.sagemaker.settings import JobCompute
from zero_assets.core.job_request import JobRequest, job_name
from zero_assets.core.output_marker import mark_output_complete
from zero_assets.core.settings import REPO_ROOT, ZeroSettings

BUCKET = "zero-attempts"
JOB = '''
"""python -m zero_attempt_jobs.job --raw DIR --out DIR

Reports the files it was given, writes one file and a manifest."""
import argparse, json, logging
from pathlib import Path
from training_code.lib import job_env
from training_code.lib.output_manifest import write_output_manifest

parser = argparse.ArgumentParser()
parser.add_argument("--raw", type=Path, required=True)
parser.add_argument("--out", type=Path, required=True)
args = parser.parse_args()
with job_env.pipes_session() as pipes:
    logging.getLogger("zero.test").info("attempt job %s running", job_env.job_name())
    files = sorted(p.relative_to(args.raw).as_posix() for p in args.raw.rglob("*") if p.is_file())
    (args.out / "result.txt").write_text(job_env.job_name())
    write_output_manifest(args.out, ["result.txt"])
    metadata = {"inputs": json.dumps(files), "job": job_env.job_name()}
    pipes.report_asset_materialization(metadata=metadata, data_version="v1")
'''


@pytest.fixture
def backend(moto_endpoint, tmp_path, monkeypatch):
    """A SageMaker runner over the fake, its code package holding the test job, a per-test S3 prefix."""
    setup = fake_aws(moto_endpoint, tmp_path, monkeypatch, BUCKET, "zero_attempt_jobs", {"job": JOB})
    fake, s3, logs, package = setup.fake, setup.s3, setup.logs, setup.package
    monkeypatch.setattr(sagemaker_runner, "build_code_package", lambda **_: package)
    prefix = tmp_path.name
    for key in ("raw/a.txt", "raw/b/c.txt", "raw-old/stale.txt"):  # raw-old: a sibling that must not be pulled in
        s3.put_object(Bucket=BUCKET, Key=f"{prefix}/{key}", Body=key.encode())
    # Job names (hence log streams and Pipes prefixes) of their own: SageMaker never reuses a name.
    fingerprint = hashlib.sha256(f"{prefix}-{os.getpid()}".encode()).hexdigest()
    state = {"fake": fake, "s3": s3, "logs": logs, "package": package, "prefix": prefix, "fingerprint": fingerprint}
    monkeypatch.setattr(sagemaker_runner, "make_aws_clients", lambda region: AwsClients(fake, state["logs"], s3, None))
    return state


def make_runner(backend, messages: str = "s3") -> SageMakerJobRunner:
    root = f"s3://{BUCKET}/{backend['prefix']}"
    aws = fake_settings(
        bucket=BUCKET,
        prefix=backend["prefix"],
        map_report=JobCompute(instance_type="ml.m5.large"),
        poll_interval_s=0.2,
        messages=messages,
    )
    return SageMakerJobRunner(settings=ZeroSettings(raw_uri=f"{root}/raw", lake_uri=f"{root}/lake"), aws=aws)


def request_for(backend) -> JobRequest:
    root = f"s3://{BUCKET}/{backend['prefix']}"
    fingerprint = backend["fingerprint"]
    return JobRequest(
        asset="map_report",
        kind="processing",
        module="zero_attempt_jobs.job",
        fingerprint=fingerprint,
        inputs={"raw": f"{root}/raw"},
        outputs={"out": f"{root}/lake/map_report/{fingerprint[:16]}"},
    )


def run_job(runner: SageMakerJobRunner, request: JobRequest, instance) -> dict:
    """Materialize a probe asset whose step is `runner.run(request)`; returns its metadata."""

    @asset(name="probe")
    def probe(context):
        invocation, _ = runner.run(context, request)
        return invocation.get_materialize_result()

    assert materialize([probe], instance=instance).success
    metadata = instance.get_latest_materialization_event(AssetKey("probe")).asset_materialization.metadata
    return {key: value.value for key, value in metadata.items()}


def launched(fake: FakeSageMaker) -> list[str]:
    return [name for operation, name in fake.calls if operation == "CreateProcessingJob"]


def test_completed_attempt_with_missing_output_is_not_reused(backend, instance):
    runner, request = make_runner(backend), request_for(backend)
    attempt = lambda n: job_name("map_report", request.fingerprint, n)  # noqa: E731
    first = run_job(runner, request, instance)
    assert first["job"] == attempt(1) and json.loads(first["inputs"]) == ["a.txt", "b/c.txt"], (
        "the input is raw/, not raw-old/"
    )
    out_key = f"{backend['prefix']}/lake/map_report/{request.fingerprint[:16]}/result.txt"
    backend["s3"].delete_object(Bucket=BUCKET, Key=out_key)  # the rebuild is asked for because the output is gone

    second = run_job(runner, request, instance)
    assert launched(backend["fake"]) == [attempt(1), attempt(2)]
    assert second["job"] == attempt(2)
    assert backend["s3"].get_object(Bucket=BUCKET, Key=out_key)["Body"].read() == attempt(2).encode()


def test_completed_attempt_whose_messages_are_gone_counts_as_failed(backend, instance):
    runner, request = make_runner(backend), request_for(backend)
    attempt = lambda n: job_name("map_report", request.fingerprint, n)  # noqa: E731
    assert run_job(runner, request, instance)["job"] == attempt(1)
    mark_output_complete(request.outputs["out"], request.fingerprint)  # complete: the attempt qualifies for reuse
    s3 = backend["s3"]
    messages = s3.list_objects_v2(Bucket=BUCKET, Prefix=f"{backend['prefix']}/pipes/{attempt(1)}/messages/")["Contents"]
    s3.delete_objects(
        Bucket=BUCKET, Delete={"Objects": [{"Key": m["Key"]} for m in messages]}
    )  # expired by the lifecycle rule

    again = run_job(runner, request, instance)
    assert launched(backend["fake"]) == [attempt(1), attempt(2)], (
        "the reattached attempt had no report: the next one ran"
    )
    assert again["job"] == attempt(2) and json.loads(again["inputs"]) == ["a.txt", "b/c.txt"]


def test_stopping_attempt_is_waited_for_before_the_next_starts(backend, instance):
    runner, request = make_runner(backend), request_for(backend)
    attempt = lambda n: job_name("map_report", request.fingerprint, n)  # noqa: E731
    fake = backend["fake"]
    _, stopping = build_job_params(
        request,
        runner.aws,
        job_name=attempt(1),
        code=backend["package"],
        environment={},
        lake_uri=runner.settings.lake_uri,
    )
    fake.add_stopping_job("processing", stopping, polls=4)

    assert run_job(runner, request, instance)["job"] == attempt(2)
    assert launched(fake) == [attempt(2)]
    assert fake.seen_at_create[attempt(2)][attempt(1)] == "Stopped", (
        "attempt 2 was created only after attempt 1 had stopped"
    )
    assert fake.calls.count(("Describeprocessing", attempt(1))) >= 5, "polled while it was Stopping"


def test_throttled_cloudwatch_does_not_fail_the_run(backend, instance):
    throttled = ThrottledLogs(backend["logs"], first=3, every=3)
    backend["logs"] = throttled  # job logs and Pipes messages both read through it
    runner, request = make_runner(backend, messages="cloudwatch"), request_for(backend)
    attempt = lambda n: job_name("map_report", request.fingerprint, n)  # noqa: E731

    reported = run_job(runner, request, instance)
    assert reported["job"] == attempt(1) and json.loads(reported["inputs"]) == ["a.txt", "b/c.txt"], (
        "the report came through"
    )
    assert throttled.refused >= 4, f"CloudWatch refused {throttled.refused} of {throttled.reads} reads"
    assert launched(backend["fake"]) == [attempt(1)]


def test_throttled_sagemaker_describe_does_not_fail_the_run(backend, instance):
    fake = backend["fake"]
    fake.throttle_every = 2  # every other DescribeProcessingJob refused, before the launch and while waiting
    runner, request = make_runner(backend), request_for(backend)
    reported = run_job(runner, request, instance)
    assert reported["job"] == job_name("map_report", request.fingerprint, 1) and fake.throttled >= 2
    assert launched(fake) == [reported["job"]]


def test_job_backed_assets_carry_a_retry_policy_on_sagemaker():
    probe = (
        "from zero_assets.defs.assets import ALL_ASSETS; "
        "print({a.key.to_user_string(): a.op.retry_policy.max_retries if a.op.retry_policy else 0 for a in ALL_ASSETS})"
    )
    env = {**os.environ, "ZERO_BACKEND": "sagemaker"}
    env.pop("ZERO_JOB_RETRIES", None)
    found = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True, cwd=REPO_ROOT
    ).stdout
    retries = eval(found)  # noqa: S307 - our own probe's printed dict
    assert retries.pop("raw_image_index") == 0  # no job behind it
    # A rehearsal is not retried: what failed in it is its finding, and each build proves from scratch.
    assert retries.pop("training_rehearsal") == 0
    assert set(retries.values()) == {2}, retries
