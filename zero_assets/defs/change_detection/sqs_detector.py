"""Change detection from the raw bucket's S3 Event Notifications on an SQS queue, at least once: a message is
deleted only by the tick after the one that read it was committed; one not an S3 event is left for the DLQ.
Receiving is one long poll, then short polls to drain; `ZERO_SQS_ENDPOINT_URL` points at an SQS-compatible one."""

from __future__ import annotations

import re
import time
from collections import defaultdict
from dataclasses import dataclass

from training_code.lib.aws_clients import client
from training_code.lib.hashing import sha256_json
from training_code.lib.storage import printable_key, split_s3
from zero_assets.core.settings import zero_env
from zero_assets.defs.change_detection import Detection, TickState
from zero_assets.defs.change_detection.s3_events import MalformedMessage, parse_body
from zero_assets.defs.change_detection.source_digests import DIGEST_CHARS
from zero_assets.defs.change_detection.sources import MAX_PROBLEMS, SourceFilter

KIND = "sqs"
MAX_MESSAGES_PER_TICK = 1000  # about 100 receive calls; bounds the receipts kept between ticks
VISIBILITY_TIMEOUT_S = 900  # several tick intervals, so received messages stay hidden until deleted
BATCH = 10  # SQS's most messages per ReceiveMessage and per DeleteMessageBatch
LONG_POLL_MAX_S = 20  # SQS's longest WaitTimeSeconds
_REGION_IN_URL = re.compile(r"^https://sqs[.-]([a-z0-9-]+)\.amazonaws\.com")


def detect_from_queue(
    queue_url: str,
    raw_uri: str,
    cursor: dict | None,
    store,
    *,
    budget_s: float,
    wait_s: float | None = None,
    visibility_timeout_s: int = VISIBILITY_TIMEOUT_S,
) -> Detection:
    """`store`: the instance's run storage, which keeps the receipts between ticks."""
    if not raw_uri.startswith("s3://"):
        raise ValueError(
            f"ZERO_RAW_EVENTS_QUEUE_URL is set but the raw root {raw_uri} is not an s3:// URI; "
            "S3 events name bucket keys"
        )
    bucket, prefix = split_s3(raw_uri)
    base = f"{prefix}/" if prefix else ""
    previous = (
        cursor
        if cursor and cursor.get("kind") == KIND and cursor.get("queue") == queue_url and cursor.get("raw") == raw_uri
        else {}
    )
    tick = previous.get("tick", 0)
    problems: list[str] = []

    pending = TickState(store, f"sqs-receipts {queue_url}")
    if receipts_read := pending.read(tick):
        problems += delete(queue_url, receipts_read)  # the tick that read them was committed

    messages = receive(
        queue_url,
        budget_s=budget_s,
        wait_s=wait_s,
        max_messages=MAX_MESSAGES_PER_TICK,
        visibility_timeout_s=visibility_timeout_s,
    )
    events_by_source: dict[str, list] = defaultdict(list)
    receipts, malformed, events, sources = [], 0, 0, SourceFilter()
    for message in messages:
        try:
            object_events = parse_body(message.body)
        except MalformedMessage as error:
            malformed += 1
            if malformed <= MAX_PROBLEMS:
                problems.append(
                    f"message {message.message_id} on {queue_url} skipped: {error}; "
                    "left on the queue for its dead-letter queue"
                )
            continue
        receipts.append(message.receipt)
        for event in object_events:
            if event.bucket != bucket or not event.key.startswith(base):
                continue
            relative = event.key[len(base) :]
            source = sources.source(relative)
            if source is None:
                continue
            events += 1
            events_by_source[source].append(
                [printable_key(relative), event.event, event.sequencer, event.etag, event.size]
            )

    if malformed > MAX_PROBLEMS:
        problems.append(f"... and {malformed - MAX_PROBLEMS} more malformed messages")
    problems += sources.problem_lines()
    pending.write(tick + 1, receipts)
    changed = {source: sha256_json(sorted(rows))[:DIGEST_CHARS] for source, rows in events_by_source.items()}
    change_number = previous.get("changes", 0) + (1 if changed else 0)
    new_cursor = {
        "kind": KIND,
        "queue": queue_url,
        "raw": raw_uri,
        "tick": tick + 1,
        "changes": change_number,
        "events": previous.get("events", 0) + events,
        "malformed": previous.get("malformed", 0) + malformed,
    }
    summary = f"{len(messages)} messages from {queue_url}: {events} object events in {len(changed)} sources"
    return Detection(changed, new_cursor, summary, problems, change_number)


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
    """Up to `max_messages` messages within about `budget_s`, the first receive waiting up to `wait_s`."""
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
