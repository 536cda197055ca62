"""The raw bucket's event queue (SQS): receive messages in batches within a time budget, delete them.

One long poll, then short polls to drain; `ZERO_SQS_ENDPOINT_URL` points at an SQS-compatible endpoint.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from training_code.lib.aws_clients import client
from zero_assets.core.settings import zero_env

BATCH = 10  # SQS's most messages per ReceiveMessage and per DeleteMessageBatch
LONG_POLL_MAX_S = 20  # SQS's longest WaitTimeSeconds
_REGION_IN_URL = re.compile(r"^https://sqs[.-]([a-z0-9-]+)\.amazonaws\.com")


@dataclass(frozen=True)
class Message:
    message_id: str
    receipt: str
    body: str


def sqs_client(queue_url: str):
    """The shared SQS client for `queue_url`: its region from the URL when it is AWS's, else the environment's."""
    match = _REGION_IN_URL.match(queue_url)
    return client(
        "sqs", region=match.group(1) if match else None, endpoint_url=zero_env("ZERO_SQS_ENDPOINT_URL") or None
    )


def receive(
    queue_url: str, *, budget_s: float, max_messages: int, visibility_timeout_s: int, wait_s: float | None = None
) -> list[Message]:
    """Up to `max_messages` messages within about `budget_s`, the first receive waiting up to `wait_s`.

    A message not deleted within `visibility_timeout_s` is delivered again."""
    sqs = sqs_client(queue_url)
    deadline = time.monotonic() + budget_s
    messages: list[Message] = []
    wait = int(min(LONG_POLL_MAX_S, max(0.0, budget_s if wait_s is None else min(wait_s, budget_s))))
    while len(messages) < max_messages:
        answer = sqs.receive_message(
            QueueUrl=queue_url,
            MaxNumberOfMessages=min(BATCH, max_messages - len(messages)),
            WaitTimeSeconds=wait,
            VisibilityTimeout=visibility_timeout_s,
            AttributeNames=["All"],
        )
        batch = answer.get("Messages", [])
        messages += [Message(m["MessageId"], m["ReceiptHandle"], m.get("Body", "")) for m in batch]
        # A short poll may answer empty while a few messages wait elsewhere: the next tick gets them.
        if not batch or time.monotonic() >= deadline:
            break
        wait = 0
    return messages


def delete(queue_url: str, receipts: list[str]) -> list[str]:
    """Delete the messages by receipt; a line for each that could not be (it will be delivered again)."""
    sqs = sqs_client(queue_url)
    failures = []
    for start in range(0, len(receipts), BATCH):
        entries = [{"Id": str(i), "ReceiptHandle": r} for i, r in enumerate(receipts[start : start + BATCH])]
        answer = sqs.delete_message_batch(QueueUrl=queue_url, Entries=entries)
        failures += [
            f"{queue_url}: delete failed ({f.get('Code')}: {f.get('Message', '')})" for f in answer.get("Failed", [])
        ]
    return failures
