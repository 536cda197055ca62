"""Every benchmark module imports: `make bench` is outside the suite, so a moved name would go unnoticed."""

import importlib
import pkgutil

import pytest

import benchmarks

MODULES = sorted(m.name for m in pkgutil.iter_modules(benchmarks.__path__) if not m.name.startswith("__"))


def test_the_benchmarks_are_found():
    assert len([name for name in MODULES if name.startswith("bench_")]) > 20, MODULES


@pytest.mark.parametrize("name", MODULES)
def test_a_benchmark_module_imports(name):
    importlib.import_module(f"benchmarks.{name}")
