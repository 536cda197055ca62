"""A job's log lines land in the Dagster step's captured stdout (the UI's stdout tab), one stream per
host, not one Dagster event per line; a failure still quotes the last lines.

SageMaker: a Processing job on two hosts of the fake (its lines shipped to moto's CloudWatch Logs),
read through PipesSageMakerClient. Locally: real job subprocesses under LocalJobRunner, whose output
also lands in each host's job.log. Both on a real Dagster instance, read back through its compute
log manager.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import sys
from pathlib import Path

import pytest
from dagster import DagsterEventType, asset, materialize
from helpers.sagemaker_fakes import fake_aws, fake_settings, job_package

from zero_assets.backends.local.process import end_process_group, start_job_process
from zero_assets.backends.local.runner import LocalJobRunner
from zero_assets.backends.sagemaker.code_package import upload_code_package
from zero_assets.backends.sagemaker.job_params import build_job_params
from zero_assets.backends.sagemaker.pipes_client import PipesSageMakerClient
from zero_assets.backends.sagemaker.settings import JobCompute
from zero_assets.core.job_request import JobRequest, Reads, job_name
from zero_assets.core.settings import ZeroSettings

BUCKET = "zero-logs"
FINGERPRINT = "fedcba9876543210" * 4
LINES = 120  # per host: far more than the handful of status events a run may carry
CHATTY_JOB = '''
"""python -m zero_log_jobs.chatty --lines N [--fail 1] [--out DIR] [--split DIR]"""
import argparse, logging
from pathlib import Path
from training_code.lib import job_env

parser = argparse.ArgumentParser()
parser.add_argument("--lines", type=int)
parser.add_argument("--fail", default="0")
parser.add_argument("--out", type=Path)
parser.add_argument("--split", type=Path)  # this host's part of the split input (SageMaker), unread
args = parser.parse_args()
with job_env.pipes_session() as pipes:
    host = job_env.current_host()
    for number in range(1, args.lines + 1):
        logging.getLogger("zero.chatty").info("chatter %d of %d from %s", number, args.lines, host)
    print(f"printed by {host}", flush=True)
    if args.fail == "1":
        raise RuntimeError(f"planted failure on {host} after the chatter")
    if args.out:
        (args.out / f"{host}.txt").write_text(host)
    pipes.report_asset_materialization(metadata={"lines": args.lines})
'''


def captured_stdout(instance, run_id: str) -> str:
    """What the run's steps wrote to stdout, as the UI's stdout tab reads it (the compute log manager)."""
    captures = instance.all_logs(run_id, of_type=DagsterEventType.LOGS_CAPTURED)
    assert captures, "the run captured no compute logs"
    manager = instance.compute_log_manager
    return "".join(
        manager.get_log_data(
            manager.build_log_key_for_run(run_id, entry.dagster_event.logs_captured_data.file_key)
        ).stdout.decode()
        for entry in captures
    )


def user_log_messages(instance, run_id: str) -> list[str]:
    """The run's log events (context.log calls), Dagster's own events left out."""
    return [entry.user_message for entry in instance.all_logs(run_id) if entry.dagster_event is None]


def chatter(host: str) -> list[str]:
    return [f"chatter {number} of {LINES} from {host}" for number in range(1, LINES + 1)]


def chatty_messages(lines: list[str]) -> list[str]:
    """The messages of the job's `zero.chatty` log lines (one JSON object a line: job_env.JsonLines)."""
    records = [json.loads(line) for line in lines if line.startswith("{")]
    return [record["message"] for record in records if record.get("logger") == "zero.chatty"]


def assert_no_line_events(instance, run_id: str) -> list[str]:
    messages = user_log_messages(instance, run_id)
    assert not [m for m in messages if "chatter " in m], "a job line became a Dagster event"
    assert len(messages) < 15, f"{len(messages)} log events for a job of {2 * LINES} lines: {messages}"
    return messages


# --- SageMaker -----------------------------------------------------------------------------------


@pytest.fixture
def sagemaker(moto_endpoint, tmp_path, monkeypatch):
    setup = fake_aws(moto_endpoint, tmp_path, monkeypatch, BUCKET, "zero_log_jobs", {"chatty": CHATTY_JOB})
    s3, logs, package, fake = setup.s3, setup.logs, setup.package, setup.fake
    settings = fake_settings(
        bucket=BUCKET, prefix="zero", map_report=JobCompute(instance_type="ml.m5.large", instance_count=2)
    )
    upload_code_package(package, settings.s3_root(), s3)
    s3.put_object(Bucket=BUCKET, Key="zero/lake/split/part-0.txt", Body=b"a")
    s3.put_object(Bucket=BUCKET, Key="zero/lake/split/part-1.txt", Body=b"b")
    client = PipesSageMakerClient(
        client=fake,
        logs_client=logs,
        s3_client=s3,
        pipes_uri=setup.pipes_uri,
        poll_interval=0.2,
        message_poll_interval=0.2,
    )
    # CloudWatch Logs state lives in moto's process-wide backend: streams of another module's job of the
    # same name would read as this job's hosts. SageMaker never reuses a job name; neither do these tests.
    fingerprint = hashlib.sha256(f"{tmp_path}-{os.getpid()}".encode()).hexdigest()
    return {"client": client, "settings": settings, "package": package, "fingerprint": fingerprint}


def two_host_params(sagemaker, fail: bool) -> dict:
    fingerprint = sagemaker["fingerprint"]
    request = JobRequest(
        asset="map_report",
        kind="processing",
        module="zero_log_jobs.chatty",
        fingerprint=fingerprint,
        inputs={"split": f"s3://{BUCKET}/zero/lake/split"},
        reads=Reads(f"s3://{BUCKET}/zero/lake/split", f"s3://{BUCKET}/zero/raw", 2, 2, 1),
        instance_count=2,
        outputs={"out": f"s3://{BUCKET}/zero/lake/map_report/{fingerprint[:16]}"},
        arguments={"lines": str(LINES), "fail": "1" if fail else "0"},
    )
    _, params = build_job_params(
        request,
        sagemaker["settings"],
        job_name=job_name("map_report", fingerprint, 1),
        code=sagemaker["package"],
        environment={},
    )
    assert params["ProcessingResources"]["ClusterConfig"]["InstanceCount"] == 2
    return params


def run_on_sagemaker(sagemaker, instance, fail: bool):
    params = two_host_params(sagemaker, fail)

    @asset(name="probe")
    def probe(context):
        return sagemaker["client"].run(context=context, kind="processing", params=params).get_materialize_result()

    return params, materialize([probe], instance=instance, raise_on_error=False)


def test_sagemaker_hosts_lines_reach_the_step_stdout_not_the_event_log(sagemaker, instance):
    params, result = run_on_sagemaker(sagemaker, instance, fail=False)
    assert result.success
    stdout = captured_stdout(instance, result.run_id)
    hosts = sorted(set(re.findall(r"^\[(algo-\d+-\d+)\] ", stdout, re.MULTILINE)))
    assert [h.rsplit("-", 1)[0] for h in hosts] == ["algo-1", "algo-2"], (
        f"one stream per host in the step's stdout: {hosts}"
    )
    for host in hosts:
        own = [line[len(f"[{host}] ") :] for line in stdout.splitlines() if line.startswith(f"[{host}] ")]
        assert chatty_messages(own) == chatter(host.rsplit("-", 1)[0]), f"{host}'s lines, in order"
        assert f"printed by {host.rsplit('-', 1)[0]}" in own, "stdout as well as the logging lines"
    assert '"__dagster_pipes_version"' not in stdout
    messages = assert_no_line_events(instance, result.run_id)
    assert any(f"{params['ProcessingJobName']}: Completed" in m for m in messages), "status changes stay events"
    assert sum("copied to this step's stdout" in m for m in messages) == 2, (
        "one event per host says where its lines are"
    )


def test_sagemaker_failure_still_quotes_the_last_lines(sagemaker, instance):
    params, result = run_on_sagemaker(sagemaker, instance, fail=True)
    assert not result.success
    message = result.get_step_failure_events()[0].step_failure_data.error.message
    assert f"{params['ProcessingJobName']} Failed" in message and "planted failure on algo-" in message
    tail = message.split("last log lines:\n", 1)[1]
    assert re.search(rf"^\[algo-\d-\d+\] .*chatter {LINES} of {LINES} from algo-", tail, re.MULTILINE), tail
    assert "RuntimeError: planted failure" in tail, "the traceback the job wrote last"
    assert "RuntimeError: planted failure" in captured_stdout(instance, result.run_id)
    assert_no_line_events(instance, result.run_id)


# --- Locally -------------------------------------------------------------------------------------


@pytest.fixture
def local(tmp_path, monkeypatch):
    job_package(tmp_path / "code", "zero_log_jobs", {"chatty": CHATTY_JOB})
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "code"))  # the runner puts it on the job's path after the repo
    (tmp_path / "fsx").mkdir()
    settings = ZeroSettings(
        raw_uri=str(tmp_path / "raw"), lake_uri=str(tmp_path / "lake"), fsx_mount=str(tmp_path / "fsx")
    )
    return LocalJobRunner(settings=settings), tmp_path / "lake"


def run_locally(runner: LocalJobRunner, lake: Path, instance, hosts: int, fail: bool):
    request = JobRequest(
        asset="map_report",
        kind="processing",
        module="zero_log_jobs.chatty",
        fingerprint=FINGERPRINT,
        inputs={},
        outputs={"out": str(lake / "map_report")},
        instance_count=hosts,
        arguments={"lines": str(LINES), "fail": "1" if fail else "0"},
    )

    @asset(name="probe")
    def probe(context):
        invocation, _ = runner.run(context, request)
        return invocation.get_materialize_result()

    result = materialize([probe], instance=instance, raise_on_error=False)
    return result, runner.run_folder(request, result.run_id)


def test_local_job_lines_reach_the_step_stdout_and_job_log(local, instance):
    runner, lake = local
    result, folder = run_locally(runner, lake, instance, hosts=2, fail=False)
    assert result.success
    stdout = captured_stdout(instance, result.run_id)
    for host in ("algo-1", "algo-2"):
        own = [line[len(f"[{host}] ") :] for line in stdout.splitlines() if line.startswith(f"[{host}] ")]
        assert chatty_messages(own) == chatter(host), f"{host}'s lines, in order"
        assert f"printed by {host}" in own
        job_log = (folder / "hosts" / host / "opt/ml/output/job.log").read_text().splitlines()
        assert job_log == own, f"{host}'s job.log holds what the step's stdout shows for it, without the host prefix"
    assert_no_line_events(instance, result.run_id)


def test_local_failure_keeps_job_log_and_its_tail(local, instance):
    runner, lake = local
    result, folder = run_locally(runner, lake, instance, hosts=1, fail=True)
    assert not result.success
    failure = result.get_step_failure_events()[0].step_failure_data
    assert "planted failure on algo-1" in failure.error.message
    tail = failure.user_failure_data.metadata["log_tail"].value
    assert f"chatter {LINES} of {LINES} from algo-1" in tail and "RuntimeError: planted failure on algo-1" in tail, tail
    job_log = (folder / "opt/ml/output/job.log").read_text()
    assert job_log.count(f"chatter {LINES} of {LINES} from algo-1") == 1, "each line once in job.log"
    stdout = captured_stdout(instance, result.run_id)
    assert chatty_messages(stdout.splitlines())[-1] == f"chatter {LINES} of {LINES} from algo-1", "lines as written"
    assert "[algo-1]" not in stdout, "one host: no host prefix"
    assert "RuntimeError: planted failure on algo-1" in stdout
    assert_no_line_events(instance, result.run_id)


def test_a_closed_stdout_neither_blocks_the_job_nor_loses_job_log(tmp_path, monkeypatch):
    closed = io.StringIO()
    closed.close()
    monkeypatch.setattr(sys, "stdout", closed)  # writing it raises ValueError, as a closed stdout does
    lines = 20_000  # about 600 KB: far past a pipe's buffer, so a copy that stopped reading would block the job
    process = start_job_process(
        [sys.executable, "-c", f"for i in range({lines}): print('output line', i)"],
        {"PATH": os.environ["PATH"]},
        str(tmp_path),
        tmp_path / "job.log",
    )
    try:
        assert process.wait(timeout=60) == 0
    finally:
        end_process_group(process)
    assert not process.copy.is_alive()
    assert (tmp_path / "job.log").read_text().splitlines() == [f"output line {i}" for i in range(lines)]
