"""Run a function over many items in worker processes, with a time limit per item.

Image decoders are C code fed untrusted bytes: one file can hang a decoder or crash the process.
Each worker handles one item at a time over its own pipe; when an item passes its deadline or its
worker dies, that worker is killed and replaced and the item comes back as `WorkerLost`, so one bad
file costs one verdict, never the pass. A MemoryError costs one verdict too (`too_large`): the item
needed more memory than the worker has. Any other Python exception in the function is a bug, not a
bad file: it stops the pass with the item named.
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from types import ModuleType
from typing import Any

log = logging.getLogger("zero.pool")

STARTUP_TIMEOUT_S = 120.0  # a worker that cannot even import its modules in this long is a broken environment


@dataclass(frozen=True)
class WorkerLost:
    """The item's worker hung past the deadline (`timeout`) or died (`crash`)."""

    reason: str  # "timeout", "crash" or "too_large" (out of memory)
    detail: str


class TaskRaised(RuntimeError):
    """The function raised inside a worker; the message holds the item and the worker's traceback."""


def _serve(conn: Connection, function: Callable[[Any], Any]) -> None:
    """Worker loop: receive an item, send back ("ok", result) or ("raised", traceback)."""
    conn.send(("ready", None))
    while True:
        try:
            item = conn.recv()
        except EOFError:  # the parent is gone
            return
        if item is None:
            return
        try:
            conn.send(("ok", function(item)))
        except MemoryError:
            # One file's fault, not a bug; the worker ends (its heap may be in pieces) and is replaced.
            conn.send(("out_of_memory", None))
            return
        except Exception:  # noqa: BLE001 - sent to the parent, which fails the pass with it
            conn.send(("raised", traceback.format_exc()))


class _Worker:
    def __init__(self, context: Any, function: Callable[[Any], Any]) -> None:
        self.conn, child_conn = context.Pipe(duplex=True)
        self.process = context.Process(target=_serve, args=(child_conn, function), daemon=True)
        self.process.start()
        child_conn.close()
        self.item: Any = None
        self.deadline = 0.0

    def wait_ready(self) -> None:
        if not self.conn.poll(STARTUP_TIMEOUT_S):
            self.kill()
            raise RuntimeError(f"a worker process did not start within {STARTUP_TIMEOUT_S:.0f} s")
        try:
            status, _ = self.conn.recv()
        except EOFError:
            raise RuntimeError(
                f"a worker process died while starting ({self.death_detail()}); its traceback is on stderr above"
            ) from None
        if status != "ready":
            raise RuntimeError(f"worker sent {status!r} before 'ready'")

    def assign(self, item: Any, timeout_s: float) -> None:
        self.item, self.deadline = item, time.monotonic() + timeout_s
        self.conn.send(item)

    def kill(self) -> None:
        self.process.kill()  # SIGKILL: a decoder stuck in C code may never return to handle SIGTERM
        self.process.join()
        self.conn.close()

    def death_detail(self) -> str:
        self.process.join(5)
        code = self.process.exitcode
        if code is not None and code < 0:
            return f"worker killed by {signal.Signals(-code).name}"
        return f"worker exited with code {code}"


def _main_module_imports() -> list[str]:
    """The modules the parent's `__main__` imported.

    Every spawn or forkserver worker re-runs the parent's `__main__` (that is how children resolve
    pickled functions), so a `python -m job` parent would make each worker, and each replacement,
    import pandas and friends again. With those imports loaded once in the forkserver, the re-run
    only defines the script's functions.
    """
    names = set()
    for value in vars(sys.modules["__main__"]).values():
        name = value.__name__ if isinstance(value, ModuleType) else getattr(value, "__module__", None)
        if isinstance(name, str) and name in sys.modules and not name.startswith("__"):
            names.add(name)
    return sorted(names)


class IsolatedPool:
    """`with IsolatedPool(fn, workers=4, timeout_s=20) as pool: for item, result in pool.imap_unordered(items): ...`

    `fn` must be picklable (a module-level function or a functools.partial of one). `preload` names
    modules the forkserver imports once, so starting or replacing a worker is a cheap fork. The
    forkserver starts with the interpreter's default sys.path (Python 3.11 does not pass the parent's
    on), so a preload must come from an installed package or the working folder; one that cannot be
    imported there is imported by each worker instead: correct, only slower.
    """

    def __init__(
        self, function: Callable[[Any], Any], workers: int, timeout_s: float, preload: Sequence[str] = ()
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.function, self.workers, self.timeout_s = function, workers, timeout_s
        # forkserver, not fork: workers must not inherit the parent's threads and locks.
        self._context = multiprocessing.get_context("forkserver")
        self._context.set_forkserver_preload([*preload, *_main_module_imports()])
        self._pool: list[_Worker] = []
        self.replaced = 0

    def __enter__(self) -> IsolatedPool:
        self._pool = [_Worker(self._context, self.function) for _ in range(self.workers)]
        for worker in self._pool:
            worker.wait_ready()
        return self

    def __exit__(self, *exc: Any) -> None:
        for worker in self._pool:
            if worker.item is None and worker.process.is_alive():
                worker.conn.send(None)
                worker.process.join(5)
            if worker.process.is_alive():
                worker.kill()
        self._pool = []

    def imap_unordered(self, items: Iterable[Any]) -> Iterator[tuple[Any, Any]]:
        """Yield (item, result) as results arrive; result is a `WorkerLost` for a hung or crashed item."""
        todo = iter(items)
        busy: list[_Worker] = []
        for worker in list(self._pool):
            if assigned := self._assign_next(worker, todo):
                busy.append(assigned)
        while busy:
            nearest = min(worker.deadline for worker in busy)
            waitables = [w.conn for w in busy] + [w.process.sentinel for w in busy]
            ready = set(wait(waitables, timeout=max(0.0, nearest - time.monotonic())))
            now = time.monotonic()
            for worker in list(busy):
                item = worker.item
                if worker.conn in ready or worker.process.sentinel in ready:
                    outcome = self._receive(worker)
                elif now >= worker.deadline:
                    worker.kill()
                    outcome = WorkerLost("timeout", f"no result within {self.timeout_s:g} s; worker killed")
                else:
                    continue
                busy.remove(worker)
                if isinstance(outcome, WorkerLost):
                    worker = self._replace(worker)
                worker.item = None
                yield item, outcome
                if assigned := self._assign_next(worker, todo):
                    busy.append(assigned)
        assert not busy

    def _receive(self, worker: _Worker) -> Any:
        try:
            status, payload = worker.conn.recv()
        except (EOFError, ConnectionError):
            detail = worker.death_detail()
            worker.kill()
            return WorkerLost("crash", detail)
        if status == "out_of_memory":
            worker.kill()
            return WorkerLost(
                "too_large", "MemoryError while decoding: it needs more memory than a worker has; worker replaced"
            )
        if status == "raised":
            raise TaskRaised(f"{worker.item!r}: the worker function raised (a bug, not a bad input):\n{payload}")
        return payload

    def _replace(self, dead: _Worker) -> _Worker:
        fresh = _Worker(self._context, self.function)
        fresh.wait_ready()
        self._pool[self._pool.index(dead)] = fresh
        self.replaced += 1
        log.warning("replaced a lost worker (it was on %r)", dead.item)
        return fresh

    def _assign_next(self, worker: _Worker, todo: Iterator[Any]) -> _Worker | None:
        """Give `worker` the next item; returns the worker that took it, or None when none are left."""
        for item in todo:
            if not worker.process.is_alive():  # died while idle (e.g. the OOM killer): not this item's fault
                worker = self._replace(worker)
            worker.assign(item, self.timeout_s)
            return worker
        return None
