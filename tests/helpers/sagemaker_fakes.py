"""A stand-in for boto3's SageMaker client that really runs the job: the subset our client calls.

Create*Job validates its parameters against botocore's SageMaker model, lays out `/opt/ml` under
a folder, downloads code and inputs from S3 (a moto server or SeaweedFS), runs the script in a
subprocess with the Environment it was given, ships its output lines to CloudWatch Logs (moto),
and maps the exit to job states: 0 -> Completed (outputs uploaded), non-zero -> Failed with
FailureReason / ExitMessage from `/opt/ml/output/{failure,message}`, Stop*Job -> Stopping -> Stopped,
MaxRuntimeInSeconds exceeded -> Stopped / MaxRuntimeExceeded. List*Jobs (StatusEquals, pages of
MaxResults) and ListTags answer from the jobs created, botocore-validated both ways. A Processing
job with several instances runs one process per host, each with its own `/opt/ml` and `config/resourceconfig.json`; a
ShardedByS3Key input gives each host every n-th object; a ManifestFile input the objects its manifest
names, at their keys relative to its prefix; every host uploads its outputs. An S3Prefix
input is every key that starts with the URI exactly as written, as SageMaker reads it (`s3://b/raw`
also matches `raw-old/...`).

Training Plans (`add_training_plan`: Scheduled -> Active -> Expired by the clock, jobs `Pending` until
their plan is Active) are `sagemaker_fake_plans.FakeTrainingPlans`. DescribeTrainingJob and
DescribeTrainingPlan answers are validated against botocore's model like the requests. A training
job's `/opt/ml/checkpoints` reaches its CheckpointConfig prefix however it ends, as SageMaker syncs it
while the job runs.

For attempt states: `add_stopping_job` presents a job that is `Stopping` and turns `Stopped` after a
few describes; every create records the state of every other job at that moment (`seen_at_create`);
with `record_leases` on, every create of a job tagged `zero:lease` records its asset, that lease and whether a
live run held it at that moment (`leases_at_create`: the orphaned-job sensor would stop a job whose lease no
live run holds);
with `throttle_every = n`, every n-th Describe*Job is refused with ThrottlingException.
`ThrottledLogs` wraps a CloudWatch Logs client and refuses reads with ThrottlingException.

Around the fake, what every SageMaker test sets up the same way: `moto_server()` (S3 and CloudWatch
Logs on loopback), `aws_env(endpoint)` (the credentials and endpoint the runner and the job scripts
read), `fake_settings(...)` (SageMakerSettings with a test role and images), `job_package(...)`
(a code package holding test job modules) and `fake_aws(...)`, which puts them together for one test.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import textwrap
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import botocore.session
from botocore.exceptions import ClientError
from botocore.validate import validate_parameters

from helpers.sagemaker_fake_plans import FakeTrainingPlans, validated_response
from training_code.lib.aws_clients import client as aws_client
from training_code.lib.storage import split_s3
from zero_assets.backends.sagemaker.code_package import CodePackage, build_code_package
from zero_assets.backends.sagemaker.job_api import ASSET_TAG, LEASE_TAG
from zero_assets.backends.sagemaker.settings import SageMakerSettings
from zero_assets.core.settings import REPO_ROOT
from zero_assets.launch.output_lease import live_holder

_MODEL = botocore.session.get_session().get_service_model("sagemaker")


def throttling_error(operation: str) -> ClientError:
    """What boto3 raises when AWS throttles `operation`."""
    return ClientError(
        {
            "Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"},
            "ResponseMetadata": {"HTTPStatusCode": 400},
        },
        operation,
    )


def _counted(seconds: int | None) -> int | None:
    """A count of seconds as SageMaker reports it: from 1 s on, left out before (botocore's minimum is 1)."""
    return seconds if seconds is not None and seconds >= 1 else None


class FakeSageMaker(FakeTrainingPlans):
    def __init__(self, root: Path, s3, logs, env: dict[str, str], region: str = "us-east-1") -> None:
        self.root, self.s3, self.logs, self.env = Path(root), s3, logs, env
        self.meta = SimpleNamespace(region_name=region)
        self.calls: list[tuple[str, str]] = []
        self.jobs: dict[str, dict] = {}
        self.plans: dict[str, dict] = {}
        self.seen_at_create: dict[str, dict[str, str]] = {}  # new job -> {other job: its status then}
        self.record_leases = False  # off: a lease check reads S3, which not every test's requests can reach
        self.leases_at_create: dict[str, tuple[str, str, bool]] = {}  # job -> (asset, zero:lease, held by a live run)
        self.throttle_every, self.throttled = 0, 0
        # Set: every job that ended reports it ran this many seconds per instance, so costs compare exactly;
        # a managed spot training job bills `spot_billed_share` of them (BillableTimeInSeconds), as spot discounts show.
        self.run_seconds: int | None = None
        self.spot_billed_share = 0.3
        self._lock = threading.Lock()

    # --- the boto3 surface -------------------------------------------------------------------
    def create_training_job(self, **params):
        return self._create("training", "CreateTrainingJob", params["TrainingJobName"], params)

    def create_processing_job(self, **params):
        return self._create("processing", "CreateProcessingJob", params["ProcessingJobName"], params)

    def describe_training_job(self, TrainingJobName: str):
        return self._describe("training", TrainingJobName)

    def describe_processing_job(self, ProcessingJobName: str):
        return self._describe("processing", ProcessingJobName)

    def stop_training_job(self, TrainingJobName: str):
        return self._stop("training", TrainingJobName)

    def stop_processing_job(self, ProcessingJobName: str):
        return self._stop("processing", ProcessingJobName)

    def list_training_jobs(self, **params):
        return self._list("training", "ListTrainingJobs", params)

    def list_processing_jobs(self, **params):
        return self._list("processing", "ListProcessingJobs", params)

    def list_tags(self, **params):
        """The tags a job was created with (one page; the jobs here carry few)."""
        validate_parameters(params, _MODEL.operation_model("ListTags").input_shape)
        self.calls.append(("ListTags", params["ResourceArn"]))
        name = params["ResourceArn"].rsplit("/", 1)[1]
        return validated_response("ListTags", {"Tags": list(self.jobs[name]["params"].get("Tags", []))})

    def wait_until_done(self, name: str, timeout: float = 120) -> dict:
        deadline = time.monotonic() + timeout
        while self.jobs[name]["status"] not in ("Completed", "Failed", "Stopped"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"fake job {name} still {self.jobs[name]['status']}")
            time.sleep(0.1)
        return self.jobs[name]

    # --- job life cycle ----------------------------------------------------------------------
    def _create(self, kind: str, operation: str, name: str, params: dict):
        validate_parameters(params, _MODEL.operation_model(operation).input_shape)
        self.calls.append((operation, name))
        self.seen_at_create[name] = {other: job["status"] for other, job in self.jobs.items()}
        tags = {tag["Key"]: tag["Value"] for tag in params.get("Tags", [])}
        if self.record_leases and LEASE_TAG in tags:
            lease = tags[LEASE_TAG]
            self.leases_at_create[name] = (tags.get(ASSET_TAG, ""), lease, live_holder(lease) is not None)
        if kind == "training":
            self.check_plan_request(params)
        with self._lock:
            if name in self.jobs:
                raise ClientError(
                    {"Error": {"Code": "ResourceInUse", "Message": f"Job name {name} must be unique"}}, operation
                )
            self.jobs[name] = {
                "kind": kind,
                "params": params,
                "status": "InProgress",
                "secondary": "Starting",
                "transitions": [("Starting", datetime.now(UTC))],
                "created": datetime.now(UTC),
                "started": None,
                "ended": None,
                "process": None,
                "failure": None,
                "exit_message": None,
            }
        threading.Thread(target=self._run, args=(name,), daemon=True).start()
        return {
            "TrainingJobArn"
            if kind == "training"
            else "ProcessingJobArn": f"arn:aws:sagemaker:us-east-1:123456789012:{kind}-job/{name}"
        }

    def _list(self, kind: str, operation: str, params: dict) -> dict:
        """List*Jobs filtered by StatusEquals, pages of MaxResults (NextToken: the next page's start)."""
        validate_parameters(params, _MODEL.operation_model(operation).input_shape)
        self.calls.append((operation, params.get("StatusEquals", "")))
        names = [
            name
            for name, job in self.jobs.items()
            if job["kind"] == kind and params.get("StatusEquals") in (None, job["status"])
        ]
        start, size = int(params.get("NextToken") or 0), params.get("MaxResults", 10)
        prefix = "Training" if kind == "training" else "Processing"
        summaries = [
            {
                f"{prefix}JobName": name,
                f"{prefix}JobArn": f"arn:aws:sagemaker:{self.region}:123456789012:{kind}-job/{name}",
                "CreationTime": self.jobs[name]["created"],
                f"{prefix}JobStatus": self.jobs[name]["status"],
            }
            for name in names[start : start + size]
        ]
        more = str(start + size) if start + size < len(names) else None
        return validated_response(operation, {f"{prefix}JobSummaries": summaries, "NextToken": more})

    def add_stopping_job(self, kind: str, params: dict, polls: int = 3) -> None:
        """A job someone stopped that is still `Stopping`: it turns `Stopped` after `polls` describes."""
        name = params["TrainingJobName" if kind == "training" else "ProcessingJobName"]
        now = datetime.now(UTC)
        self.jobs[name] = {
            "kind": kind,
            "params": params,
            "status": "Stopping",
            "secondary": "Stopping",
            "transitions": [("Starting", now), ("Stopping", now)],
            "created": now,
            "started": now,
            "ended": None,
            "process": None,
            "failure": None,
            "exit_message": None,
            "stops_after_polls": polls,
        }

    def _describe(self, kind: str, name: str) -> dict:
        self.calls.append((f"Describe{kind}", name))
        if self.throttle_every and sum(1 for c in self.calls if c[0].startswith("Describe")) % self.throttle_every == 0:
            self.throttled += 1
            raise throttling_error(f"Describe{kind}")
        job = self.jobs.get(name)
        if job is not None and job.get("stops_after_polls") is not None:
            job["stops_after_polls"] -= 1
            if job["stops_after_polls"] < 0:
                job.update(status="Stopped", ended=datetime.now(UTC), stops_after_polls=None)
                self._enter(job, "Stopped")
        if job is None or job["kind"] != kind:
            message = (
                "Requested resource not found."
                if kind == "training"
                else f"Could not find requested job with name {name}"
            )
            raise ClientError({"Error": {"Code": "ValidationException", "Message": message}}, f"Describe{kind}")
        params = job["params"]
        started = job["started"] or job["created"]
        ended = (
            started + timedelta(seconds=self.run_seconds)
            if self.run_seconds is not None and job["ended"]
            else job["ended"]
        )
        if kind == "training":
            # Per instance, as SageMaker reports them: TrainingTimeInSeconds ran, BillableTimeInSeconds
            # billed (less under spot).
            ran = int(((ended or datetime.now(UTC)) - started).total_seconds())
            spot = params.get("EnableManagedSpotTraining", False)
            # Held Pending for its plan (and never started): nothing ran, nothing is billed.
            held = job["started"] is None and any(status == "Pending" for status, _ in job["transitions"])
            output = f"{params['OutputDataConfig']['S3OutputPath'].rstrip('/')}/{name}/output/model.tar.gz"
            return validated_response(
                "DescribeTrainingJob",
                {
                    "TrainingJobName": name,
                    "TrainingJobArn": f"arn:aws:sagemaker:{self.region}:123456789012:training-job/{name}",
                    "ModelArtifacts": {"S3ModelArtifacts": output},
                    "TrainingJobStatus": job["status"],
                    "SecondaryStatus": job["secondary"],
                    "FailureReason": job["failure"],
                    "AlgorithmSpecification": params["AlgorithmSpecification"],
                    "ResourceConfig": params["ResourceConfig"],
                    "StoppingCondition": params["StoppingCondition"],
                    "CheckpointConfig": params.get("CheckpointConfig"),
                    "EnableManagedSpotTraining": spot,
                    "TrainingStartTime": job["started"],
                    "TrainingEndTime": job["ended"],
                    "TrainingTimeInSeconds": _counted(None if held else ran),
                    "BillableTimeInSeconds": _counted(
                        None if held else int(ran * self.spot_billed_share) if spot else ran
                    ),
                    "SecondaryStatusTransitions": [{"Status": s, "StartTime": t} for s, t in job["transitions"]],
                    "CreationTime": job["created"],
                },
            )
        return {
            "ProcessingJobName": name,
            "ProcessingJobStatus": job["status"],
            "FailureReason": job["failure"],
            "ExitMessage": job["exit_message"],
            "ProcessingResources": params["ProcessingResources"],
            "ProcessingStartTime": job["started"],
            "ProcessingEndTime": ended,
        }

    def _stop(self, kind: str, name: str):
        self.calls.append((f"Stop{kind}", name))
        job = self.jobs[name]
        if job["status"] != "InProgress":
            raise ClientError(
                {"Error": {"Code": "ValidationException", "Message": f"job {name} is {job['status']}"}}, "Stop"
            )
        job["status"] = "Stopping"
        self._enter(job, "Stopping")
        for process in job["process"] or []:
            process.terminate()
        return {}

    @staticmethod
    def _hosts(job: dict) -> list[str]:
        count = (
            job["params"]["ProcessingResources"]["ClusterConfig"]["InstanceCount"] if job["kind"] == "processing" else 1
        )
        return [f"algo-{i + 1}" for i in range(count)]

    def _run(self, name: str) -> None:
        job = self.jobs[name]
        hosts = self._hosts(job)
        opts = {host: self.root / name / (host if len(hosts) > 1 else "") / "opt" / "ml" for host in hosts}
        if not self.hold_until_plan_active(job):
            return
        try:
            if job["kind"] == "training":
                launches = {hosts[0]: self._prepare_training(job, opts[hosts[0]])}
            else:
                launches = {host: self._prepare_processing(job, opts[host], host, hosts) for host in hosts}
        except (ClientError, OSError, KeyError) as error:
            job.update(status="Failed", failure=f"ClientError: {error}", ended=datetime.now(UTC))
            self._enter(job, "Failed")
            return
        job["started"] = datetime.now(UTC)
        self._enter(job, "Training" if job["kind"] == "training" else "Processing")
        if job["status"] == "Stopping":  # stopped while downloading
            job.update(status="Stopped", ended=datetime.now(UTC))
            self._enter(job, "Stopped")
            return
        processes = {
            host: subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for host, (command, env) in launches.items()
        }
        job["process"] = list(processes.values())
        if job["status"] == "Stopping":  # stopped between the look above and this: _stop found no process
            for process in job["process"]:
                process.terminate()
        shippers = [
            threading.Thread(target=self._ship_logs, args=(job, name, host, process), daemon=True)
            for host, process in processes.items()
        ]
        for shipper in shippers:
            shipper.start()
        deadline = time.monotonic() + job["params"]["StoppingCondition"]["MaxRuntimeInSeconds"]
        plan_ends = self.plan_deadline(job)
        codes = {}
        for host, process in processes.items():
            try:
                codes[host] = process.wait(timeout=max(0.0, min(deadline, plan_ends or deadline) - time.monotonic()))
            except subprocess.TimeoutExpired:
                if plan_ends is not None and plan_ends < deadline:  # the plan's instances go back: no grace
                    for other in processes.values():
                        other.kill()
                    codes[host] = process.wait()
                    job["failure"] = "CapacityError: the training plan ended; its instances were reclaimed"
                    continue
                for other in processes.values():
                    other.terminate()
                codes[host] = process.wait()
                job["secondary"] = "MaxRuntimeExceeded"
                job["status"] = "Stopping"
        for shipper in shippers:
            shipper.join(timeout=10)
        failed = [host for host in hosts if codes.get(host, 0) != 0]
        self._finish(job, opts, codes[failed[0]] if failed else 0, opts[failed[0]] if failed else None)

    def _finish(self, job: dict, opts: dict[str, Path], code: int, failed_opt: Path | None) -> None:
        if job["kind"] == "training" and "CheckpointConfig" in job["params"]:  # synced while running, on any end
            self._upload(opts[next(iter(opts))] / "checkpoints", job["params"]["CheckpointConfig"]["S3Uri"])
        ended = "Stopped"
        if job["status"] == "Stopping":
            job["status"] = "Stopped"
            ended = "MaxRuntimeExceeded" if job["secondary"] == "MaxRuntimeExceeded" else "Stopped"
        elif code == 0:
            for opt in opts.values():
                self._upload_outputs(job, opt)
            job["status"] = ended = "Completed"
        else:
            failure, message = failed_opt / "output" / "failure", failed_opt / "output" / "message"
            reason = job["failure"] or (
                failure.read_text()[:1024]
                if failure.is_file() and job["kind"] == "training"
                else f"AlgorithmError: exit code {code}"
            )
            job.update(status="Failed", failure=reason)
            ended = "Failed"
            if job["kind"] == "processing" and message.is_file():
                job["exit_message"] = message.read_text()[:1024]
        self._enter(job, ended)
        job["ended"] = datetime.now(UTC)

    # --- container contract ------------------------------------------------------------------
    def _prepare_training(self, job: dict, opt: Path):
        params = job["params"]
        hp = dict(params.get("HyperParameters", {}))
        code_dir = opt / "code"
        self._extract_tarball(hp.pop("sagemaker_submit_directory"), code_dir)
        channels = {}
        for channel in params.get("InputDataConfig", []):
            source = channel["DataSource"].get("S3DataSource")
            if source is None:
                raise KeyError(f"the fake runs S3 channels only, not {channel['DataSource']}")
            channels[channel["ChannelName"]] = self._download(
                source["S3Uri"], opt / "input" / "data" / channel["ChannelName"]
            )
        checkpoints = (
            self._download(params["CheckpointConfig"]["S3Uri"], opt / "checkpoints")
            if "CheckpointConfig" in params
            else opt / "checkpoints"
        )
        (opt / "model").mkdir(parents=True, exist_ok=True)
        env = self._environment(params.get("Environment", {}), opt, code_dir)
        env.update(
            {
                "SM_MODEL_DIR": str(opt / "model"),
                "SM_CHANNELS": json.dumps(sorted(channels)),
                "ZERO_CHECKPOINT_DIR": str(checkpoints),
                "SM_TRAINING_ENV": json.dumps({"job_name": params["TrainingJobName"], "hosts": ["algo-1"]}),
                "SM_CURRENT_HOST": "algo-1",
            }
        )
        env.update({f"SM_CHANNEL_{name.upper()}": str(path) for name, path in channels.items()})
        program = str(code_dir / hp.pop("sagemaker_program"))
        distributed = hp.pop("sagemaker_torch_distributed_enabled", "false") == "true"
        arguments = [
            token for key, value in hp.items() if not key.startswith("sagemaker_") for token in (f"--{key}", value)
        ]
        launcher = (
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1"]
            if distributed
            else [sys.executable]
        )
        return [*launcher, program, *arguments], env

    def _prepare_processing(self, job: dict, opt: Path, host: str, hosts: list[str]):
        params = job["params"]
        (opt / "config").mkdir(parents=True, exist_ok=True)
        (opt / "config" / "resourceconfig.json").write_text(json.dumps({"current_host": host, "hosts": hosts}))
        for item in params.get("ProcessingInputs", []):
            sharded = item["S3Input"]["S3DataDistributionType"] == "ShardedByS3Key"
            part = (hosts.index(host), len(hosts)) if sharded else (0, 1)
            if item["S3Input"]["S3DataType"] == "ManifestFile":
                self._download_listed(item["S3Input"]["S3Uri"], self._local(item["S3Input"]["LocalPath"], opt))
                continue
            self._download(item["S3Input"]["S3Uri"], self._local(item["S3Input"]["LocalPath"], opt), part)
        for item in params["ProcessingOutputConfig"]["Outputs"]:
            self._local(item["S3Output"]["LocalPath"], opt).mkdir(parents=True, exist_ok=True)
        app = params["AppSpecification"]
        command = [sys.executable if token == "python3" else token for token in app["ContainerEntrypoint"]]
        command += [
            str(self._local(a, opt)) if a.startswith("/opt/ml") else a for a in app.get("ContainerArguments", [])
        ]
        return command, self._environment(params.get("Environment", {}), opt, None)

    def _environment(self, requested: dict, opt: Path, code_dir: Path | None) -> dict:
        env = {**os.environ, **self.env}
        env.update({k: str(self._local(v, opt)) if v.startswith("/opt/ml") else v for k, v in requested.items()})
        env["ZERO_OPT_ML"] = str(opt)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), self.env.get("PYTHONPATH")]))
        return env

    def _ship_logs(self, job: dict, name: str, host: str, process: subprocess.Popen) -> None:
        group = "/aws/sagemaker/TrainingJobs" if job["kind"] == "training" else "/aws/sagemaker/ProcessingJobs"
        stream = f"{name}/{host}-{int(time.time())}"
        try:
            self.logs.create_log_group(logGroupName=group)
        except self.logs.exceptions.ResourceAlreadyExistsException:
            pass
        self.logs.create_log_stream(logGroupName=group, logStreamName=stream)
        for line in process.stdout:
            self.logs.put_log_events(
                logGroupName=group,
                logStreamName=stream,
                logEvents=[{"timestamp": int(time.time() * 1000), "message": line.rstrip("\n") or " "}],
            )

    def _upload_outputs(self, job: dict, opt: Path) -> None:
        params = job["params"]
        if job["kind"] == "training":
            raw = io.BytesIO()
            with tarfile.open(fileobj=raw, mode="w:gz") as tar:
                tar.add(opt / "model", arcname=".")
            bucket, prefix = split_s3(params["OutputDataConfig"]["S3OutputPath"])
            self.s3.put_object(
                Bucket=bucket,
                Key=f"{prefix}/{params['TrainingJobName']}/output/model.tar.gz".lstrip("/"),
                Body=raw.getvalue(),
            )
            return
        for item in params["ProcessingOutputConfig"]["Outputs"]:
            self._upload(self._local(item["S3Output"]["LocalPath"], opt), item["S3Output"]["S3Uri"])

    # --- S3 ----------------------------------------------------------------------------------
    @staticmethod
    def _local(container_path: str, opt: Path) -> Path:
        return opt / container_path[len("/opt/ml/") :]

    def _download(self, uri: str, dest: Path, part: tuple[int, int] = (0, 1)) -> Path:
        """Every object whose key starts with `uri` as written (SageMaker's S3Prefix: no `/` is added);
        with `part` = (host index, hosts), that host's part of them."""
        bucket, _, prefix = uri[len("s3://") :].partition("/")
        dest.mkdir(parents=True, exist_ok=True)
        keys = [
            obj["Key"]
            for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            for obj in page.get("Contents", [])
        ]
        for key in sorted(keys)[part[0] :: part[1]]:  # SageMaker promises about 1/N each, disjoint, together all
            target = dest / key[len(prefix) :].lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(self.s3.get_object(Bucket=bucket, Key=key)["Body"].read())
        return dest

    def _download_listed(self, manifest_uri: str, dest: Path) -> Path:
        """S3DataType=ManifestFile: the manifest is `[{"prefix": "s3://b/p/"}, "key relative to it", ...]`;
        each named object lands under `dest` at its relative key (a missing one fails the job, as on SageMaker)."""
        bucket, key = split_s3(manifest_uri)
        prefix_entry, *relative = json.loads(self.s3.get_object(Bucket=bucket, Key=key)["Body"].read())
        prefix_bucket, _, prefix = prefix_entry["prefix"][len("s3://") :].partition("/")
        for name in relative:
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(self.s3.get_object(Bucket=prefix_bucket, Key=prefix + name)["Body"].read())
        return dest

    def _upload(self, folder: Path, uri: str) -> None:
        bucket, prefix = split_s3(uri)
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            self.s3.put_object(
                Bucket=bucket, Key=f"{prefix}/{path.relative_to(folder).as_posix()}".lstrip("/"), Body=path.read_bytes()
            )

    def _extract_tarball(self, uri: str, dest: Path) -> None:
        bucket, key = split_s3(uri)
        body = self.s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as tar:
            tar.extractall(dest, filter="data")


class ThrottledLogs:
    """A CloudWatch Logs client whose reads are refused with ThrottlingException: the first `first`
    reads, then every `every`-th one. Writes (the fake's log shipping) go through."""

    READS = ("get_log_events", "describe_log_streams", "filter_log_events")

    def __init__(self, logs, first: int = 6, every: int = 3) -> None:
        self._logs, self._first, self._every = logs, first, every
        self.reads = self.refused = 0
        self.exceptions, self.meta = logs.exceptions, logs.meta

    def _admit(self, operation: str) -> None:
        self.reads += 1
        if self.reads <= self._first or self.reads % self._every == 0:
            self.refused += 1
            raise throttling_error(operation)

    def __getattr__(self, name):
        attribute = getattr(self._logs, name)
        if name not in self.READS:
            return attribute

        def read(**kwargs):
            self._admit(name)
            return attribute(**kwargs)

        return read

    def get_paginator(self, operation: str):
        paginator, admit = self._logs.get_paginator(operation), self._admit

        class Paginator:
            def paginate(self, **kwargs):
                admit(operation)
                return paginator.paginate(**kwargs)

        return Paginator()


@contextmanager
def moto_server():
    """A moto server on loopback (S3, CloudWatch Logs); yields its endpoint URL."""
    from moto.server import ThreadedMotoServer  # imported by the tests that start one, not by every user of the fake

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def aws_env(endpoint: str) -> dict[str, str]:
    """The environment the runner and the job scripts read to reach `endpoint` as us-east-1."""
    return {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "ZERO_S3_ENDPOINT_URL": endpoint,
    }


def fake_settings(**fields) -> SageMakerSettings:
    """SageMakerSettings in us-east-1 with a test role and images; `fields` give the bucket and the rest."""
    return SageMakerSettings(
        region="us-east-1",
        role_arn="arn:aws:iam::123456789012:role/zero-jobs",
        training_image_uri="763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.5-gpu-py311",
        processing_image_uri="123456789012.dkr.ecr.us-east-1.amazonaws.com/zero-processing:1",
        **fields,
    )


def job_package(root: Path, package: str, modules: dict[str, str]) -> CodePackage:
    """A code package of one Python package under `root`, its modules' sources dedented."""
    (root / package).mkdir(parents=True)
    (root / package / "__init__.py").write_text("")
    for module, source in modules.items():
        (root / package / f"{module}.py").write_text(textwrap.dedent(source))
    return build_code_package(root, (package,))


@dataclass
class FakeAws:
    env: dict[str, str]  # what the runner and the job scripts read (already in this test's environment)
    s3: object
    logs: object
    fake: FakeSageMaker
    package: CodePackage
    pipes_uri: str  # this test's own prefix: job names repeat across tests, messages must not


def fake_aws(endpoint: str, tmp_path: Path, monkeypatch, bucket: str, package: str, modules: dict[str, str]) -> FakeAws:
    """One test's SageMaker fake on the moto server at `endpoint`: the AWS environment set for this
    test, `bucket` created, a code package `package` holding `modules` (not yet uploaded: a test's
    settings say where), and the fake running jobs with the Pipes flush every 0.2 s."""
    env = aws_env(endpoint)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    s3, logs = aws_client("s3", endpoint_url=endpoint), aws_client("logs", endpoint_url=endpoint)
    s3.create_bucket(Bucket=bucket)
    code = job_package(tmp_path / "code", package, modules)
    fake = FakeSageMaker(tmp_path / "sm", s3, logs, {**env, "PYTHONPATH": str(REPO_ROOT), "ZERO_PIPES_FLUSH_S": "0.2"})
    return FakeAws(env, s3, logs, fake, code, f"s3://{bucket}/{tmp_path.name}/pipes")
