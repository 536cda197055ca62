"""`python -m benchmarks [NAME ...]`: run every `bench_*.py` module (or the named ones) and print BENCH lines.

Each module exposes `run() -> list[BenchResult]`. Exit status 1 when any goal is missed.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path


def main(names: list[str]) -> int:
    modules = sorted(p.stem for p in Path(__file__).parent.glob("bench_*.py"))
    selected = [m for m in modules if not names or m.removeprefix("bench_") in names]
    if not selected:
        print(
            f"no benchmark matches {names}; available: {[m.removeprefix('bench_') for m in modules]}", file=sys.stderr
        )
        return 2
    missed = 0
    for module in selected:
        for result in importlib.import_module(f"benchmarks.{module}").run():
            print(result.line(), flush=True)
            missed += not result.met
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
