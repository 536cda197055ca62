"""One AWS client policy for every process: shared clients, botocore retries, bounded waits.

`client()` returns one boto3 client per process, service, region, endpoint and credentials; `retry_call`
adds an outer time-bounded retry for idempotent calls, ending in `AwsUnavailableError`. Environment:
ZERO_AWS_RETRY_WINDOW_S (90), ZERO_AWS_MAX_ATTEMPTS, ZERO_AWS_CONNECT_TIMEOUT_S (10), ZERO_AWS_READ_TIMEOUT_S (60).
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

log = logging.getLogger("zero.aws")
T = TypeVar("T")

# botocore attempts per call (first try included). The services a run waits on get more: a throttled
# DescribeTrainingJob or GetLogEvents must not end the wait for a job that keeps running.
SERVICE_ATTEMPTS = {"s3": 8, "sagemaker": 12, "logs": 12, "fsx": 10, "sqs": 8}
DEFAULT_ATTEMPTS = 5
# S3 uses `standard`: `adaptive` rate-limits per client, and the process shares one S3 client, so one
# prefix's SlowDown would throttle every transfer. Control-plane clients call one API each.
RETRY_MODES = {"s3": "standard"}
DEFAULT_RETRY_MODE = "adaptive"
S3_POOL = 32  # connections per S3 client: listing and transfer threads share one client
RETRY_WINDOW_S = 90.0  # an outage this long is ridden out by idempotent S3 calls
FIRST_DELAY_S, MAX_DELAY_S = 0.5, 8.0

# ClientError codes that mean "try again later", whatever the service.
RETRYABLE_CODES = frozenset(
    "SlowDown Throttling ThrottlingException ThrottledException RequestThrottled RequestLimitExceeded "
    "TooManyRequestsException ProvisionedThroughputExceededException RequestThrottledException LimitExceededException "
    "ServiceUnavailable ServiceUnavailableException InternalError InternalFailure InternalServerError RequestTimeout "
    "RequestTimeoutException PriorRequestNotComplete BandwidthLimitExceeded EC2ThrottledException".split()
)

_lock = threading.Lock()
_clients: dict[tuple, Any] = {}
_sessions: dict[tuple, Any] = {}


def _reset_after_fork() -> None:
    """A forked child may inherit the lock held by another thread, and clients whose sockets the parent uses."""
    global _lock
    _lock = threading.Lock()
    _clients.clear()
    _sessions.clear()


os.register_at_fork(after_in_child=_reset_after_fork)


class AwsUnavailableError(RuntimeError):
    """An AWS endpoint kept failing for the whole retry window. Not an OSError on purpose: callers
    that treat a missing file as "rebuild" must not mistake an outage for a missing output."""


def _env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    try:
        return float(value) if value else default
    except ValueError:
        raise ValueError(f"{name}={value!r} is not a number of seconds") from None


def client_config(service: str, max_attempts: int | None = None):
    """The botocore Config every client of `service` gets (`max_attempts` only for probes that poll on their own)."""
    from botocore.config import Config

    attempts = max_attempts or int(_env_float("ZERO_AWS_MAX_ATTEMPTS", SERVICE_ATTEMPTS.get(service, DEFAULT_ATTEMPTS)))
    return Config(
        retries={"mode": RETRY_MODES.get(service, DEFAULT_RETRY_MODE), "total_max_attempts": max(1, attempts)},
        connect_timeout=_env_float("ZERO_AWS_CONNECT_TIMEOUT_S", 10.0),
        read_timeout=_env_float("ZERO_AWS_READ_TIMEOUT_S", 60.0),
        max_pool_connections=S3_POOL if service == "s3" else 10,
        tcp_keepalive=True,
    )


def _credentials_key(access_key: str | None, secret_key: str | None) -> str:
    """Which credentials a client was made with, as a digest (no secret is kept in a dict key)."""
    names = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE")
    material = "\0".join([access_key or "", secret_key or "", *(os.environ.get(n, "") for n in names)])
    return hashlib.sha256(material.encode()).hexdigest()[:16]


def client(
    service: str,
    *,
    region: str | None = None,
    endpoint_url: str | None = None,
    access_key: str | None = None,
    secret_key: str | None = None,
    max_attempts: int | None = None,
):
    """The process's shared boto3 client for `service` (thread-safe to use from many threads)."""
    credentials = _credentials_key(access_key, secret_key)
    attempts, *timeouts = (
        os.environ.get(f"ZERO_AWS_{n}") for n in ("MAX_ATTEMPTS", "CONNECT_TIMEOUT_S", "READ_TIMEOUT_S")
    )
    key = (os.getpid(), service, region, endpoint_url or None, credentials, max_attempts or attempts, *timeouts)
    found = _clients.get(key)
    if found is not None:
        return found
    with _lock:
        found = _clients.get(key)
        if found is None:
            # One session per process and credentials: a boto3 Session caches the credentials it resolved first.
            session_key = (os.getpid(), credentials)
            session = _sessions.get(session_key) or _sessions.setdefault(session_key, _new_session())
            explicit = {"aws_access_key_id": access_key, "aws_secret_access_key": secret_key} if access_key else {}
            found = session.client(
                service,
                region_name=region,
                endpoint_url=endpoint_url or None,
                config=client_config(service, max_attempts),
                **explicit,
            )
            _clients[key] = found
    return found


def _new_session():
    """A boto3 session whose clients parse timestamps with `aws_timestamps`, not dateutil (most of a LIST's CPU)."""
    import boto3
    import botocore.session

    from .aws_timestamps import parse_aws_timestamp

    core = botocore.session.get_session()
    core.get_component("response_parser_factory").set_parser_defaults(timestamp_parser=parse_aws_timestamp)
    return boto3.session.Session(botocore_session=core)


def endpoint_of(aws_client) -> str:
    return getattr(getattr(aws_client, "meta", None), "endpoint_url", None) or "the AWS endpoint"


def _chain(error: BaseException):
    """The error and what it wraps: boto3's upload/download errors hide the botocore error inside."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = getattr(error, "last_exception", None) or error.__cause__ or error.__context__


def is_retryable(error: BaseException) -> bool:
    """Throttling, 5xx, connection and timeout errors, and errors while reading a response body."""
    import socket

    from botocore.exceptions import ClientError, ConnectionError, HTTPClientError, IncompleteReadError
    from urllib3.exceptions import HTTPError as Urllib3Error

    transient = (ConnectionError, HTTPClientError, IncompleteReadError, Urllib3Error, socket.timeout)
    for item in _chain(error):
        if isinstance(item, ClientError):
            code = item.response.get("Error", {}).get("Code", "")
            status = item.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
            return code in RETRYABLE_CODES or status >= 500 or status == 429
        if isinstance(item, (*transient, ConnectionResetError, BrokenPipeError)):
            return True
    return False


def retry_call(call: Callable[[], T], *, what: str, endpoint: str, window_s: float | None = None) -> T:
    """`call()` again after retryable errors, with capped exponential back-off, for up to the retry
    window; then `AwsUnavailableError` naming `what` and `endpoint`. Only for idempotent calls."""
    window = _env_float("ZERO_AWS_RETRY_WINDOW_S", RETRY_WINDOW_S) if window_s is None else window_s
    started = time.monotonic()
    delay, tries = FIRST_DELAY_S, 0
    while True:
        tries += 1
        try:
            return call()
        except Exception as error:  # noqa: BLE001 - re-raised unless is_retryable says it is transient
            if not is_retryable(error):
                raise
            elapsed = time.monotonic() - started
            if elapsed + delay > window:
                raise AwsUnavailableError(
                    f"{what} failed at {endpoint} for {elapsed:.0f}s ({tries} tries, retry window {window:.0f}s): "
                    f"{type(error).__name__}: {error}. The endpoint is unreachable, throttling or failing; rerun once "
                    f"it answers (outputs are published manifest last, so nothing half-written is trusted), or raise "
                    f"ZERO_AWS_RETRY_WINDOW_S."
                ) from error
            log.warning("%s at %s: %s: %s; retrying in %.1fs", what, endpoint, type(error).__name__, error, delay)
            time.sleep(delay * random.uniform(0.8, 1.2))
            delay = min(delay * 2, MAX_DELAY_S)


class Backoff:
    """Back-off for a poll loop that must never give up (log tails, Pipes message readers):
    `ready()` says whether to call now; `failed()` after a transient error, `succeeded()` after a call that worked."""

    def __init__(self, first_s: float = 1.0, max_s: float = 60.0) -> None:
        self._first, self._max = first_s, max_s
        self._delay = self._resume_at = 0.0
        self._last_failure, self.failures = None, 0

    def ready(self) -> bool:
        return time.monotonic() >= self._resume_at

    def failed(self) -> float:
        self.failures += 1
        self._last_failure = time.monotonic()
        self._delay = min(self._max, self._delay * 2 if self._delay else self._first)
        self._resume_at = time.monotonic() + self._delay * random.uniform(0.8, 1.2)
        return self._delay

    def succeeded(self) -> None:
        self._delay = self._resume_at = 0.0

    def quiet_for(self) -> float:
        """Seconds since the last transient error (infinite when there was none)."""
        return float("inf") if self._last_failure is None else time.monotonic() - self._last_failure
