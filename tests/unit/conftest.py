"""Unit tests start no process: a test that needs a job, a server or a run belongs in another tier."""

import multiprocessing.process
import subprocess

import pytest


@pytest.fixture(autouse=True)
def no_processes(monkeypatch):
    def refuse(*args, **kwargs):
        raise RuntimeError("tests/unit start no process: move this test to tests/jobs, tests/dagster or tests/e2e")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse)
