"""An output's lease as an object beside it on S3 (`<output uri>.lease.json`): every change a conditional write,
so S3 decides between racing runs; staleness judged on S3's clock only (LastModified against the response's
Date); a refused write settled by reading the lease's token again, as a retried write may have landed."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from email.utils import parsedate_to_datetime
from typing import Any, NoReturn

from training_code.lib.aws_clients import is_retryable
from training_code.lib.s3_storage import s3_call, s3_client, split_s3
from zero_assets.launch.lease_store import Lease, LeaseStore, owner_record

LEASE_FORMAT = "zero-output-lease/1"
ACQUIRE_ROUNDS = 4  # a refused conditional write means another run changed the lease: look again a few times
# The answers to a conditional request whose condition did not hold: 412, a concurrent conditional
# request on the key (409), or an If-Match on a key that is gone (404).
REFUSED = {"PreconditionFailed", "ConditionalRequestConflict", "NoSuchKey", "404", "409", "412"}
MISSING = {"NoSuchKey", "404", "NotFound"}
HTTP_DATE = re.compile(r"[A-Z][a-z]{2}, \d{2} [A-Z][a-z]{2} \d{4} \d{2}:\d{2}:\d{2} GMT")  # RFC 9110 IMF-fixdate


class OutputLeaseError(RuntimeError):
    """S3 refused a lease request for a reason other than another run's lease."""


@dataclass(frozen=True)
class Found:
    record: dict[str, Any]
    etag: str
    age_s: float  # since the last heartbeat, by S3's clock


def _code(error) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


class S3LeaseStore(LeaseStore):
    heartbeat_s = 3.0  # one PUT per beat
    poll_s = 1.0  # one GET per look

    def __init__(self, uri: str) -> None:
        self.location = uri
        self.bucket, self.key = split_s3(uri)

    def try_acquire(self, run_id: str, stale_after_s: float) -> tuple[Lease | None, dict[str, Any] | None]:
        token = uuid.uuid4().hex
        mine = owner_record(run_id, token)
        body = self._body(mine)
        took_over, current = None, None
        for _ in range(ACQUIRE_ROUNDS):
            current = self._get()
            if current is not None and current.record.get("token") == token:  # a retried write of ours landed
                return Lease(self.location, token, mine, current.etag, took_over=took_over), None
            if current is None:
                took_over = None
                written = self._put(body, IfNoneMatch="*")
            elif current.age_s <= stale_after_s:
                return None, current.record
            else:
                gone = f"its heartbeat is {current.age_s:.0f} s old by S3's clock (stale after {stale_after_s:.0f} s)"
                took_over = f"{current.record.get('run_id', 'unknown run')} ({gone})"
                written = self._put(body, IfMatch=current.etag)
            if written is not None:
                return Lease(self.location, token, mine, written, took_over=took_over), None
        return None, current.record if current is not None else {"run_id": "another run"}

    def holder(self, stale_after_s: float) -> dict[str, Any] | None:
        current = self._get()
        return current.record if current is not None and current.age_s <= stale_after_s else None

    def renew(self, lease: Lease) -> Lease | None:
        written = self._put(self._body(lease.record), IfMatch=lease.version)
        if written is None:  # refused: taken over, unless a retried write of ours landed first
            current = self._get()
            written = current.etag if current is not None and current.record.get("token") == lease.token else None
        return replace(lease, version=written) if written is not None else None

    def release(self, lease: Lease) -> None:
        version = lease.version
        for _ in range(ACQUIRE_ROUNDS):
            if self._delete(version):
                return
            current = self._get()
            if current is None or current.record.get("token") != lease.token:
                return  # already gone, or another run's lease now: not ours to delete
            version = current.etag  # a heartbeat of ours landed after all: delete that one

    def _body(self, record: dict[str, Any]) -> bytes:
        """The owner record and the time of this write (for people; staleness is judged on S3's clock)."""
        return json.dumps({"format": LEASE_FORMAT, **record, "renewed_at": time.time()}, indent=1).encode()

    def _get(self) -> Found | None:
        def get() -> Found:
            response = s3_client().get_object(Bucket=self.bucket, Key=self.key)
            return Found(_record(response["Body"].read()), response["ETag"], _age_s(response, self.location))

        return self._call("GET", "", get, MISSING, None)

    def _put(self, body: bytes, **condition: str) -> str | None:
        """The ETag written, or None when the condition did not hold."""

        def put() -> str:
            return s3_client().put_object(
                Bucket=self.bucket, Key=self.key, Body=body, ContentType="application/json", **condition
            )["ETag"]

        return self._call("PUT", f" ({condition})", put, REFUSED, None)

    def _delete(self, version: str | None) -> bool:
        """Whether the lease written as `version` was deleted (False: it is not that version any more)."""

        def delete() -> bool:
            s3_client().delete_object(Bucket=self.bucket, Key=self.key, IfMatch=version)
            return True

        return self._call("DELETE", f" (IfMatch {version})", delete, REFUSED, False)

    def _call(self, verb: str, condition: str, request: Callable[[], Any], answered: set[str], answer: Any) -> Any:
        """`request()` through `s3_call`; a refusal whose code is in `answered` gives `answer`, others `_fail`."""
        from botocore.exceptions import ClientError

        def call() -> Any:
            try:
                return request()
            except ClientError as error:
                if _code(error) in answered:
                    return answer
                self._fail(f"{verb}{condition}", error)

        return s3_call(call, f"{verb} {self.location}{condition}")

    def _fail(self, what: str, error) -> NoReturn:
        """Re-raise a transient `error` (`s3_call` retries it), else raise `OutputLeaseError` naming what to check."""
        if is_retryable(error):
            raise error
        hint = (
            "the S3 endpoint does not support conditional requests (If-None-Match / If-Match on PutObject, "
            "If-Match on DeleteObject), which the output lease needs; AWS S3 supports them"
            if _code(error) in {"NotImplemented", "InvalidArgument"}
            else "check the run's permissions on the lake prefix (s3:GetObject, s3:PutObject, s3:DeleteObject)"
        )
        raise OutputLeaseError(f"output lease {what} {self.location} refused: {error}; {hint}") from error


def _record(body: bytes) -> dict[str, Any]:
    try:
        record = json.loads(body)
    except ValueError:  # written whole by one PUT, so unreadable means foreign or damaged: judged by age alone
        return {}
    return record if isinstance(record, dict) else {}


def _age_s(response: dict[str, Any], uri: str) -> float:
    """Seconds since the object was last written, by S3's clock (a proxy may prepend a Date: the last is S3's)."""
    dates = HTTP_DATE.findall(response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date", ""))
    if not dates:
        raise OutputLeaseError(
            f"the GET of output lease {uri} came back without a Date header: the lease's age cannot be judged on "
            "S3's clock (is a proxy on the way stripping it?)"
        )
    return max(0.0, (parsedate_to_datetime(dates[-1]) - response["LastModified"]).total_seconds())
