"""The worker side of `IsolatedPool`: a process that runs the function over the batches it receives,
writing each item's position and start time to memory it shares with the parent (`Worker.step`)."""

from __future__ import annotations

import pickle
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from multiprocessing.connection import Connection
from types import ModuleType
from typing import Any

from threadpoolctl import threadpool_limits

STARTUP_TIMEOUT_S = 120.0  # a worker that cannot even import its modules in this long is a broken environment
# Shared progress: 2 * position + 1 while that item runs, + 2 once done, and since when (CLOCK_MONOTONIC).
_STEP, _SINCE = 0, 1


def serve(conn: Connection, function: Callable[[Any], Any], progress: Any) -> None:
    """Worker loop: receive a batch, send ('ok', None, results), or (status, position, payload) on a failure."""
    # One thread per worker (a worker per core): OpenBLAS would spin a thread per core even for small products.
    threadpool_limits(1)
    conn.send(("ready", None))
    while True:
        try:
            batch = conn.recv()
        except EOFError:  # the parent is gone
            return
        if batch is None:
            return
        results = []
        for position, item in enumerate(batch):
            progress[_SINCE] = time.monotonic()
            progress[_STEP] = 2 * position + 1
            try:
                results.append(function(item))
            except MemoryError:
                # One file's fault, not a bug; the worker ends (its heap may be in pieces) and is replaced.
                conn.send(("out_of_memory", position, results))
                return
            except Exception:  # noqa: BLE001 - sent to the parent, which fails the pass with it
                conn.send(("raised", position, traceback.format_exc()))
                break
            progress[_SINCE] = time.monotonic()
            progress[_STEP] = 2 * position + 2
        else:
            try:
                conn.send(("ok", None, results))
            except Exception:  # noqa: BLE001 - a result that cannot be sent (not picklable) is a bug too
                conn.send(("raised", None, traceback.format_exc()))


class Worker:
    """The parent's handle on one worker process: its pipe, the progress it shares, the batch it holds."""

    def __init__(self, context: Any, function: Callable[[Any], Any], rerun_main: bool) -> None:
        self.conn, child_conn = context.Pipe(duplex=True)
        self.progress = context.RawArray("d", 2)
        self.process = context.Process(target=serve, args=(child_conn, function, self.progress), daemon=True)
        with nullcontext() if rerun_main else main_not_rerun():
            self.process.start()
        child_conn.close()
        self.batch: list[Any] = []
        self.assigned_at = 0.0
        self.ready = False

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
        self.ready = True

    def assign(self, batch: list[Any]) -> None:
        self.progress[_SINCE], self.progress[_STEP] = time.monotonic(), 0.0
        self.batch, self.assigned_at = batch, time.monotonic()
        self.conn.send(batch)

    def step(self) -> tuple[int, float]:
        """(step, since) of the shared progress, read consistently while the worker writes it."""
        while True:
            step, since = self.progress[_STEP], self.progress[_SINCE]
            if self.progress[_STEP] == step:
                return int(step), since

    def running(self) -> int | None:
        """The position in its batch of the item the worker is on; None between items."""
        step, _ = self.step()
        return (step - 1) // 2 if step % 2 else None

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


def names_main(function: Callable[[Any], Any]) -> bool:
    """Whether `function`, pickled, refers to the parent's `__main__` (a function a script defines)."""
    return b"__main__" in pickle.dumps(function)


@contextmanager
def main_not_rerun() -> Iterator[None]:
    """While a worker starts, hide the parent's `__main__` so forkserver children do not re-run it."""
    main = sys.modules["__main__"]
    saved = {name: vars(main)[name] for name in ("__spec__", "__file__") if name in vars(main)}
    main.__spec__ = None
    vars(main).pop("__file__", None)
    try:
        yield
    finally:
        vars(main).update(saved)


def main_module_imports() -> list[str]:
    """The modules the parent's `__main__` imported, to preload in the forkserver."""
    names = set()
    for value in vars(sys.modules["__main__"]).values():
        name = value.__name__ if isinstance(value, ModuleType) else getattr(value, "__module__", None)
        if isinstance(name, str) and name in sys.modules and not name.startswith("__"):
            names.add(name)
    return sorted(names)
