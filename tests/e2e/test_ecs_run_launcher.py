"""deploy/dagster.postgres.yaml's run launcher against a real ECS API: moto in server mode on loopback.

The daemon's side is real: its own task runs in moto's ECS cluster with awsvpc networking, and a tiny
HTTP server plays the ECS task metadata endpoint (v4) that ECS gives every task, so
`use_current_ecs_task_config: true` reads the cluster, subnets and security groups as it does in
production. moto records tasks but runs no container: the run worker itself (`dagster api
execute_run` in the `run` container) does not execute here; tests/e2e/test_postgres_instance.py runs the
graph on the rest of the file.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from pathlib import Path
from unittest import mock

import boto3
import requests
import yaml
from dagster import DagsterEvent, DagsterEventType, DagsterRunStatus, instance_for_test
from dagster._core.launcher import WorkerStatus
from dagster._core.test_utils import in_process_test_workspace
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster._daemon.monitoring.run_monitoring import monitor_started_run
from dagster._grpc.types import ExecuteRunArgs, ResumeRunArgs
from dagster._serdes import deserialize_value
from helpers.loopback_http import QuietHandler, loopback_server
from moto.server import ThreadedMotoServer

from zero_assets.definitions import defs

REPO = Path(__file__).resolve().parents[2]
REGION = "us-east-1"
SECRET_VALUE = "pg-password-that-must-never-travel"  # a Secrets Manager value: only its ARN may appear
RUN_TAGS = {"dagster/partition": "cam_a", "zero/trigger": "new source", "zero/raw_version": "v-3f2a9c"}


def production_blocks() -> dict:
    """The file's instance config less `storage` (SQLite in a temp folder here)."""
    config = yaml.safe_load((REPO / "deploy" / "dagster.postgres.yaml").read_text())
    config.pop("storage")
    return config


@contextlib.contextmanager
def moto_server():
    # moto's backends live in this process, shared by every moto server it starts: start and end empty.
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    try:
        requests.post(f"{endpoint}/moto-api/reset", timeout=10).raise_for_status()
        yield endpoint
    finally:
        requests.post(f"{endpoint}/moto-api/reset", timeout=10)
        server.stop()


@contextlib.contextmanager
def task_metadata_endpoint(cluster_arn: str, task_arn: str, family: str):
    """ECS_CONTAINER_METADATA_URI_V4 for the daemon's container: `/` is the container, `/task` the task."""
    task = {
        "Cluster": cluster_arn,
        "TaskARN": task_arn,
        "Family": family,
        "Revision": "1",
        "DesiredStatus": "RUNNING",
        "KnownStatus": "RUNNING",
        "LaunchType": "FARGATE",
        "AvailabilityZone": f"{REGION}a",
        "Containers": [{"Name": "daemon", "DockerName": "daemon", "KnownStatus": "RUNNING"}],
    }
    bodies = {"/": task["Containers"][0], "/task": task}

    class Handler(QuietHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            path = self.path.removeprefix("/v4/daemon").rstrip("/") or "/"
            body = json.dumps(bodies[path]).encode() if path in bodies else b"{}"
            self.reply(200 if path in bodies else 404, body, "application/json")

    with loopback_server(Handler) as url:
        yield f"{url}/v4/daemon"


def start_daemon_task(endpoint: str) -> dict:
    """A VPC, the daemon's ECS service task (awsvpc, Fargate) and the run task definition whose `run`
    container takes its secret from Secrets Manager by ARN."""
    client = lambda name: boto3.client(name, region_name=REGION, endpoint_url=endpoint)  # noqa: E731
    ec2, ecs, secrets = client("ec2"), client("ecs"), client("secretsmanager")
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    # As in a real Fargate VPC (moto's awsvpc task also needs it: the ENI's private DNS name).
    ec2.modify_vpc_attribute(VpcId=vpc, EnableDnsHostnames={"Value": True})
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24")["Subnet"]["SubnetId"]
    group = ec2.create_security_group(GroupName="dagster-daemon", Description="daemon and runs", VpcId=vpc)["GroupId"]
    secret_arn = secrets.create_secret(
        Name="zero/pg", SecretString=SECRET_VALUE, Tags=[{"Key": "dagster", "Value": "1"}]
    )["ARN"]
    cluster = ecs.create_cluster(clusterName="zero-dagster")["cluster"]["clusterArn"]
    fargate = {"networkMode": "awsvpc", "requiresCompatibilities": ["FARGATE"], "cpu": "1024", "memory": "4096"}
    ecs.register_task_definition(
        family="zero-dagster-daemon",
        **fargate,
        containerDefinitions=[
            {"name": "daemon", "image": "zero:1", "memory": 4096, "command": ["dagster-daemon", "run"]}
        ],
    )
    run_definition = ecs.register_task_definition(
        family="zero-run",
        **fargate,
        containerDefinitions=[
            {
                "name": "run",
                "image": "zero:1",
                "memory": 4096,
                "secrets": [{"name": "DAGSTER_PG_PASSWORD", "valueFrom": secret_arn}],
            }
        ],
    )["taskDefinition"]["taskDefinitionArn"]
    daemon = ecs.run_task(
        cluster="zero-dagster",
        taskDefinition="zero-dagster-daemon",
        launchType="FARGATE",
        networkConfiguration={"awsvpcConfiguration": {"subnets": [subnet], "securityGroups": [group]}},
    )["tasks"][0]
    return {
        "ecs": ecs,
        "cluster": cluster,
        "subnet": subnet,
        "group": group,
        "secret_arn": secret_arn,
        "run_definition": run_definition,
        "daemon_task": daemon["taskArn"],
    }


@contextlib.contextmanager
def production_instance(tmp_path):
    """A DagsterInstance on the file's run_launcher / run_monitoring / concurrency blocks, as the daemon's
    ECS task sees it; yields (instance, the AWS side, every request body the launcher sent)."""
    with moto_server() as endpoint:
        env = {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": REGION,
            "AWS_ENDPOINT_URL": endpoint,
        }
        with mock.patch.dict(os.environ, env):
            aws = start_daemon_task(endpoint)
            with (
                task_metadata_endpoint(aws["cluster"], aws["daemon_task"], "zero-dagster-daemon") as metadata_uri,
                mock.patch.dict(
                    os.environ,
                    {"ECS_CONTAINER_METADATA_URI_V4": metadata_uri, "DAGSTER_ECS_TASK_DEFINITION": "zero-run"},
                ),
                instance_for_test(overrides=production_blocks(), temp_dir=str(tmp_path)) as instance,
            ):
                sent: list[tuple[str, bytes]] = []  # (operation, request body) of every call the launcher makes
                launcher = instance.run_launcher
                for client in (launcher.ecs, launcher.secrets_manager, launcher.ec2.meta.client):
                    client.meta.events.register(
                        "before-send", lambda request, **_: sent.append(_operation_and_body(request))
                    )
                yield instance, aws, sent


def _operation_and_body(request) -> tuple[str, bytes]:
    body = request.body or b""
    body = body.encode() if isinstance(body, str) else body
    target = request.headers.get("X-Amz-Target", b"")  # JSON APIs (ECS, Secrets Manager) name the operation here
    operation = (target.decode() if isinstance(target, bytes) else target).rpartition(".")[2]
    return operation or body.decode().partition("&")[0].removeprefix("Action="), body  # EC2's query API: Action=...


def run_task_requests(sent) -> list[dict]:
    return [json.loads(body) for operation, body in sent if operation == "RunTask"]


def create_run(instance, workspace, tags=RUN_TAGS):
    location = workspace.get_code_location(workspace.code_location_names[0])
    remote_job = next(iter(location.get_repositories().values())).get_full_job("zero_per_source")
    return instance.create_run_for_job(
        defs.resolve_job_def("zero_per_source"),
        tags=tags,
        remote_job_origin=remote_job.get_remote_origin(),
        job_code_origin=remote_job.get_python_origin(),
    )


def kill_in_moto(task_arn: str) -> None:
    """What ECS reports for a container killed by StopTask or a Spot reclaim: exit code 137 (SIGKILL).
    moto records every stopped container as exit code 0 (a clean exit) and has no API to say otherwise,
    so the test sets it in moto's backend, which runs in this process (ThreadedMotoServer)."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.ecs.models import ecs_backends

    (task,) = [
        t
        for tasks in ecs_backends[DEFAULT_ACCOUNT_ID][REGION].tasks.values()
        for arn, t in tasks.items()
        if arn == task_arn
    ]
    assert task.last_status == "STOPPED"
    task.containers[0].exitCode = 137


def test_run_starts_in_its_own_ecs_task_in_the_daemons_network(tmp_path):
    with production_instance(tmp_path) as (instance, aws, sent):
        assert type(instance.run_launcher).__name__ == "EcsRunLauncher"
        origin = LoadableTargetOrigin(
            executable_path=sys.executable, module_name="zero_assets.definitions", working_directory=str(REPO)
        )
        with in_process_test_workspace(instance, origin, container_image="zero:1") as workspace:
            run = create_run(instance, workspace)
            instance.launch_run(run.run_id, workspace)

        (request,) = run_task_requests(sent)
        assert request["taskDefinition"] == aws["run_definition"]  # DAGSTER_ECS_TASK_DEFINITION, resolved to its ARN
        assert request["cluster"] == aws["cluster"]  # the daemon task's cluster, from the metadata endpoint
        assert request["networkConfiguration"]["awsvpcConfiguration"]["subnets"] == [aws["subnet"]]
        assert request["networkConfiguration"]["awsvpcConfiguration"]["securityGroups"] == [aws["group"]]
        (override,) = request["overrides"]["containerOverrides"]
        assert override["name"] == "run"
        assert override["command"][:3] == ["dagster", "api", "execute_run"]
        assert deserialize_value(override["command"][3], ExecuteRunArgs).run_id == run.run_id
        tags = {t["key"]: t["value"] for t in request["tags"]}
        assert tags["dagster/run_id"] == run.run_id and tags["dagster/job_name"] == "zero_per_source"
        assert {k: v for k, v in tags.items() if k.startswith("zero/")} == {
            "zero/trigger": "new source",
            "zero/raw_version": "v-3f2a9c",
        }
        assert "dagster/partition" not in tags  # not on the allow list
        # The secret reaches the run only through its task definition (by ARN), never as a value.
        assert all(SECRET_VALUE.encode() not in body for _, body in sent)
        assert not {"ListSecrets", "GetSecretValue"} & {operation for operation, _ in sent}  # secrets_tag: null

        (task,) = aws["ecs"].describe_tasks(
            cluster=aws["cluster"], tasks=[instance.get_run_by_id(run.run_id).tags["ecs/task_arn"]], include=["TAGS"]
        )["tasks"]
        assert task["taskDefinitionArn"] == aws["run_definition"]
        assert {t["key"]: t["value"] for t in task["tags"]}["zero/trigger"] == "new source"
        definition = aws["ecs"].describe_task_definition(taskDefinition=task["taskDefinitionArn"])["taskDefinition"]
        assert definition["containerDefinitions"][0]["secrets"] == [
            {"name": "DAGSTER_PG_PASSWORD", "valueFrom": aws["secret_arn"]}
        ]


def test_run_monitoring_sees_the_task_and_resumes_a_dead_worker(tmp_path):
    with production_instance(tmp_path) as (instance, aws, sent):
        assert instance.run_monitoring_max_resume_run_attempts > 0 and instance.run_launcher.supports_resume_run
        origin = LoadableTargetOrigin(
            executable_path=sys.executable, module_name="zero_assets.definitions", working_directory=str(REPO)
        )
        with in_process_test_workspace(instance, origin, container_image="zero:1") as workspace:
            run = create_run(instance, workspace)
            instance.launch_run(run.run_id, workspace)
            instance.report_dagster_event(
                DagsterEvent(DagsterEventType.RUN_START.value, job_name=run.job_name), run_id=run.run_id
            )
            run = instance.get_run_by_id(run.run_id)
            assert run.status == DagsterRunStatus.STARTED
            assert instance.run_launcher.check_run_worker_health(run).status == WorkerStatus.RUNNING

            first_task = run.tags["ecs/task_arn"]
            aws["ecs"].stop_task(
                cluster=aws["cluster"], task=first_task, reason="Spot capacity reclaimed"
            )  # the worker dies
            kill_in_moto(first_task)
            health = instance.run_launcher.check_run_worker_health(run)
            assert health.status == WorkerStatus.FAILED and first_task in health.msg

            # The daemon's run monitor resumes it in a new task with `dagster api resume_run`.
            monitor_started_run(
                instance, workspace, instance.get_run_record_by_id(run.run_id), logging.getLogger("test")
            )
        resumed = instance.get_run_by_id(run.run_id)
        assert resumed.status == DagsterRunStatus.STARTED and resumed.tags["ecs/task_arn"] != first_task
        first, second = run_task_requests(sent)
        command = second["overrides"]["containerOverrides"][0]["command"]
        assert (
            command[:3] == ["dagster", "api", "resume_run"]
            and deserialize_value(command[3], ResumeRunArgs).run_id == run.run_id
        )
        assert second["taskDefinition"] == aws["run_definition"]
