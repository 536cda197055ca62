"""Tail a SageMaker job's CloudWatch log streams (`<log group>/<job name>/<host>-<n>`).

Every stream of the job is followed from its start (one per instance), new lines returned on each
`poll()`, and the last lines kept so a failure can quote them.
"""

from __future__ import annotations

from collections import deque

PIPES_MESSAGE_MARK = '"__dagster_pipes_version"'  # a Pipes message, read by the message reader, not a log line


class JobLogTail:
    def __init__(self, client, log_group: str, job_name: str, keep_lines: int = 30) -> None:
        self._client = client
        self._group = log_group
        self._prefix = f"{job_name}/"
        self._tokens: dict[str, str] = {}
        self.last_lines: deque[str] = deque(maxlen=keep_lines)

    def streams(self) -> list[str]:
        try:
            paginator = self._client.get_paginator("describe_log_streams")
            pages = paginator.paginate(logGroupName=self._group, logStreamNamePrefix=self._prefix)
            return sorted(s["logStreamName"] for page in pages for s in page.get("logStreams", []))
        except self._client.exceptions.ResourceNotFoundException:
            return []  # the log group appears with the first job that logs in this account and region

    def poll(self) -> list[tuple[str, str]]:
        """New (host, line) pairs since the last poll, Pipes messages left out."""
        lines: list[tuple[str, str]] = []
        for stream in self.streams():
            host = stream[len(self._prefix) :]
            for message in self._new_messages(stream):
                for line in message.splitlines():
                    if line and PIPES_MESSAGE_MARK not in line:
                        lines.append((host, line))
                        self.last_lines.append(f"[{host}] {line}")
        return lines

    def _new_messages(self, stream: str) -> list[str]:
        messages: list[str] = []
        while True:
            request = {"logGroupName": self._group, "logStreamName": stream, "startFromHead": True}
            if stream in self._tokens:
                request["nextToken"] = self._tokens[stream]
            response = self._client.get_log_events(**request)
            messages += [event["message"] for event in response.get("events", [])]
            token = response.get("nextForwardToken")
            # The same token back means the end of the stream for now.
            if token is None or token == self._tokens.get(stream):
                return messages
            self._tokens[stream] = token
            if not response.get("events"):
                return messages
