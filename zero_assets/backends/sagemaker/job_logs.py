"""Tail every CloudWatch log stream of a SageMaker job to the step's stdout, keeping the last lines.

Unlike dagster-aws's `PipesCloudWatchLogReader` (one stream, gives up when throttled), a throttled read
backs off and each stream resumes where it was.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable
from functools import partial
from typing import TypeVar

from training_code.lib.aws_clients import Backoff, is_retryable

T = TypeVar("T")
log = logging.getLogger("zero.sagemaker")
PIPES_MESSAGE_MARK = '"__dagster_pipes_version"'  # a Pipes message, read by the message reader, not a log line


def guarded_read(backoff: Backoff, read: Callable[[], T], when_refused: T, where: str) -> T:
    """One read of a never-ending poll: `when_refused` while backing off or after a transient error."""
    if not backoff.ready():
        return when_refused
    try:
        found = read()
    except Exception as error:  # noqa: BLE001 - transient ones back off, the rest are raised
        if not is_retryable(error):
            raise
        log.warning("%s: %s; next read in %.0fs", where, error, backoff.failed())
        return when_refused
    backoff.succeeded()
    return found


class JobLogTail:
    def __init__(self, client, log_group: str, job_name: str) -> None:
        self._client = client
        self._group = log_group
        self._prefix = f"{job_name}/"
        self._tokens: dict[str, str] = {}
        self._backoff = Backoff(first_s=1.0, max_s=20.0)
        self._where = f"CloudWatch Logs {log_group} for {self._prefix}*"
        self._job_name = job_name
        self.last_lines: deque[str] = deque(maxlen=30)
        self.hosts: list[str] = []  # the hosts whose streams were read, in the order they appeared
        self._announced = 0  # hosts whose log stream an event has pointed at

    @property
    def throttled(self) -> int:
        """How many polls CloudWatch refused (throttling, 5xx, connection errors) so far."""
        return self._backoff.failures

    def refused_lately(self, within_s: float = 10.0) -> bool:
        """Backing off now, or refused within the last `within_s` seconds."""
        return not self._backoff.ready() or self._backoff.quiet_for() < within_s

    def streams(self) -> list[str]:
        return guarded_read(self._backoff, self._streams, [], self._where)

    def _streams(self) -> list[str]:
        try:
            paginator = self._client.get_paginator("describe_log_streams")
            pages = paginator.paginate(logGroupName=self._group, logStreamNamePrefix=self._prefix)
            return sorted(s["logStreamName"] for page in pages for s in page.get("logStreams", []))
        except self._client.exceptions.ResourceNotFoundException:
            return []  # the log group appears with the first job that logs in this account and region

    def poll(self) -> list[tuple[str, str]]:
        """New (host, line) pairs since the last poll, Pipes messages left out; [] while backing off."""
        lines: list[tuple[str, str]] = []
        for stream in self.streams():
            host = stream[len(self._prefix) :]
            if host not in self.hosts:
                self.hosts.append(host)
            messages: list[str] = []
            # A refused read keeps what was read; the stream resumes there.
            read_to_end = guarded_read(self._backoff, partial(self._new_messages, stream, messages), False, self._where)
            for message in messages:
                for line in message.splitlines():
                    if line and PIPES_MESSAGE_MARK not in line:
                        lines.append((host, line))
                        self.last_lines.append(f"[{host}] {line}")
            if not read_to_end:
                break
        return lines

    def _new_messages(self, stream: str, messages: list[str]) -> bool:
        """Append the stream's new messages to `messages`, page by page; True once at its end for now."""
        while True:
            request = {"logGroupName": self._group, "logStreamName": stream, "startFromHead": True}
            if stream in self._tokens:
                request["nextToken"] = self._tokens[stream]
            response = self._client.get_log_events(**request)
            messages += [event["message"] for event in response.get("events", [])]
            token = response.get("nextForwardToken")
            # The same token back means the end of the stream for now.
            if token is None or token == self._tokens.get(stream):
                return True
            self._tokens[stream] = token
            if not response.get("events"):
                return True

    def final_poll(self, max_wait_s: float = 60.0) -> list[tuple[str, str]]:
        """The lines CloudWatch delivered after the last poll, waiting out a back-off (at most `max_wait_s`)."""
        waited = 0.0
        while not self._backoff.ready() and waited < max_wait_s:
            time.sleep(0.5)
            waited += 0.5
        return self.poll()

    def forward(self, log, lines: Iterable[tuple[str, str]]) -> None:
        """Write the job's lines to stdout (the step capture) after `[host] `; log where, once per host."""
        for host in self.hosts[self._announced :]:
            log.info(
                f"[pipes] {self._job_name}: host {host}'s log (CloudWatch stream {self._job_name}/{host}) "
                f"is copied to this step's stdout, each line after [{host}]"
            )
        self._announced = len(self.hosts)
        for host, line in lines:
            sys.stdout.write(f"[{host}] {line}\n")
        sys.stdout.flush()
