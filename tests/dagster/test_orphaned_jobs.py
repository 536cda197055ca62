"""A SageMaker job whose Dagster process was killed is stopped once no live run holds its output lease.

The lease lives on a moto S3 server; the run that builds the output is a real process holding it
with `hold_lease` (as a step does while it waits on its job), killed with SIGKILL or ending normally;
the job is a real process run by the SageMaker fake, created from `build_job_params` (so with the
`zero:lease` tag the runner sends). `orphaned_jobs_sensor` is ticked as the daemon ticks it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from dagster import DagsterInstance, build_sensor_context
from helpers.sagemaker_fakes import fake_aws, fake_settings

from zero_assets.backends.sagemaker import runner as sagemaker_runner
from zero_assets.backends.sagemaker.code_package import upload_code_package
from zero_assets.backends.sagemaker.job_api import LEASE_TAG, judge
from zero_assets.backends.sagemaker.job_params import build_job_params
from zero_assets.backends.sagemaker.runner import AwsClients, SageMakerJobRunner
from zero_assets.backends.sagemaker.settings import JobCompute
from zero_assets.core.job_request import JobRequest, job_name
from zero_assets.core.settings import REPO_ROOT, ZeroSettings
from zero_assets.defs.orphaned_jobs import orphaned_jobs_sensor
from zero_assets.launch.output_lease import live_holder

BUCKET = "zero-orphans"
FINGERPRINT = "fedcba9876543210" * 4
STALE_S = 10  # the shortest stale limit allowed (lease_store.MIN_STALE_S): a killed holder is gone after it
# SIGTERM back to its default: a disposition ignored by the test session would be inherited.
SLEEPER = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_DFL)\ntime.sleep(300)\n"
HOLDER = """
import sys
from zero_assets.launch.output_lease import hold_lease
with hold_lease(sys.argv[1], sys.argv[2]):
    print("holding", flush=True)
    sys.stdin.readline()  # until the test ends the step
"""


@pytest.fixture
def aws(moto_endpoint, tmp_path, monkeypatch):
    setup = fake_aws(moto_endpoint, tmp_path, monkeypatch, BUCKET, "zero_orphan_jobs", {"sleeper": SLEEPER})
    monkeypatch.setenv("ZERO_OUTPUT_LEASE_STALE_S", str(STALE_S))
    settings = sagemaker_settings()
    upload_code_package(setup.package, settings.s3_root(), setup.s3)
    monkeypatch.setattr(
        sagemaker_runner, "make_aws_clients", lambda region: AwsClients(setup.fake, setup.logs, setup.s3, None)
    )
    yield setup, settings
    for name, job in setup.fake.jobs.items():  # nothing outlives the test
        if job["status"] == "InProgress":
            getattr(setup.fake, f"stop_{job['kind']}_job")(**{f"{job['kind'].capitalize()}JobName": name})


def sagemaker_settings(**fields):
    return fake_settings(bucket=BUCKET, prefix="zero", map_report=JobCompute(instance_type="ml.m5.large"), **fields)


def launch(setup, settings, lease: str, label: str) -> str:
    """A processing job of the graph sleeping on the fake, its request naming `lease`; returns its name."""
    output = f"s3://{BUCKET}/zero/lake/map_report/{label}"
    request = JobRequest(
        asset="map_report",
        kind="processing",
        module="zero_orphan_jobs.sleeper",
        fingerprint=FINGERPRINT,
        outputs={"out": output},
        lease=lease,
    )
    name = job_name(f"map-report-{label}", FINGERPRINT, 1)
    _, params = build_job_params(request, settings, job_name=name, code=setup.package, environment={})
    setup.fake.create_processing_job(**params)
    return name


def hold(lease: str, run_id: str) -> subprocess.Popen:
    """A process holding `lease` until a line reaches its stdin, as a step holds its output's lease while
    its job runs."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, lease, run_id],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout.readline().strip() == "holding"
    return process


def tick(cursor: str | None, grace_s: int):
    jobs = SageMakerJobRunner(
        settings=ZeroSettings(raw_uri=f"s3://{BUCKET}/raw", lake_uri=f"s3://{BUCKET}/zero/lake"),
        aws=sagemaker_settings(orphaned_job_grace_s=grace_s),
    )
    with build_sensor_context(instance=DagsterInstance.ephemeral(), resources={"jobs": jobs}, cursor=cursor) as context:
        result = orphaned_jobs_sensor.evaluate_tick(context)
    return result, result.cursor


def status(setup, name: str) -> str:
    return setup.fake.jobs[name]["status"]


def wait_until_gone(lease: str) -> None:
    deadline = time.monotonic() + STALE_S + 20
    while live_holder(lease) is not None:
        assert time.monotonic() < deadline, f"the lease {lease} still has a live holder"
        time.sleep(0.5)


@pytest.mark.slow
def test_a_job_is_stopped_only_once_no_live_run_has_held_its_lease_for_the_grace(aws):
    setup, settings = aws
    lease = f"s3://{BUCKET}/zero/lake/map_report/orphan.lease.json"
    first = hold(lease, "run-killed")
    job = launch(setup, settings, lease, "orphan")
    untagged = launch(setup, settings, "", "untagged")  # launched before the tag existed: never judged
    assert LEASE_TAG not in {t["Key"] for t in setup.fake.jobs[untagged]["params"]["Tags"]}

    result, cursor = tick(None, grace_s=2)
    assert json.loads(cursor) == {} and status(setup, job) == "InProgress", result.skip_message

    first.send_signal(signal.SIGKILL)  # the step is killed mid-job: its lease goes unrenewed
    first.wait()
    wait_until_gone(lease)
    _, cursor = tick(cursor, grace_s=2)
    assert set(json.loads(cursor)) == {job} and status(setup, job) == "InProgress", "within the grace: kept"

    retry = hold(lease, "run-retry")  # a retry reattaches: it takes the stale lease over
    _, cursor = tick(cursor, grace_s=2)
    assert json.loads(cursor) == {} and status(setup, job) == "InProgress", "adopted by a live run: kept"

    retry.communicate("end\n", timeout=30)  # the retry's step fails on its own side and releases the lease
    assert live_holder(lease) is None
    _, cursor = tick(cursor, grace_s=2)
    assert status(setup, job) == "InProgress", "orphaned for less than the grace"
    time.sleep(2.5)
    result, cursor = tick(cursor, grace_s=2)
    assert json.loads(cursor) == {}, result.skip_message
    assert [name for operation, name in setup.fake.calls if operation.startswith("Stop")] == [job]
    assert setup.fake.wait_until_done(job, timeout=60)["status"] == "Stopped"
    assert status(setup, untagged) == "InProgress", "a job without a lease tag is never stopped"


class Job:
    def __init__(self, name: str, lease: str | None) -> None:
        self.name, self.tags = name, {"zero:asset": "map_report", **({LEASE_TAG: lease} if lease else {})}


def test_judging_keeps_jobs_someone_waits_on_and_stops_the_rest_after_the_grace():
    live = {"s3://b/held.lease.json"}
    running = [Job("held", "s3://b/held.lease.json"), Job("orphan", "s3://b/gone.lease.json"), Job("untagged", None)]

    def holder(lease):
        return {"run_id": "r"} if lease in live else None

    first = judge(running, {}, now=100.0, grace_s=60, holder=holder)
    assert first.stop == [] and first.orphaned_since == {"orphan": 100.0}
    later = judge(running, first.orphaned_since, now=159.0, grace_s=60, holder=holder)
    assert later.stop == [] and later.orphaned_since == {"orphan": 100.0}, "the grace counts from the first tick"
    due = judge(running, later.orphaned_since, now=160.0, grace_s=60, holder=holder)
    assert [job.name for job in due.stop] == ["orphan"] and due.orphaned_since == {}
    live.add("s3://b/gone.lease.json")  # a retry took the lease: the clock starts over if it is lost again
    adopted = judge(running, later.orphaned_since, now=160.0, grace_s=60, holder=holder)
    assert adopted.stop == [] and adopted.orphaned_since == {}
