"""Shared fixtures: a tiny demo raw root, a real Dagster instance in a temp folder, resources on both,
and the loopback S3 and SQS servers (one per test module that asks)."""

import time
from pathlib import Path

import pytest
from dagster import instance_for_test
from helpers.local_s3 import LocalS3Server

from zero_assets.backends.local.runner import LocalJobRunner
from zero_assets.core.settings import ZeroSettings
from zero_assets.ops.demo_data import make_demo_raw_root


@pytest.fixture(scope="session")
def tiny_demo(tmp_path_factory) -> dict:
    """A raw root with every planted bad case and 36 good images (read-only by convention).

    Returns make_demo_raw_root's summary: `out` (the root) and `planted` (bad case -> key).
    """
    return make_demo_raw_root(tmp_path_factory.mktemp("raw") / "root", images=36, seed=7)


@pytest.fixture(scope="session")
def tiny_raw_root(tiny_demo) -> Path:
    return Path(tiny_demo["out"])


@pytest.fixture
def instance(tmp_path):
    with instance_for_test(temp_dir=str(tmp_path)) as dagster_instance:
        yield dagster_instance


def make_resources(raw_uri: Path, state: Path) -> dict:
    (state / "fsx").mkdir(parents=True, exist_ok=True)
    settings = ZeroSettings(raw_uri=str(raw_uri), lake_uri=str(state / "lake"), fsx_mount=str(state / "fsx"))
    return {"settings": settings, "jobs": LocalJobRunner(settings=settings)}


@pytest.fixture
def resources(tiny_raw_root, tmp_path) -> dict:
    return make_resources(tiny_raw_root, tmp_path / "state")


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory):
    """A real S3-compatible server on loopback, shared by the tests of one module."""
    with LocalS3Server(tmp_path_factory.mktemp("s3")) as server:
        yield server


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    """The loopback S3 server's endpoint and credentials in the environment, for this test only."""
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    return s3_server


@pytest.fixture(scope="module")
def moto_endpoint():
    """A moto server (S3, CloudWatch Logs) on loopback for one module: the SageMaker fake's AWS side."""
    from helpers.sagemaker_fakes import moto_server

    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture(scope="module")
def sqs_endpoint():
    """A real SQS-compatible server (moto) for one module; its endpoint is in ZERO_SQS_ENDPOINT_URL."""
    from helpers.sqs_server import sqs_server  # moto is imported only by the modules that use it

    with sqs_server() as endpoint:
        yield endpoint


@pytest.fixture
def queue(sqs_endpoint, request):
    """A new queue on the module's SQS server for this test; its URL."""
    from helpers.sqs_server import sqs

    name = f"raw-events-{request.node.name[:40].replace('[', '-').replace(']', '')}-{time.monotonic_ns() % 10**9}"
    return sqs().create_queue(QueueName=name)["QueueUrl"]
