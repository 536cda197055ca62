"""The isolated pool hands out batches, and still one verdict per item with a time limit per item.

Real worker processes (forkserver), real hangs, segfaults and exits: a lost worker costs its item one
verdict, and the rest of its batch (whose results died with it) is handed out again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from functools import partial
from pathlib import Path

import numpy  # noqa: F401 - loaded before a worker runs blas_threads_here (see there)
import pytest
from threadpoolctl import threadpool_info

from training_code.lib.isolated_pool import IsolatedPool, WorkerLost


def record_and_misbehave(item: str, calls: str) -> str:
    """Appends the item to the `calls` file (one line per call, whichever worker made it), then hangs,
    crashes or exits when the item says so."""
    with open(calls, "a") as log:
        log.write(f"{item}\n")
    if item.startswith("hang"):
        time.sleep(600)
    if item.startswith("segfault"):
        os.kill(os.getpid(), signal.SIGSEGV)
    if item.startswith("exit"):
        os._exit(3)
    if item.startswith("slow"):
        time.sleep(0.3)
    return item.upper()


def calls_of(path: Path) -> list[str]:
    return path.read_text().split()


def test_small_items_go_out_in_batches_with_one_result_each(tmp_path):
    items = [f"item{n}" for n in range(2000)]
    with IsolatedPool(partial(record_and_misbehave, calls=str(tmp_path / "calls")), workers=2, timeout_s=5) as pool:
        results = list(pool.imap_unordered(items))
        batches = pool.batches
    assert sorted(item for item, _ in results) == sorted(items), "every item exactly once"
    assert all(result == item.upper() for item, result in results)
    assert sorted(calls_of(tmp_path / "calls")) == sorted(items), "nothing run twice when nothing was lost"
    assert batches < len(items) / 10, f"{batches} batches for {len(items)} quick items"


def test_a_worker_has_its_next_batch_before_its_results_reach_the_caller(tmp_path):
    # Whatever the caller does with a result (the validation pass records each verdict), the worker that
    # sent it is already on its next batch: one worker, one item a batch, so each hand-out is counted.
    items = [f"item{n}" for n in range(5)]
    record = partial(record_and_misbehave, calls=str(tmp_path / "calls"))
    with IsolatedPool(record, workers=1, timeout_s=5, max_batch=1) as pool:
        handed_out = [pool.batches for _ in pool.imap_unordered(items)]
    assert handed_out == [2, 3, 4, 5, 5], "the next batch goes out before a result is yielded"


def test_a_worker_that_cannot_start_is_raised_in_the_callers_thread():
    # Entering returns while the workers start, from a thread (the caller's work meanwhile is not held
    # up by the forkserver's imports); what stops a start (here: a function that cannot be pickled for
    # the worker) is raised where the caller first needs the workers, not lost with that thread.
    unpicklable = threading.Lock()
    with pytest.raises(TypeError, match="pickle"):
        with IsolatedPool(partial(record_and_misbehave, calls=unpicklable), workers=2, timeout_s=5) as pool:
            list(pool.imap_unordered(["a"]))


def test_a_crash_costs_its_item_one_verdict_and_the_rest_of_its_batch_goes_round_again(tmp_path):
    calls = tmp_path / "calls"
    items = ["first", "b", "segfault", "c", "d"]
    # One worker and long batches: "first" goes alone (nothing is known yet), then the other four together.
    with IsolatedPool(partial(record_and_misbehave, calls=str(calls)), workers=1, timeout_s=5, batch_s=60) as pool:
        results = dict(pool.imap_unordered(items))
        assert pool.replaced == 1 and pool.batches == 3
    assert results == {
        "first": "FIRST",
        "b": "B",
        "segfault": WorkerLost("crash", "worker killed by SIGSEGV"),
        "c": "C",
        "d": "D",
    }
    # b's result died with the worker, so b ran again; c and d had not started; the crash is not retried.
    assert calls_of(calls) == ["first", "b", "segfault", "b", "c", "d"]


def test_the_time_limit_is_per_item_not_per_batch(tmp_path):
    calls = tmp_path / "calls"
    # Eight items of 0.3 s in one batch take 2.4 s, past the 1 s limit; none of them passes it alone.
    items = ["first", *[f"slow{n}" for n in range(8)], "hang", "last"]
    started = time.monotonic()
    with IsolatedPool(partial(record_and_misbehave, calls=str(calls)), workers=1, timeout_s=1.0, batch_s=60) as pool:
        results = dict(pool.imap_unordered(items))
        assert pool.replaced == 1
    assert time.monotonic() - started < 10
    assert results.pop("hang") == WorkerLost("timeout", "no result within 1 s; worker killed")
    assert results == {item: item.upper() for item in items if item != "hang"}
    # The slow items' results died with the hung worker: they ran again; "last" had not started.
    assert [calls_of(calls).count(item) for item in items] == [1, *[2] * 8, 1, 1]


def test_workers_lost_between_batches_and_exits_are_each_one_verdict(tmp_path):
    calls = tmp_path / "calls"
    items = [f"ok{n}" for n in range(50)] + ["exit1", "segfault1"] + [f"more{n}" for n in range(50)] + ["exit2"]
    with IsolatedPool(partial(record_and_misbehave, calls=str(calls)), workers=2, timeout_s=5) as pool:
        results = dict(pool.imap_unordered(items))
        assert pool.replaced == 3
    lost = {item: result for item, result in results.items() if isinstance(result, WorkerLost)}
    assert lost == {
        "exit1": WorkerLost("crash", "worker exited with code 3"),
        "exit2": WorkerLost("crash", "worker exited with code 3"),
        "segfault1": WorkerLost("crash", "worker killed by SIGSEGV"),
    }
    assert len(results) == len(items)
    assert all(calls_of(calls).count(item) == 1 for item in lost), "a lost item is never run again"


def test_a_worker_the_machine_has_not_run_yet_is_not_timed_out(tmp_path):
    """A worker handed a batch it has not started after the item limit has not hung on an item: the
    machine has not run it yet (a loaded one can take that long). Here the worker is stopped (SIGSTOP)
    before its batch arrives and resumed 3 s later, three times the 1-s limit: it keeps its batch."""
    calls = tmp_path / "calls"
    with IsolatedPool(partial(record_and_misbehave, calls=str(calls)), workers=1, timeout_s=1.0) as pool:
        pool.wait_ready()
        (pid,) = pool.worker_pids()
        os.kill(pid, signal.SIGSTOP)
        resume = threading.Timer(3.0, os.kill, (pid, signal.SIGCONT))
        resume.start()
        started = time.monotonic()
        try:
            results = dict(pool.imap_unordered(["a", "b"]))
        finally:
            resume.join()
        assert pool.replaced == 0, "the stopped worker was killed as if it had hung"
        assert pool.worker_pids() == [pid]
    assert time.monotonic() - started >= 2.5, "the batch was run while the worker was stopped"
    assert results == {"a": "A", "b": "B"}
    assert calls_of(calls) == ["a", "b"]


SCRIPT = """
import sys
from pathlib import Path

from training_code.lib.isolated_pool import IsolatedPool

with open(sys.argv[2], "a") as runs:  # one line each time this module's body runs, in any process
    runs.write("ran\\n")


def shout(item):
    return item.upper()


if __name__ == "__main__":
    function = shout if sys.argv[1] == "own" else len
    with IsolatedPool(function, workers=2, timeout_s=20) as pool:
        print(sorted(result for _, result in pool.imap_unordered(["ab", "cde", "f"])))
"""


def test_workers_do_not_rerun_the_parents_main_unless_the_function_is_its_own(tmp_path):
    """A job's `python -m` main imports pandas and friends; a worker running a library function must
    not run that main again (nor the forkserver import what it imports). A function the script
    defines still resolves in the workers, which then do run it."""
    (tmp_path / "pool_script.py").write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(Path(__file__).resolve().parents[2])])}
    for function, expected, runs in (("library", "[1, 2, 3]", 1), ("own", "['AB', 'CDE', 'F']", 3)):
        log = tmp_path / f"runs-{function}"
        result = subprocess.run(
            [sys.executable, "-m", "pool_script", function, str(log)], env=env, capture_output=True, text=True
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == expected
        assert calls_of(log) == ["ran"] * runs, f"{function}: the script's body ran {len(calls_of(log))} times"


def blas_threads_here(_: object) -> int:
    """numpy's BLAS threads in this process (numpy is loaded with this module: before the worker runs)."""
    [blas] = [library for library in threadpool_info() if library["user_api"] == "blas"]
    return blas["num_threads"]


ONE_THREAD_SCRIPT = """
import sys
from training_code.lib.isolated_pool import IsolatedPool
from test_isolated_pool import blas_threads_here
preload = ["numpy"] if sys.argv[1] == "numpy-preloaded" else []  # the forkserver's own OpenBLAS, or none
with IsolatedPool(blas_threads_here, workers=2, timeout_s=60, max_batch=1, preload=preload) as pool:
    print(sorted(result for _, result in pool.imap_unordered(range(4))), blas_threads_here(None))
"""


def test_workers_compute_on_one_thread_and_leave_the_parents_setting_alone():
    """A pool has a worker per core: a BLAS thread pool per worker spun on the cores the others needed
    (twice the CPU a file). Workers compute on one thread whether numpy loaded in the forkserver or in
    the worker; the parent, and what it starts later (torchrun), keep one per core. In a fresh
    interpreter each: the forkserver is one per process, set up by its first pool."""
    if os.cpu_count() == 1:
        pytest.skip("one core: numpy's default is one BLAS thread already, so this could not fail")
    env = {key: value for key, value in os.environ.items() if not key.endswith("_NUM_THREADS")}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), str(Path(__file__).resolve().parents[2])])
    for case in ("numpy-preloaded", "numpy-in-the-worker"):
        result = subprocess.run(
            [sys.executable, "-c", ONE_THREAD_SCRIPT, case], env=env, capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == ["[1,", "1,", "1,", "1]", str(os.cpu_count())], (case, result.stdout)


FORKSERVER_SCRIPT = """
import os, time
from multiprocessing import forkserver
from training_code.lib.isolated_pool import start_forkserver
start_forkserver(["numpy"])
server = forkserver._forkserver._forkserver_pid
deadline = time.monotonic() + 60
while "openblas" not in open(f"/proc/{server}/maps").read():  # numpy's BLAS not loaded in it yet
    assert time.monotonic() < deadline, "the forkserver did not load numpy in a minute"
    time.sleep(0.01)
time.sleep(0.5)  # OpenBLAS starts its threads as it loads
print(len(os.listdir(f"/proc/{server}/task")), os.environ.get("OPENBLAS_NUM_THREADS", "unset"))
"""


@pytest.mark.parametrize("parents_setting", [None, "3"])
def test_the_forkserver_starts_no_blas_threads_and_the_parents_environment_stays(parents_setting):
    """numpy loaded in the forkserver (its preload) would start OpenBLAS's thread per core there: idle
    threads that spin for work until its first fork, on the cores the pass needs as it starts. The
    forkserver asks for one; the parent's environment, whatever it holds, is as it was. (Read before
    any worker starts: OpenBLAS stops its threads in a process that forks.)"""
    if os.cpu_count() == 1:
        pytest.skip("one core: OpenBLAS starts no threads of its own, so this could not fail")
    env = {key: value for key, value in os.environ.items() if not key.endswith("_NUM_THREADS")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    if parents_setting is not None:
        env["OPENBLAS_NUM_THREADS"] = parents_setting
    result = subprocess.run(
        [sys.executable, "-c", FORKSERVER_SCRIPT], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1", parents_setting or "unset"], result.stdout
