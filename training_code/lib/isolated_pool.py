"""Run a function over many items in worker processes, with a time limit per item.

Image decoders are C code fed untrusted bytes: one file can hang a decoder or crash the process.
Each worker takes a batch of items at a time over its own pipe and sends the batch's results back in
one message; before each item it writes the item's position and start time to memory it shares with
the parent, so the parent enforces the time limit per item, not per batch, without a message per
item. When an item passes its deadline or its worker dies, that worker is killed and replaced, the
item comes back as `WorkerLost`, and the rest of its batch (done or not: those results died with the
worker) is handed out again, so one bad file costs one verdict, never the pass. A MemoryError costs
one verdict too (`too_large`): the item needed more memory than the worker has. Any other Python
exception in the function is a bug, not a bad file: it stops the pass with the item named.

Batches are sized from the time items have taken so far (about `BATCH_S` of work each, at most
`MAX_BATCH` items) and shrink at the end, so the last items are spread over every worker: on small
files a pipe round trip per file cost more than the decode itself.
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
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any

from .pool_worker import Worker, main_module_imports, names_main

log = logging.getLogger("zero.pool")

# The work a batch aims at: long enough that a message is cheap next to it, short enough to balance.
# 0.1 s, not 0.02: on 20,000 small JPEGs (2 workers) a fifth of the round trips cut the pass's CPU and
# wall time by 1-2% (interleaved runs); a lost worker's batch, decoded again, is still a tenth of a second.
BATCH_S = 0.1
MAX_BATCH = 256
MAX_UNEXPLAINED_LOSSES = 8
BETWEEN_ITEMS_S = 30.0  # see IsolatedPool._limit_s
BLAS_THREADS_VARIABLE = "OPENBLAS_NUM_THREADS"  # numpy's wheels bundle OpenBLAS (scipy-openblas)


def start_forkserver(preload: Sequence[str]) -> None:
    """Start the forkserver the pools use now, importing `preload` (see IsolatedPool), and return at once:
    for a caller with other work before its pool starts, so the imports are done when the workers fork.
    A forkserver already running is kept, and so are its imports."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(preload))
    with _single_blas_thread_environment():
        multiprocessing.forkserver.ensure_running()


@contextmanager
def _single_blas_thread_environment() -> Iterator[None]:
    """While the forkserver starts, its environment asks OpenBLAS for one thread. Its workers compute on
    one thread each anyway (`pool_worker.serve`), but OpenBLAS reads the variable only as numpy loads,
    in the forkserver's preload, and otherwise starts a thread per core there that spins for work that
    never comes until the first fork: on the cores the parent needs just then, as it prepares the pass.
    The forkserver of a 20,000-image validation used 0.11 CPU-s instead of 0.18 (7 runs each, 2 cores).
    This process's own BLAS is loaded already and keeps its threads; the variable is put back at once."""
    saved = os.environ.get(BLAS_THREADS_VARIABLE)
    os.environ[BLAS_THREADS_VARIABLE] = "1"
    try:
        yield
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

    `fn` must be picklable (a module-level function or a functools.partial of one). `preload` names
    modules the forkserver imports once, so starting or replacing a worker is a cheap fork. The
    forkserver starts with the interpreter's default sys.path (Python 3.11 does not pass the parent's
    on), so a preload must come from an installed package or the working folder; one that cannot be
    imported there is imported by each worker instead: correct, only slower. A worker does not re-run
    the parent's `__main__` unless `fn` is the script's own (`main_not_rerun`). A batch holds about
    `batch_s` of work, at most `max_batch` items (1: one item at a time).
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
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
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
        """Starts the workers from a thread and returns at once: they get ready (the forkserver's
        imports, a fork each) while the caller prepares the items (a process start waits for the
        forkserver: the first, for all its imports); `wait_ready` or the first `imap_unordered` waits."""
        self._start_error = None
        # The forkserver starts here, in the caller's thread, if no earlier call started it: its
        # environment is set for it (see start_forkserver), never from the starting thread.
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
        """Wait for the starting thread; raise what stopped it, in the caller's thread."""
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
                # The worker's next batch first, then this one's results: whatever the caller does with
                # them, the worker is not left waiting for it.
                if assigned := self._assign_next(worker, todo):
                    busy.append(assigned)
                yield from ((batch[position], result) for position, result in outcomes)
        assert not todo

    def _wait_s(self, busy: list[Worker]) -> float:
        """Until the earliest deadline of the workers' states as they were when read, and no longer than
        `timeout_s`: a worker read between items may have started one since, whose limit is shorter."""
        nearest = min(since + self._limit_s(step) for step, since in (worker.step() for worker in busy))
        return max(0.0, min(nearest - time.monotonic(), self.timeout_s))

    def _limit_s(self, step: int) -> float:
        """The time limit of a worker's state: `timeout_s` while it runs an item (odd steps); between
        items (a batch handed over, not yet started, or results being sent) at least BETWEEN_ITEMS_S:
        that is the machine's scheduling, not an item's fault, and a loaded machine can take more than
        a short item limit to run a process that was just handed work."""
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
        """A worker lost outside any item leaves no verdict and its batch goes round again; fail rather
        than go round for ever when workers keep dying that way (the machine, not a file)."""
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
        """About `batch_s` of work by the time items took so far, and no more than an equal share of what
        is left, so no worker is still busy with a long batch when the others have run out."""
        if self._done:
            size = int(self.batch_s / max(self._done_s / self._done, 1e-6))
        else:
            size = 1  # nothing known yet: the first results size the next batches
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
