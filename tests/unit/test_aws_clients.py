"""The one AWS client policy: shared clients per process, its retry configuration, which errors are
transient, and the time-bounded outer retry (the fault proxy tests drive it against a real server)."""

from __future__ import annotations

import os
import threading
import time

import pytest
from boto3.exceptions import S3UploadFailedError
from botocore.exceptions import ClientError, ConnectionClosedError, IncompleteReadError, ReadTimeoutError
from helpers.loopback_http import QuietHandler, loopback_server

from training_code.lib import aws_clients

ENDPOINT = "http://127.0.0.1:9"  # nothing listens there; no call is made


def _client_error(code: str, status: int) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject"
    )


def test_one_client_per_process_and_endpoint_even_from_many_threads(monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    found = []
    threads = [
        threading.Thread(target=lambda: found.append(aws_clients.client("s3", endpoint_url=ENDPOINT)))
        for _ in range(16)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({id(c) for c in found}) == 1
    assert aws_clients.client("s3", endpoint_url="http://127.0.0.1:10") is not found[0]
    config = found[0].meta.config
    assert config.retries == {"mode": "standard", "total_max_attempts": aws_clients.SERVICE_ATTEMPTS["s3"]}
    assert (config.connect_timeout, config.read_timeout) == (10.0, 60.0)
    for service in ("logs", "sagemaker", "fsx", "sqs"):  # the control-plane clients keep adaptive retries
        retries = aws_clients.client(service, region="us-east-1").meta.config.retries
        assert retries == {"mode": "adaptive", "total_max_attempts": aws_clients.SERVICE_ATTEMPTS[service]}

    pid = os.fork()
    if pid == 0:  # a forked child must not share the parent's connections
        os._exit(
            0
            if aws_clients.client("s3", endpoint_url=ENDPOINT) is not found[0] and len(aws_clients._clients) == 1
            else 1
        )
    assert os.waitpid(pid, 0)[1] == 0


@pytest.mark.parametrize(
    "error, transient",
    [
        (_client_error("SlowDown", 503), True),
        (_client_error("ThrottlingException", 400), True),
        (_client_error("InternalError", 500), True),
        (_client_error("NoSuchKey", 404), False),
        (_client_error("AccessDenied", 403), False),
        (IncompleteReadError(actual_bytes=1, expected_bytes=2), True),
        (ReadTimeoutError(endpoint_url=ENDPOINT), True),
        (ConnectionClosedError(endpoint_url=ENDPOINT), True),
        (ValueError("not an AWS error"), False),
    ],
)
def test_transient_errors_are_told_apart(error, transient):
    assert aws_clients.is_retryable(error) is transient


def test_an_upload_error_is_judged_by_what_it_wraps():
    try:
        try:
            raise _client_error("SlowDown", 503)
        except ClientError as error:
            raise S3UploadFailedError(f"Failed to upload: {error}") from error
    except S3UploadFailedError as wrapped:
        assert aws_clients.is_retryable(wrapped)


def test_retry_call_rides_out_transient_errors_then_names_the_endpoint():
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionClosedError(endpoint_url=ENDPOINT)
        return "ok"

    assert (
        aws_clients.retry_call(flaky, what="GET s3://b/k", endpoint=ENDPOINT, window_s=10) == "ok" and len(calls) == 3
    )

    def down():
        raise ConnectionClosedError(endpoint_url=ENDPOINT)

    with pytest.raises(
        aws_clients.AwsUnavailableError, match=r"GET s3://b/k failed at http://127\.0\.0\.1:9 .*retry window 1s"
    ):
        aws_clients.retry_call(down, what="GET s3://b/k", endpoint=ENDPOINT, window_s=1)

    refused = []
    with pytest.raises(ClientError):
        aws_clients.retry_call(
            lambda: refused.append(1) or (_ for _ in ()).throw(_client_error("AccessDenied", 403)),
            what="GET s3://b/k",
            endpoint=ENDPOINT,
        )
    assert refused == [1], "a permanent error is raised at once"


def test_backoff_grows_and_resets():
    backoff = aws_clients.Backoff(first_s=1, max_s=4)
    assert backoff.ready() and backoff.quiet_for() == float("inf")
    assert [backoff.failed() for _ in range(4)] == [1, 2, 4, 4]
    assert not backoff.ready() and backoff.quiet_for() < 1
    backoff.succeeded()
    assert backoff.ready() and backoff.failed() == 1


class _ThrottledPrefix(QuietHandler):
    """A minimal S3 endpoint: every GET under `hot/` answers 503 SlowDown, every other GET a small body."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if "/hot/" in self.path:
            self.reply(503, b"<Error><Code>SlowDown</Code><Message>Reduce your request rate.</Message></Error>")
        else:
            self.reply(200, b"ok")


@pytest.fixture
def throttling_endpoint():
    with loopback_server(_ThrottledPrefix) as url:
        yield url


def test_a_throttled_prefix_does_not_slow_the_shared_s3_client_down_for_other_prefixes(
    throttling_endpoint, monkeypatch
):
    """botocore's `adaptive` mode keeps one rate limiter per client: after two SlowDown answers on one
    prefix it holds every later request of that client, on any prefix, to about one every 0.8 s (five
    GETs of another prefix take about 4 s). S3's shared client is `standard`, so they go at once."""
    monkeypatch.setenv("ZERO_AWS_MAX_ATTEMPTS", "1")  # one try a call: the throttles are seen, never waited out
    s3 = aws_clients.client("s3", region="us-east-1", endpoint_url=throttling_endpoint, access_key="a", secret_key="b")
    for n in range(2):
        with pytest.raises(ClientError, match="SlowDown"):
            s3.get_object(Bucket="lake", Key=f"hot/{n}")
    started = time.perf_counter()
    assert [s3.get_object(Bucket="lake", Key=f"cold/{n}")["Body"].read() for n in range(5)] == [b"ok"] * 5
    assert time.perf_counter() - started < 1.0, "the other prefix's GETs were held back by the throttled one"
