"""Run a function over many items in worker processes, with a time limit per item.

For untrusted bytes fed to C decoders: an item that hangs or kills its worker comes back as a
`WorkerLost` (a MemoryError as `too_large`) and its worker is replaced; any other exception in the
function is a bug and stops the pass (`TaskRaised`). Workers take items in batches sized by time.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import multiprocessing.forkserver
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any

from .pool_worker import Worker, main_module_imports, names_main

log = logging.getLogger("zero.pool")

# The work a batch aims at: long enough that a message is cheap next to it, short enough to balance.
BATCH_S = 0.1
MAX_BATCH = 256
MAX_UNEXPLAINED_LOSSES = 8
BETWEEN_ITEMS_S = 30.0  # see IsolatedPool._limit_s
BLAS_THREADS_VARIABLE = "OPENBLAS_NUM_THREADS"  # numpy's wheels bundle OpenBLAS (scipy-openblas)


def start_forkserver(preload: Sequence[str]) -> None:
    """Start the pools' forkserver now, importing `preload`, and return at once, so the imports are done
    by the time workers fork. A forkserver already running is kept, with its imports."""
    multiprocessing.get_context("forkserver").set_forkserver_preload(list(preload))
    # One OpenBLAS thread in the forkserver: it reads the variable only as numpy loads, and would otherwise
    # spin a thread per core there. The variable is put back at once.
    saved = os.environ.get(BLAS_THREADS_VARIABLE)
    os.environ[BLAS_THREADS_VARIABLE] = "1"
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        if saved is None:
            del os.environ[BLAS_THREADS_VARIABLE]
        else:
            os.environ[BLAS_THREADS_VARIABLE] = saved


@dataclass(frozen=True)
class WorkerLost:
    """The item's worker hung past the deadline (`timeout`) or died (`crash`)."""

    reason: str  # "timeout", "crash" or "too_large" (out of memory)
    detail: str


class TaskRaised(RuntimeError):
    """The function raised inside a worker; the message holds the item and the worker's traceback."""


class IsolatedPool:
    """`with IsolatedPool(fn, workers=4, timeout_s=20) as pool: for item, result in pool.imap_unordered(items): ...`

    `fn` must be picklable. `preload`: modules the forkserver imports once (with the default sys.path; one it
    cannot import there each worker imports). A batch holds about `batch_s` of work, at most `max_batch` items.
    """

    def __init__(
        self,
        function: Callable[[Any], Any],
        workers: int,
        timeout_s: float,
        preload: Sequence[str] = (),
        max_batch: int = MAX_BATCH,
        batch_s: float = BATCH_S,
    ) -> None:
        for name, value in (("workers", workers), ("timeout_s", timeout_s), ("max_batch", max_batch)):
            if value <= 0:
                raise ValueError(f"{name} must be {'positive' if name == 'timeout_s' else 'at least 1'}, got {value}")
        self.function, self.workers, self.timeout_s = function, workers, timeout_s
        self.max_batch, self.batch_s = max_batch, batch_s
        # forkserver, not fork: workers must not inherit the parent's threads and locks.
        self._context = multiprocessing.get_context("forkserver")
        self._rerun_main = names_main(function)
        self._preload = [*preload, *(main_module_imports() if self._rerun_main else [])]
        self._pool: list[Worker] = []
        self._starter: threading.Thread | None = None
        self._start_error: BaseException | None = None
        self.replaced = 0
        self.batches = 0  # batches handed out, retried ones included
        self._done, self._done_s = 0, 0.0  # items finished and the batch time they took: the batch size
        self._losses_in_a_row = 0  # workers lost with no item to blame since the last batch that came back

    def __enter__(self) -> IsolatedPool:
        """Start the workers from a thread and return at once, so they get ready while the caller
        prepares the items; `wait_ready` or the first `imap_unordered` waits for them."""
        self._start_error = None
        # Start the forkserver from the caller's thread: its environment is set for it (start_forkserver).
        start_forkserver(self._preload)
        self._starter = threading.Thread(target=self._start_workers, name="isolated-pool-start", daemon=True)
        self._starter.start()
        return self

    def _start_workers(self) -> None:
        try:
            for _ in range(self.workers):
                self._pool.append(Worker(self._context, self.function, self._rerun_main))
        except BaseException as error:  # noqa: BLE001 - raised in the caller's thread by _started
            self._start_error = error

    def _started(self) -> None:
        """Wait for the starting thread; raise what stopped it in the caller's thread."""
        if self._starter is not None:
            self._starter.join()
            self._starter = None
        if self._start_error is not None:
            raise self._start_error

    def wait_ready(self) -> None:
        self._started()
        for worker in self._pool:
            if not worker.ready:
                worker.wait_ready()

    def worker_pids(self) -> list[int]:
        """The process ids of the workers now in the pool (a replaced worker's is gone)."""
        self._started()
        return [worker.process.pid for worker in self._pool]

    def __exit__(self, *exc: Any) -> None:
        if self._starter is not None:
            self._starter.join()
            self._starter = None
        for worker in self._pool:
            if worker.ready and not worker.batch and worker.process.is_alive():
                worker.conn.send(None)
                worker.process.join(5)
            if worker.process.is_alive():
                worker.kill()
        self._pool = []

    def imap_unordered(self, items: Iterable[Any]) -> Iterator[tuple[Any, Any]]:
        """Yield (item, result) as results arrive; result is a `WorkerLost` for a hung or crashed item."""
        todo = deque(items)
        self.wait_ready()
        busy: list[Worker] = []
        for worker in list(self._pool):
            if assigned := self._assign_next(worker, todo):
                busy.append(assigned)
        while busy:
            ready = set(wait([w.conn for w in busy] + [w.process.sentinel for w in busy], self._wait_s(busy)))
            for worker in list(busy):
                if worker.conn in ready or worker.process.sentinel in ready:
                    outcomes, lost = self._receive(worker)
                elif (overdue := self._overdue(worker)) is not None:
                    outcomes, lost = self._time_out(worker, overdue), True
                else:
                    continue
                busy.remove(worker)
                batch, worker.batch = worker.batch, []
                if lost:
                    self._count_loss(bool(outcomes), batch)
                    worker = self._replace(worker, batch)
                    returned = {position for position, _ in outcomes}  # the rest of the batch goes round again
                    todo.extendleft(reversed([item for n, item in enumerate(batch) if n not in returned]))
                # Hand the worker its next batch before yielding, so it does not wait on the caller.
                if assigned := self._assign_next(worker, todo):
                    busy.append(assigned)
                yield from ((batch[position], result) for position, result in outcomes)
        assert not todo

    def _wait_s(self, busy: list[Worker]) -> float:
        """Seconds until the earliest deadline, at most `timeout_s`: a worker read between items may
        have started one since."""
        nearest = min(since + self._limit_s(step) for step, since in (worker.step() for worker in busy))
        return max(0.0, min(nearest - time.monotonic(), self.timeout_s))

    def _limit_s(self, step: int) -> float:
        """The time limit of a worker's state: `timeout_s` while it runs an item (odd steps); between
        items at least BETWEEN_ITEMS_S, since a delay there is the machine's scheduling, not an item's."""
        return self.timeout_s if step % 2 else max(self.timeout_s, BETWEEN_ITEMS_S)

    def _overdue(self, worker: Worker) -> int | None:
        """The position of the item past its deadline, -1 when the worker is stuck between items, or
        None when nothing is overdue."""
        step, since = worker.step()
        if time.monotonic() < since + self._limit_s(step):
            return None
        return (step - 1) // 2 if step % 2 else -1

    def _time_out(self, worker: Worker, position: int) -> list[tuple[int, Any]]:
        worker.kill()
        if position < 0 or worker.running() != position:  # it moved on just as the deadline came: no verdict
            return []
        return [(position, WorkerLost("timeout", f"no result within {self.timeout_s:g} s; worker killed"))]

    def _receive(self, worker: Worker) -> tuple[list[tuple[int, Any]], bool]:
        """The (position, result) pairs of a worker that sent or died, and whether it died."""
        try:
            status, position, payload = worker.conn.recv()
        except (EOFError, ConnectionError):
            detail = worker.death_detail()
            worker.kill()
            culprit = worker.running()  # what it was on when it died; None between items
            return ([] if culprit is None else [(culprit, WorkerLost("crash", detail))]), True
        if status == "raised":
            what = repr(worker.batch[position]) if position is not None else f"a result of {worker.batch!r}"
            raise TaskRaised(f"{what}: the worker function raised (a bug, not a bad input):\n{payload}")
        if status == "out_of_memory":
            worker.kill()
            lost = WorkerLost(
                "too_large", "MemoryError while decoding: it needs more memory than a worker has; worker replaced"
            )
            return [*enumerate(payload), (position, lost)], True
        self._done += len(payload)
        self._done_s += time.monotonic() - worker.assigned_at
        self._losses_in_a_row = 0
        return list(enumerate(payload)), False

    def _count_loss(self, attributed: bool, batch: list[Any]) -> None:
        """Fail when workers keep dying outside any item (the machine, not a file), rather than retry
        their batches for ever."""
        self._losses_in_a_row = 0 if attributed else self._losses_in_a_row + 1
        if self._losses_in_a_row > MAX_UNEXPLAINED_LOSSES:
            raise RuntimeError(
                f"{self._losses_in_a_row} workers in a row died between items (the last on a batch of "
                f"{len(batch)} from {batch[0]!r}); no item explains it: check the machine's memory and logs"
            )

    def _replace(self, dead: Worker, batch: list[Any]) -> Worker:
        fresh = Worker(self._context, self.function, self._rerun_main)
        fresh.wait_ready()
        self._pool[self._pool.index(dead)] = fresh
        self.replaced += 1
        log.warning("replaced a lost worker (it was on a batch of %d from %r)", len(batch), batch[0])
        return fresh

    def _batch_size(self, left: int) -> int:
        """About `batch_s` of work, and at most an equal share of what is left, so no worker is left with
        a long batch at the end."""
        # Nothing known yet: 1, and the first results size the next batches.
        size = int(self.batch_s / max(self._done_s / self._done, 1e-6)) if self._done else 1
        return max(1, min(size, self.max_batch, math.ceil(left / self.workers)))

    def _assign_next(self, worker: Worker, todo: deque[Any]) -> Worker | None:
        """Give `worker` the next batch; returns the worker that took it, or None when none are left."""
        if not todo:
            return None
        if not worker.process.is_alive():  # died while idle (e.g. the OOM killer): not this item's fault
            worker = self._replace(worker, [todo[0]])
        worker.assign([todo.popleft() for _ in range(self._batch_size(len(todo)))])
        self.batches += 1
        return worker
