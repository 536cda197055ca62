"""One read of a poll loop that must never give up (the job log tail, the Pipes message readers).

Skipped (answering `when_refused`) while backing off; a transient error is logged and grows the
back-off, any other is raised.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from training_code.lib.aws_clients import Backoff, is_retryable

T = TypeVar("T")
log = logging.getLogger("zero.sagemaker")


def guarded_read(backoff: Backoff, read: Callable[[], T], when_refused: T, where: str) -> T:
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
