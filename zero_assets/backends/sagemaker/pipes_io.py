"""Pipes context and message locations on S3, keyed by the job name so a reattaching run finds them (the
context goes to S3: SageMaker caps environment values). Both readers back off on refused reads and resume.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Literal, Optional

from dagster_aws.pipes import PipesCloudWatchMessageReader, PipesS3ContextInjector, PipesS3MessageReader
from dagster_pipes import PipesBlobStoreMessageWriter, PipesDefaultMessageWriter, PipesParams, encode_param

from training_code.lib.aws_clients import Backoff, endpoint_of, retry_call
from training_code.lib.storage import split_s3
from zero_assets.backends.sagemaker.job_logs import guarded_read

REPORT_GRACE_S = 5.0  # after the job ends: how long past a reader's last refused read to wait for the report
REPORT_WAIT_S = 600.0  # and how long at most, while the message store keeps refusing reads


def context_params(pipes_uri: str, job_name: str) -> dict:
    bucket, prefix = split_s3(pipes_uri)
    return {"bucket": bucket, "key": f"{prefix}/{job_name}/context.json".lstrip("/")}


def message_params(pipes_uri: str, job_name: str, messages: Literal["s3", "cloudwatch"]) -> dict:
    if messages == "cloudwatch":
        return {PipesDefaultMessageWriter.STDIO_KEY: PipesDefaultMessageWriter.STDOUT}
    bucket, prefix = split_s3(pipes_uri)
    return {
        "bucket": bucket,
        "key_prefix": f"{prefix}/{job_name}/messages".lstrip("/"),
        PipesBlobStoreMessageWriter.INCLUDE_STDIO_IN_MESSAGES_KEY: False,
    }


def bootstrap_environment(pipes_uri: str, job_name: str, messages: Literal["s3", "cloudwatch"]) -> dict[str, str]:
    """The two variables a Pipes session gives a job, computed without one (for `render-jobs`)."""
    return {
        "DAGSTER_PIPES_CONTEXT": encode_param(context_params(pipes_uri, job_name)),
        "DAGSTER_PIPES_MESSAGES": encode_param(message_params(pipes_uri, job_name, messages)),
    }


class JobKeyedS3ContextInjector(PipesS3ContextInjector):
    def __init__(self, *, pipes_uri: str, job_name: str, client) -> None:
        self._params = context_params(pipes_uri, job_name)
        super().__init__(bucket=self._params["bucket"], client=client)

    @contextmanager
    def inject_context(self, context) -> Iterator[PipesParams]:
        import json

        body, key = json.dumps(context).encode(), self._params["key"]
        retry_call(
            lambda: self.client.put_object(Bucket=self.bucket, Key=key, Body=body),
            what=f"PUT s3://{self.bucket}/{key}",
            endpoint=endpoint_of(self.client),
        )
        yield dict(self._params)
        # Left in place for a job still starting or a later reattach; a lifecycle rule expires it.


class JobKeyedS3MessageReader(PipesS3MessageReader):
    def __init__(self, *, pipes_uri: str, job_name: str, client, interval: float = 10) -> None:
        self._params = message_params(pipes_uri, job_name, "s3")
        super().__init__(bucket=self._params["bucket"], client=client, interval=interval)
        self.backoff = Backoff(first_s=1.0, max_s=20.0)
        self._where = f"Pipes messages at s3://{self._params['bucket']}/{self._params['key_prefix']}"

    @contextmanager
    def get_params(self) -> Iterator[PipesParams]:
        yield dict(self._params)

    def messages_are_readable(self, params: PipesParams) -> bool:
        return guarded_read(self.backoff, partial(super().messages_are_readable, params), False, self._where)

    def download_messages_chunk(self, index: int, params: PipesParams) -> str | None:
        # The base class retries only ClientErrors; connection and body-read errors must not end it either.
        return guarded_read(self.backoff, partial(super().download_messages_chunk, index, params), None, self._where)


class BackoffCloudWatchMessageReader(PipesCloudWatchMessageReader):
    """dagster-aws's CloudWatch reader, backing off and resuming instead of giving up when throttled."""

    def __init__(self, *, client) -> None:
        super().__init__(client=client)
        self.backoff = Backoff(first_s=1.0, max_s=20.0)

    def messages_are_readable(self, params: PipesParams) -> bool:
        return guarded_read(self.backoff, partial(super().messages_are_readable, params), False, self._where())

    def download_messages(self, cursor, params: PipesParams):
        return guarded_read(self.backoff, partial(super().download_messages, cursor, params), None, self._where())

    def _where(self) -> str:
        return f"Pipes messages at CloudWatch {self.log_group}/{self.log_stream}"


def await_report(log, session, reader, name: str, poll_interval: float) -> None:
    """After the job ended, wait (at most REPORT_WAIT_S) for the closing message while the reader backs off."""
    backoff: Optional[Backoff] = getattr(reader, "backoff", None)
    if backoff is None:
        return
    deadline = time.monotonic() + REPORT_WAIT_S
    while (
        not session.message_handler.received_closed_message
        and time.monotonic() < deadline
        and (not backoff.ready() or backoff.quiet_for() < REPORT_GRACE_S + poll_interval)
    ):
        time.sleep(0.5)
    if not session.message_handler.received_closed_message and backoff.failures:
        log.warning(f"[pipes] {name}: the message store refused {backoff.failures} reads; the report may be incomplete")


def report_message_stream(logs, session, log_group: str) -> bool:
    """Point the CloudWatch reader at the first host's stream (rank 0 writes messages) if it exists; whether it did."""
    streams = logs.streams()
    if not streams:
        return False
    session.report_launched({"extras": {"log_group": log_group, "log_stream": streams[0]}})
    return True


def await_message_stream(logs, session, log_group: str, within_s: float) -> bool:
    """After the job ended, retry a refused stream lookup for at most `within_s`; whether it was found."""
    deadline = time.monotonic() + within_s
    while logs.refused_lately() and time.monotonic() < deadline:
        time.sleep(0.5)
        if report_message_stream(logs, session, log_group):
            return True
    return False


def message_reader_for(messages: str, *, pipes_uri: str, job_name: str, s3_client, logs_client, interval: float):
    if messages == "s3":
        return JobKeyedS3MessageReader(pipes_uri=pipes_uri, job_name=job_name, client=s3_client, interval=interval)
    if messages == "cloudwatch":
        return BackoffCloudWatchMessageReader(client=logs_client)
    raise ValueError(f"messages={messages!r}: use 's3' or 'cloudwatch'")
