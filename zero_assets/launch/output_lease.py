"""One builder per output: a lease a second run of the same fingerprint waits on, on S3 beside an S3 output
(`s3_lease`, for any host), else a file on this machine (`FileLeaseStore`), renewed by a heartbeat thread."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from training_code.lib.aws_clients import AwsUnavailableError
from training_code.lib.storage import is_s3
from zero_assets.launch.lease_store import FileLeaseStore, Lease, LeaseStore, stale_after_s
from zero_assets.launch.s3_lease import OutputLeaseError, S3LeaseStore

log = logging.getLogger("zero.lease")


def lease_store(location: Path | str) -> LeaseStore:
    return S3LeaseStore(str(location)) if is_s3(str(location)) else FileLeaseStore(Path(location))


def try_acquire(
    location: Path | str, run_id: str, stale_after_s: float | None = None
) -> tuple[Lease | None, dict[str, Any] | None]:
    """Take the lease if it is free or its owner gone, else (None, the owner's record); nothing renews it here."""
    return lease_store(location).try_acquire(run_id, _stale(stale_after_s))


def live_holder(location: Path | str) -> dict[str, Any] | None:
    """The record of the run that holds the lease at `location` and is alive; None when none does."""
    return lease_store(location).holder(_stale(None))


@contextmanager
def hold_lease(
    location: Path | str,
    run_id: str,
    *,
    on_wait: Callable[[dict[str, Any]], None] = lambda record: None,
    heartbeat_s: float | None = None,
) -> Iterator[Lease]:
    """Hold the lease at `location` for the block, waiting (`on_wait(owner)`, once) while a live run holds it."""
    store, stale, waited_for = lease_store(location), _stale(None), None
    while True:
        lease, owner = store.try_acquire(run_id, stale)
        if lease is not None:
            break
        if waited_for is None:
            waited_for = str(owner.get("run_id", "unknown run"))
            on_wait(owner)
        time.sleep(store.poll_s)
    holding = [replace(lease, waited_for=waited_for)]  # the lease as last written; the heartbeat renews it
    stop = threading.Event()
    beat = threading.Thread(
        target=_heartbeat,
        args=(store, holding, stop, store.heartbeat_s if heartbeat_s is None else heartbeat_s),
        name="output-lease-heartbeat",
        daemon=True,
    )
    beat.start()
    try:
        yield holding[0]
    finally:
        stop.set()
        beat.join()
        if holding[0] is not None:
            _release(store, holding[0])


def _heartbeat(store: LeaseStore, holding: list[Lease | None], stop: threading.Event, interval: float) -> None:
    while not stop.wait(interval):
        try:
            holding[0] = store.renew(holding[0])
        except (AwsUnavailableError, OutputLeaseError, OSError) as error:
            # Still the owner as far as anyone knows: beat again next time.
            log.warning("could not renew the output lease %s: %s", store.location, error)
            continue
        if holding[0] is None:
            log.warning("the output lease %s was taken over: this run was judged gone", store.location)
            return


def _release(store: LeaseStore, lease: Lease) -> None:
    """Release the lease; if its storage does not answer, leave it to go stale (never hiding the build's error)."""
    try:
        store.release(lease)
    except (AwsUnavailableError, OutputLeaseError, OSError) as error:
        log.warning("could not release the output lease %s (%s): it is taken over once stale", store.location, error)


def _stale(given: float | None) -> float:
    return stale_after_s() if given is None else given
