"""Shared fixtures: a tiny demo raw root, a real Dagster instance in a temp folder, resources on both."""

from pathlib import Path

import pytest
from dagster import instance_for_test

from zero_assets.demo_data import make_demo_raw_root
from zero_assets.resources import LocalJobRunner, ZeroSettings


@pytest.fixture(scope="session")
def tiny_demo(tmp_path_factory) -> dict:
    """A raw root with every planted bad case and 36 good images (read-only by convention).

    Returns make_demo_raw_root's summary: `out` (the root) and `planted` (bad case -> key).
    """
    return make_demo_raw_root(tmp_path_factory.mktemp("raw") / "root", images=36, seed=7)


@pytest.fixture(scope="session")
def tiny_raw_root(tiny_demo) -> Path:
    return Path(tiny_demo["out"])


@pytest.fixture
def instance(tmp_path):
    with instance_for_test(temp_dir=str(tmp_path)) as dagster_instance:
        yield dagster_instance


def make_resources(raw_uri: Path, state: Path) -> dict:
    (state / "fsx").mkdir(parents=True, exist_ok=True)
    settings = ZeroSettings(raw_uri=str(raw_uri), lake_uri=str(state / "lake"), fsx_mount=str(state / "fsx"))
    return {"settings": settings, "jobs": LocalJobRunner(settings=settings)}


@pytest.fixture
def resources(tiny_raw_root, tmp_path) -> dict:
    return make_resources(tiny_raw_root, tmp_path / "state")
