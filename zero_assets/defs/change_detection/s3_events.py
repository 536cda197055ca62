"""The object events of an SQS message body holding S3 Event Notifications (bare, wrapped in SNS, or a test
event); keys decoded with non-UTF-8 bytes kept as surrogates, as a local listing gives them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from urllib.parse import unquote_plus

# Events that change the set of objects; tagging, ACL and restore events change no bytes.
CHANGE_PREFIXES = ("ObjectCreated:", "ObjectRemoved:", "LifecycleExpiration:")


class MalformedMessage(ValueError):
    """A message that is not an S3 event notification this parser understands."""


@dataclass(frozen=True)
class ObjectEvent:
    event: str  # "ObjectCreated:Put", ...
    bucket: str
    key: str  # decoded
    sequencer: str  # S3's per-key ordering token: distinct for distinct events of one key
    etag: str
    size: int


def parse_body(body: str) -> list[ObjectEvent]:
    """The object-changing events of one message; [] for a test event. MalformedMessage otherwise."""
    try:
        document = json.loads(body)
    except json.JSONDecodeError as error:
        raise MalformedMessage(f"not JSON ({error.msg})") from None
    if isinstance(document, dict) and document.get("Type") == "Notification" and "Message" in document:
        try:  # SNS wraps the S3 event as a JSON string
            document = json.loads(document["Message"])
        except (json.JSONDecodeError, TypeError):
            raise MalformedMessage("an SNS notification whose Message is not JSON") from None
    if not isinstance(document, dict):
        raise MalformedMessage(f"a JSON {type(document).__name__}, not an object")
    if document.get("Event") == "s3:TestEvent":
        return []
    records = document.get("Records")
    if not isinstance(records, list):
        raise MalformedMessage("no Records list (not an S3 event notification)")
    return [event for index, record in enumerate(records) if (event := _parse_record(record, index)) is not None]


def _parse_record(record, index: int) -> ObjectEvent | None:
    if not isinstance(record, dict):
        raise MalformedMessage(f"Records[{index}] is a JSON {type(record).__name__}, not an object")
    name = record.get("eventName")
    if not isinstance(name, str):
        raise MalformedMessage(f"Records[{index}] has no eventName")
    if not name.startswith(CHANGE_PREFIXES):
        return None
    s3 = record.get("s3")
    bucket = s3.get("bucket") if isinstance(s3, dict) else None
    obj = s3.get("object") if isinstance(s3, dict) else None
    if (
        not isinstance(bucket, dict)
        or not isinstance(obj, dict)
        or not isinstance(bucket.get("name"), str)
        or not isinstance(obj.get("key"), str)
    ):
        raise MalformedMessage(f"Records[{index}] ({name}) lacks s3.bucket.name or s3.object.key")
    size = obj.get("size", 0)
    return ObjectEvent(
        event=name,
        bucket=bucket["name"],
        key=unquote_plus(obj["key"], errors="surrogateescape"),
        sequencer=str(obj.get("sequencer", "")),
        etag=str(obj.get("eTag", "")),
        size=size if isinstance(size, int) and not isinstance(size, bool) else 0,
    )
