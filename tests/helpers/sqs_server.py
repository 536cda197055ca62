"""A real SQS-compatible server on loopback for tests and benchmarks: moto in server mode."""

from __future__ import annotations

import contextlib
import os
from unittest import mock

from moto.server import ThreadedMotoServer

from helpers.local_s3 import LocalS3Server
from training_code.lib.aws_clients import client

# The local S3 server's credentials: moto accepts any, and `weed` started while other credentials are
# in the environment takes them as its own and refuses the local S3 server's client.
ENV = {
    "AWS_ACCESS_KEY_ID": LocalS3Server.access_key,
    "AWS_SECRET_ACCESS_KEY": LocalS3Server.secret_key,
    "AWS_DEFAULT_REGION": LocalS3Server.region,
}


@contextlib.contextmanager
def sqs_server():
    """Yields the endpoint URL; while open, ZERO_SQS_ENDPOINT_URL and test credentials are set."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        with mock.patch.dict(os.environ, {**ENV, "ZERO_SQS_ENDPOINT_URL": endpoint}):
            yield endpoint
    finally:
        server.stop()


def sqs():
    return client("sqs", endpoint_url=os.environ["ZERO_SQS_ENDPOINT_URL"])


def queue_counts(queue_url: str) -> tuple[int, int]:
    """(visible, in flight) messages of the queue."""
    attributes = sqs().get_queue_attributes(QueueUrl=queue_url, AttributeNames=["All"])["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]), int(attributes["ApproximateNumberOfMessagesNotVisible"])
