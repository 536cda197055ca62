"""The index job script (training_code/index.py) as a real subprocess under the local job contract."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
from helpers.raw_index_reference import build_raw_index

REPO = Path(__file__).resolve().parents[2]


def run_index_job(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    # Not launched by Dagster (the reporter prints the event); a failure file goes under tmp_path.
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAGSTER_PIPES")} | {
        "ZERO_OPT_ML": str(tmp_path / "opt_ml")
    }
    return subprocess.run(
        [sys.executable, "-m", "training_code.index", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_index_job_writes_one_sources_index_and_reports_it(tiny_raw_root, tmp_path):
    out = tmp_path / "out"
    result = run_index_job(tmp_path, "--raw", str(tiny_raw_root), "--source", "line_b_camera", "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    index = pd.read_parquet(out / "index.parquet")
    whole = build_raw_index(str(tiny_raw_root)).frame
    assert index.equals(whole[whole["source"] == "line_b_camera"].reset_index(drop=True))
    manifest_bytes = (out / "manifest.json").read_bytes()
    manifest = json.loads(manifest_bytes)
    assert (
        manifest["files"]["index.parquet"]["sha256"] == hashlib.sha256((out / "index.parquet").read_bytes()).hexdigest()
    )
    assert manifest["annotations_without_image"] == 1  # the demo's planted annotation of a missing image
    [event] = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert event["data_version"] == hashlib.sha256(manifest_bytes).hexdigest()
    assert (
        event["metadata"]["dagster/row_count"] == len(index) and event["metadata"]["groups"] == index["group"].nunique()
    )
    assert event["metadata"]["listing_fingerprint"] == manifest["listing_fingerprint"]


def test_index_job_fails_naming_the_source_and_leaves_no_manifest(tiny_raw_root, tmp_path):
    out = tmp_path / "out"
    result = run_index_job(tmp_path, "--raw", str(tiny_raw_root), "--source", "no_such_source", "--out", str(out))
    assert result.returncode != 0
    message = (tmp_path / "opt_ml" / "output" / "message").read_text()  # SageMaker's ExitMessage
    assert "no_such_source" in message and "is not a folder of the raw root" in message
    assert not (out / "manifest.json").exists()
    result = run_index_job(tmp_path, "--raw", str(tiny_raw_root), "--source", "../outside", "--out", str(out))
    assert result.returncode != 0 and "a source is the name of one top-level folder" in result.stderr


def test_index_job_does_not_import_dagster_or_zero_assets():
    code = (
        "import sys, training_code.index; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('dagster', 'zero_assets')))"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
